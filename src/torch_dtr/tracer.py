"""``torch-dtr record``: run a script and trace one training iteration, what the core is told while the compiled
front end runs it without a budget (NOTE [ Traces ] in sim/trace.py), for ``torch-dtr simulate`` to replay at
any budget to the decisions a live session would make. On top of the front ends and ``sim/``, like the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_REPLACED = ("torch_dtr: {script} enabled a torch-dtr session of its own, which ended the traced one (the trace is cut "
             "short); trace the script as plain PyTorch (without its torch_dtr.enable() call)")


class _Stop(BaseException):
    """Ends the traced script after its iteration (a BaseException: ``except Exception`` lets it pass)."""


def trace_script(script: str, argv: list[str], out: str | Path, iteration: int = 2) -> dict[str, Any]:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *argv]`` and trace its ``iteration``-th training
    iteration (1-based: the ops after optimizer step ``iteration - 1``, up to and including step ``iteration``;
    iteration 1 starts at the script's first op) in a session of its own, without a budget; the script stops once
    that step is done. Returns what was traced: ``ops``, ``peak_bytes`` (the trace's no-eviction peak, constants
    included), ``steps`` (optimizer steps seen), ``complete``, and a ``note`` when the trace is not the iteration
    asked for. The script itself should run plain PyTorch (a session it enables replaces the traced one)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from . import api, native
    from .runner import run_main
    from .sim.trace import read_trace, trace_peak

    if iteration < 1:
        raise ValueError(f"torch_dtr: iteration must be >= 1, got {iteration}")
    ext = native.load()  # NativeUnavailable says what to install
    native._step_hooks(ext)  # (registered now: a session enabled by the hook below must not add hooks)
    steps = [0]
    tracing: list[Any] = [None]  # the traced session

    def start() -> None:
        api.enable(budget=None, front="native", trace=out)
        tracing[0] = native.current()

    def replaced() -> bool:
        return tracing[0] is not None and native.current() is not tracing[0]

    def step_hook(_opt: Any, _a: Any, _k: Any) -> None:
        steps[0] += 1
        if steps[0] == iteration:
            if replaced():
                raise RuntimeError(_REPLACED.format(script=script))
            api.disable()
            raise _Stop
        if steps[0] == iteration - 1:
            start()

    handle = register_optimizer_step_post_hook(step_hook)
    try:
        if iteration == 1:
            start()
        code = run_main(script, argv, _Stop)
        if code not in (None, 0):
            raise SystemExit(code)
    finally:
        handle.remove()
        api.disable()
    n = steps[0]
    if replaced():
        raise RuntimeError(_REPLACED.format(script=script))
    if tracing[0] is None:
        raise RuntimeError(f"torch_dtr: {script} made {n} optimizer step(s), so iteration {iteration} never began and "
                           f"nothing was traced; --iteration 1 traces the script from its first op")
    trace = read_trace(out)
    summary: dict[str, Any] = {"out": str(out), "iteration": iteration, "steps": n, "complete": n >= iteration,
                               "ops": trace.ops(), "peak_bytes": trace_peak(trace)}
    if n < iteration:
        summary["note"] = (f"the script ended before optimizer step {iteration}: the trace holds the ops after step "
                           f"{iteration - 1}" if iteration > 1 else "the script made no optimizer step: the trace "
                           "holds the whole script")
    return summary
