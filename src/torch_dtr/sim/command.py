"""`torch-dtr simulate`: replay a log over policies and budget ratios, print a table or JSON, plot."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import fmt_bytes
from ..core.policies import DEFAULT_POLICY, get_policy
from ..deps import need
from . import log as _log
from .baselines import sqrt_checkpoint
from .replay import Outcome, no_eviction_peak, simulate
from .trace import FORMAT, Trace, read_trace, simulate_trace, smallest_trace_budget, trace_peak

DEFAULT_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ILP_MAX_NODES = 130  # --baselines solves the exact optimum for logs whose graph has at most this many nodes
ILP = "optimum (ILP)"


def is_trace(path: str | Path) -> bool:
    """Whether ``path`` is a trace (NOTE [ Traces ]) rather than an operator log."""
    with Path(path).open() as f:
        return FORMAT in f.readline()


def run_grid(log: _log.Log | Trace, policies: Sequence[str], ratios: Sequence[float], *, progress: bool = False,
             **options: Any) -> tuple[int, list[Outcome]]:
    """Every (policy, ratio) replay of ``log`` (or of a trace); returns the no-eviction peak and the outcomes."""
    for p in policies:
        get_policy(p)  # unknown names fail before any work
    traced = isinstance(log, Trace)
    peak = trace_peak(log) if traced else no_eviction_peak(log)
    jobs = [(p, r) for p in policies for r in ratios]
    it: Any = jobs
    if progress:
        tqdm = need("tqdm", "sim", "progress output of torch-dtr simulate").tqdm
        it = tqdm(jobs, desc=Path(log.source).name, unit="replay", file=sys.stderr, leave=False)
    if traced:
        out = [simulate_trace(log, p, ratio=r, peak=peak, **options) for p, r in it]
    else:
        out = [simulate(log, p, ratio=r, peak=peak, **options) for p, r in it]
    return peak, out


def optimum(log: _log.Log, peak: int, ratios: Sequence[float], time_limit: float,
            progress: bool = False) -> tuple[list[Outcome], str]:
    """The exact optimum (Checkmate's ILP, ``sim/checkmate.py``) at each ratio x ``peak``, as outcomes whose
    policy is ``ILP``; none, and a line saying why, where the log's graph is larger than ``ILP_MAX_NODES``.
    ``status`` "ok" with ``error`` "optimal" or "feasible, gap g" (the time limit hit: an upper bound), "oom"
    (no schedule exists), "timeout" (none found in the time limit)."""
    from . import checkmate

    g = checkmate.graph_from_log(log)
    if g.n > ILP_MAX_NODES:
        return [], (f"the exact optimum is left out: the log's graph has {g.n} nodes, over the {ILP_MAX_NODES} "
                    f"the ILP solves in seconds (benchmarks/simulation.py bounds larger ones)")
    it: Any = ratios
    if progress:
        tqdm = need("tqdm", "sim", "progress output of torch-dtr simulate").tqdm
        it = tqdm(ratios, desc="optimum (ILP)", unit="solve", file=sys.stderr, leave=False)
    out = []
    for r in it:
        b = int(r * peak)
        sol = checkmate.solve(g, b, time_limit=time_limit)
        found = sol.R is not None
        status = "ok" if found else "oom" if sol.status == "infeasible" else "timeout"
        note = sol.status if sol.status != "feasible" else f"time limit, gap {sol.gap:.3f}"
        out.append(Outcome(ILP, r, b, status, sol.overhead if found else math.nan, 0, 0,
                           int(sol.R.sum()) - g.n if found else 0, 0, sol.peak or 0, g.n, sol.seconds, sol.seconds,
                           error=note))
    return out, (f"optimum (ILP): Checkmate's ILP on the log's {g.n}-node graph, {time_limit:g} s per solve; exact "
                 f"over schedules that recompute in the log's order (sim/checkmate.py), so a policy can beat it")


def table(log: _log.Log | Trace, peak: int, outcomes: Sequence[Outcome], extra: Sequence[Outcome] = ()) -> str:
    what = (f"trace {log.source}: {log.ops()} managed ops, {log.op_cost() * 1e3:.1f} ms of modelled op time"
            if isinstance(log, Trace) else
            f"log {log.source}: {log.op_count()} ops, {log.op_time_ns() / 1e6:.1f} ms of op time")
    rows = [
        f"{what}, no-eviction peak {fmt_bytes(peak)}",
        "",
        "| policy | ratio | budget | status | overhead | evictions | recomputations | copies out/in | accesses "
        "| replay s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        if o.policy == ILP:  # no evictions or policy accesses: a schedule (its solve's seconds last)
            rows.append(f"| {o.policy} | {o.ratio:.2f} | {fmt_bytes(o.budget or 0)} | {o.status} ({o.error}) | "
                        f"{_ov(o)} | - | {o.rematerializations} | - | - | {o.wall_seconds:.2f} |")
            continue
        rows.append(f"| {o.policy} | {o.ratio:.2f} | {fmt_bytes(o.budget or 0)} | {o.status} | "
                    f"{_ov(o)} | {o.evictions} | {o.rematerializations} | {o.swaps_out}/{o.swaps_in} | "
                    f"{o.accesses} | {o.wall_seconds:.2f} |")
    for o in extra:
        rows.append(f"| {o.policy} | peak {o.ratio:.2f} | - | {o.status} | {_ov(o)} | {o.evictions} | "
                    f"{o.rematerializations} | - | - | {o.wall_seconds:.2f} |")
    return "\n".join(rows)


def _ov(o: Outcome) -> str:
    if o.status == "ok":
        return f"{o.overhead:.3f}"
    return "-" if math.isnan(o.overhead) else f"({o.overhead:.2f})"


_TOP = 2.0  # where the plot marks a run that failed (oom, thrash, no schedule)


def plot(path: str | Path, series: dict[str, tuple[int, list[Outcome], list[Outcome]]],
         reference: dict[str, dict[float, float]] | None = None, title: str | None = None) -> None:
    """Write ``figure(...)`` to ``path`` (a PNG)."""
    fig = figure(series, reference, title)  # (says which extra to install where matplotlib is missing)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(series: dict[str, tuple[int, list[Outcome], list[Outcome]]],
           reference: dict[str, dict[float, float]] | None = None, title: str | None = None) -> Any:
    """One panel per log: overhead vs budget ratio, a line per policy through the runs that trained, a mark at
    the top for each that failed, baselines as markers, optional reference points (``{log: {ratio: overhead}}``)
    and a title over the panels; a matplotlib figure."""
    matplotlib = need("matplotlib", "sim", "torch-dtr simulate --plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    for ax, (name, (_peak, outs, extra)) in zip(axes[0], series.items(), strict=True):
        by: dict[str, list[Outcome]] = {}
        for o in outs:
            by.setdefault(o.policy, []).append(o)
        failed = False
        for k, (pol, os_) in enumerate(by.items()):
            ok = [o for o in os_ if o.status == "ok"]
            style = {"color": "k", "ls": "--", "marker": "x"} if pol == ILP else {"marker": "o"}
            line, = ax.plot([o.ratio for o in ok], [o.overhead for o in ok], ms=3, label=pol, **style)
            bad = [o.ratio for o in os_ if o.status != "ok"]  # a run that failed is marked at the top, not dropped
            if bad:
                failed = True
                ax.scatter(bad, [_TOP - 0.04 * k] * len(bad), marker="v", s=28, color=line.get_color(), zorder=4)
        if failed:
            ax.scatter([], [], marker="v", s=28, color="grey", label="failed there (oom, thrash, no schedule)")
        for o in extra:
            y = o.overhead if o.status == "ok" else _TOP
            ax.scatter([o.ratio], [y], marker="s", s=40, zorder=5, label=o.policy.split(" (")[0])
        if reference and name in reference:
            ref = sorted(reference[name].items())
            ax.plot([r for r, _ in ref], [v for _, v in ref], "k--", lw=1, marker="x", label="reference h_DTR (uf)")
        ax.set_title(name)
        ax.set_xlabel("budget / no-eviction peak")
        ax.set_ylabel("overhead (op time incl. recomputation / op time)")
        ax.set_ylim(0.98, _TOP + 0.04)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center right")
    fig.suptitle(title or "torch-dtr simulate: overhead of each budget (lower is better; v: the run failed there)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def smallest(path: str, policies: Sequence[str] | None, max_overhead: float | None, fmt: str) -> int:
    """``torch-dtr simulate TRACE --smallest``: the smallest budget at which the traced iteration trains, per policy."""
    if not is_trace(path):
        print("torch-dtr simulate: --smallest needs a trace (torch-dtr record), not an operator log", file=sys.stderr)
        return 2
    trace = read_trace(path)
    peak = trace_peak(trace)
    rows = []
    for p in policies or [trace.options.get("policy", DEFAULT_POLICY)]:
        get_policy(p)
        budget, o = smallest_trace_budget(trace, p, max_overhead=max_overhead)
        rows.append({"policy": o.policy, "budget": budget, "ratio": budget / peak, "peak": peak,
                     "overhead": o.overhead, "evictions": o.evictions, "rematerializations": o.rematerializations})
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return 0
    limit = "any overhead" if max_overhead is None else f"overhead at most {max_overhead:g}"
    print(f"trace {path}: no-eviction peak {fmt_bytes(peak)}; the smallest budget that trains ({limit}), to a "
          f"thousandth of the peak:")
    for r in rows:
        print(f"  {r['policy']}: {r['budget']} B ({fmt_bytes(r['budget'])}, {r['ratio']:.1%} of the peak), overhead "
              f"{r['overhead']:.3f}, {r['evictions']} evictions, {r['rematerializations']} recomputations: "
              f"torch_dtr.enable(budget={r['budget']})")
    return 0


def main(path: str, policies: Sequence[str] | None, ratios: Sequence[float] | None, fmt: str,
         plot_path: str | None, baselines: bool, swap_gbps: float | None = None, host_budget: int | None = None,
         ilp_seconds: float = 10.0, iterations: int = 1, plans: bool = True) -> int:
    traced = is_trace(path)
    if traced and iterations != 1:
        print("torch-dtr simulate: --iterations replays an operator log as a loop; a trace replays the optimizer steps "
              "it holds (trace several with torch_dtr.enable(trace=...)): drop --iterations", file=sys.stderr)
        return 2
    if traced and (swap_gbps is not None or baselines):
        print("torch-dtr simulate: a trace replays without a host tier and without baselines for now (NOTE [ Traces ] "
              "4); drop --swap-gbps and --baselines, or record an operator log (torch-dtr record --kind log)",
              file=sys.stderr)
        return 2
    log: _log.Log | Trace = read_trace(path) if traced else _log.read(path)
    policies = list(policies or [DEFAULT_POLICY])
    ratios = list(ratios or DEFAULT_RATIOS)
    swap: dict[str, Any] = {} if swap_gbps is None else {"swap_gbps": swap_gbps, "host_budget": host_budget}
    swap["plans"] = plans
    if iterations != 1:
        swap["iterations"] = iterations
    progress = fmt == "table" and sys.stderr.isatty()
    peak, outs = run_grid(log, policies, ratios, progress=progress, **swap)
    extra: list[Outcome] = []
    best: list[Outcome] = []
    said = ""
    if baselines and isinstance(log, _log.Log):
        extra = [sqrt_checkpoint(log, peak)]
        best, said = optimum(log, peak, ratios, ilp_seconds, progress)
    if fmt == "json":
        print(json.dumps([_json(o.as_dict()) for o in outs]
                         + [dict(_json(o.as_dict()), baseline=True) for o in best + extra], indent=1))
    else:
        print(table(log, peak, outs + best, extra))
        if said:
            print(f"\n{said}")
    if plot_path:
        plot(plot_path, {Path(path).stem: (peak, outs + best, extra)},
             title=f"torch-dtr simulate {Path(path).name}: overhead of each budget (v: the run failed there)")
    return 0


def partition(path: str, devices: int, gbps: float, ratios: Sequence[float] | None, fmt: str) -> int:
    """``torch-dtr simulate LOG --devices N``: partition plans compared on an operator log (NOTE [ Partition
    replay ] 4), at each ratio of data parallel's per-device peak."""
    from dataclasses import asdict

    from ..core.partition import Link, Planner
    from . import partition as sp

    if is_trace(path):
        print("torch-dtr simulate: --devices needs an operator log with shapes, not a trace; record one with "
              "torch-dtr record --kind log", file=sys.stderr)
        return 2
    try:
        log = _log.read(path)
        g = sp.graph(log)
    except sp.PartitionError as e:
        print(str(e).removeprefix("torch_dtr: "), file=sys.stderr)
        return 2
    link = Link(devices, gbps * 1e9)
    dp = sp.replay(log, Planner(g, link), Planner(g, link).fixed("dp"), None)[0]
    out = []
    for r in ratios or (0.5,):
        budget = int(r * dp.replay_peak)
        out.append((r, budget, sp.compare(log, link, budget, graph_=g)))
    if fmt == "json":
        print(json.dumps([{"ratio": r, "budget": b, "devices": devices, "link_gbps": gbps,
                           "plans": {k: _json(asdict(v)) for k, v in rows.items()}} for r, b, rows in out], indent=1))
        return 0
    print(f"{Path(path).name}: {len(g.nodes)} ops on {devices} devices, {gbps:g} GB/s links; budgets per device as "
          f"a share of data parallel's per-device peak ({fmt_bytes(dp.replay_peak)})")
    print(f"{'ratio':>6} {'budget':>11} {'plan':>5} {'status':>7} {'step/device':>12} {'peak, no eviction':>18} "
          f"{'remat':>6} {'collectives':>11}")
    for r, b, rows in out:
        for k, v in rows.items():
            step = "-" if v.step is None else f"{v.step * 1e3:.2f} ms"
            print(f"{r:>6.2f} {fmt_bytes(b):>11} {k:>5} {v.status:>7} {step:>12} {fmt_bytes(v.peak):>18} "
                  f"{v.rematerializations:>6} {v.collectives:>11}")
    return 0


def _json(d: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}
