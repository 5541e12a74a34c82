"""``torch-dtr run``: any script under a budget, unchanged (issue 53); what torch-dtr did is printed at exit.

    torch-dtr run --budget 8GiB train.py --epochs 3

The script runs as ``__main__`` in this process, with ``torch_dtr.enable(...)`` on in the main thread (worker
threads join with ``torch_dtr.attach()``, as in any program). On top of the front ends, like the CLI.
"""

from __future__ import annotations

import os
import runpy
import shlex
import sys
import time
from typing import Any


def run_main(script: str, argv: list[str], stop: type[BaseException] | None = None) -> Any:
    """Run ``script`` as ``__main__``, as ``python script *argv`` would (``sys.argv``, its folder first on
    ``sys.path``; both restored after); returns its exit code (None: it ended, or raised ``stop``)."""
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code
    except BaseException as e:
        if stop is not None and isinstance(e, stop):
            return None
        raise
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return None


def run_script(script: str, argv: list[str], budget: str | None = None, *, swap: bool = False,
               policy: str | None = None, device: str | None = None) -> int:
    """Run ``script`` with ``sys.argv = [script, *argv]`` under ``torch_dtr.enable(budget, swap=..., policy=...,
    device=...)``;
    returns the exit code the script would have had (1 after a ``BudgetError``, whose message is printed). Prints
    a summary of the session to stderr at exit."""
    from . import api
    from .core import fmt_bytes
    from .core.errors import BudgetError, parse_budget
    from .core.policies import DEFAULT_POLICY

    if not os.path.isfile(script):
        print(f"torch-dtr run: no script {script!r}", file=sys.stderr)
        return 2
    try:
        nbytes = parse_budget(budget)
    except ValueError as e:
        print(f"torch-dtr run: --budget: {e}", file=sys.stderr)
        return 2
    code: Any = 0
    regions = sys.modules.get("torch_dtr.inductor.region")  # (imported only once dynamo compiles: ~2 s)
    regions_before = regions.made() if regions is not None else 0
    t0 = time.perf_counter()
    try:
        session = api.enable(nbytes, swap=swap, policy=policy or DEFAULT_POLICY, device=device)
    except (ValueError, RuntimeError) as e:  # an option this machine or front end cannot honour
        print(f"torch-dtr run: {e}", file=sys.stderr)
        return 2
    rt = api.runtime()
    on = " --device cpu" if device else ""
    rt.fix = f"torch-dtr run --budget {{n}}{on} {shlex.quote(script)}"  # what a BudgetError says to run next
    try:
        code = run_main(script, argv)
    except BudgetError as e:
        print(f"torch-dtr run: {e}", file=sys.stderr)
        code = 1
    finally:
        took = time.perf_counter() - t0
        mine = api._CURRENT is session  # (the script may have enabled a session of its own)
        report = mine or not api.enabled()
        api.disable()
        st = api.stats() if report else None  # (after disable(): what it learned includes the whole run)
        if st is not None:
            kept = "no budget" if nbytes is None else f"budget {fmt_bytes(nbytes)}"
            peak = "peak (all CPU tensor memory)" if device else "tracked peak"
            learned = ""
            if st.learned_budget is not None and mine:
                what = f"its first {st.traced_steps} optimizer steps" if st.traced_steps else "what it ran"
                learned = (f"; learned budget {fmt_bytes(st.learned_budget)}, at which {what} replay: torch-dtr "
                           f"run --budget {st.learned_budget} {shlex.quote(script)}")
            print(f"torch-dtr run: {script}: {took:.1f} s, {api.front() or 'no'} front end; {peak} "
                  f"{fmt_bytes(st.peak_bytes)} ({kept}); {st.evictions} evictions, {st.rematerializations} "
                  f"recomputations ({st.remat_seconds:.2f} s); single-op floor {fmt_bytes(st.floor_bytes)}{learned}",
                  file=sys.stderr)
            for line in _region_lines(regions_before):
                print(f"torch-dtr run: {line}", file=sys.stderr)
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as Python prints it
    return 1


def _region_lines(before: int) -> list[str]:
    """One line per torch.compile region planned under the budget in this run (NOTE [ Compiled regions under a
    budget ]): the activation memory budget chosen for compile's partitioner and the bytes expected against what
    the budget left it, or that it ran eagerly."""
    from .core import fmt_bytes

    region = sys.modules.get("torch_dtr.inductor.region")
    if region is None or region.made() <= before:
        return []
    lines = []
    for p in region.plans()[-(region.made() - before):]:
        name, n = p["region"], p["compiles"]
        how = f"compiled {n} time{'s' if n != 1 else ''}"
        if p["fraction"] is None:
            lines.append(f"compiled region {name}: {how}, without a budget")
        elif p["fits"]:
            lines.append(f"compiled region {name}: {how}; activation memory budget {p['fraction']:g} "
                         f"(expected {fmt_bytes(p['predicted'])} of the {fmt_bytes(max(0, p['allowance']))} the "
                         f"budget left it)")
        else:
            lines.append(f"compiled region {name}: runs eagerly under torch-dtr: no partition fits the "
                         f"{fmt_bytes(max(0, p['allowance']))} the budget left it (least expected "
                         f"{fmt_bytes(p['predicted'])})")
    return lines
