"""Plans from traced iterations against the dynamic policy and the ILP's optimum (issue 51): writes docs/plans.md
and docs/img/plans.png.

    python benchmarks/plans.py [--out docs] [--iterations 6] [--logs DIR]

Records the logs ``benchmarks/policy_grid.py`` records (the tests' models with and without an SGD step, an 8-layer
GELU MLP, the bench's three workloads at their quick size) and the two small ones ``benchmarks/simulation.py``
solves exactly (a 5-layer MLP, a 3-layer CNN), adds the DTR authors' shared logs when they are beside the checkout,
and replays each as a training loop (``simulate(..., iterations=n)``, NOTE [ Replaying a log ] 9) at 0.2-0.9 of its
no-eviction peak, with plans (the default) and without (``plans=False``). About 5 to 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
RATIOS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
THRASH_AT = 10.0  # a replay stops once its recomputations pass 9x the op time of all its iterations
TIE = 1e-4


def _cell(o, last: bool) -> str:
    if o.status != "ok":
        return o.status
    return f"{o.per_iteration[-1]:.3f}" if last else f"{sum(o.per_iteration[1:]) / (len(o.per_iteration) - 1):.3f}"


def _value(o, last: bool) -> float:
    return float(_cell(o, last)) if o.status == "ok" else float("inf")


def _compare(a: float, b: float) -> str:
    return "same" if abs(a - b) <= TIE or a == b else ("better" if a < b else "worse")


def grid(paths: list[Path], n: int, lines: list[str]) -> list[tuple[float, float]]:
    from torch_dtr.sim import log, replay

    counts = {k: {"better": 0, "worse": 0, "same": 0} for k in ("last", "mean")}
    points = []
    rows = []
    for path in tqdm(paths, desc="replaying", file=sys.stderr):
        lg = log.read(path)
        peak = replay.no_eviction_peak(lg)
        cells = []
        for r in RATIOS:
            kw = dict(ratio=r, peak=peak, iterations=n, thrash_at=THRASH_AT)
            dyn = replay.simulate(lg, plans=False, **kw)
            pl = replay.simulate(lg, **kw)
            for k, last in (("last", True), ("mean", False)):
                counts[k][_compare(_value(pl, last), _value(dyn, last))] += 1
            if dyn.status == pl.status == "ok":
                points.append((dyn.per_iteration[-1], pl.per_iteration[-1]))
            if dyn.status == "ok" or pl.status == "ok":
                mark = {"better": "**", "worse": "_", "same": ""}[_compare(_value(pl, True), _value(dyn, True))]
                cells.append(f"{r}: {_cell(dyn, True)} / {mark}{_cell(pl, True)}{mark} ({pl.planned})")
        rows.append(f"| {path.stem} | {'; '.join(cells) or 'oom at every ratio'} |")
    last, mean = counts["last"], counts["mean"]
    lines += [
        f"## Steady state: iteration {n} of {n}, with and without plans", "",
        f"Each cell: ratio of the peak: overhead of the last iteration without plans / with plans (iterations that "
        f"followed their plan). **Bold**: plans recompute less; _italic_: more. Cells where both failed are left "
        f"out; `thrash`: the recomputations of all {n} iterations passed {THRASH_AT - 1:g}x their op time.", "",
        f"- Last iteration: with plans better in {last['better']} cells, worse in {last['worse']}, the same in "
        f"{last['same']} (of {sum(last.values())}).",
        f"- Mean of iterations 2-{n} (the first runs without a plan and measures the dynamic policy; the second "
        f"follows the plan, then the cheaper rule: NOTE [ Iteration plans ] 5): better in {mean['better']}, worse in "
        f"{mean['worse']}, the same in {mean['same']}.", "",
        "| log | ratio: without / with plans (planned iterations) |", "| --- | --- |", *rows, "",
        "![plans](img/plans.png)", ""]
    return points


def against_ilp(tmp: Path, n: int, lines: list[str]) -> None:
    from simulation import _record_small

    from torch_dtr.sim import checkmate, log, replay

    lines += ["## Against the optimum (Checkmate ILP, HiGHS, 60 s)", "",
              f"The two recorded logs small enough to solve exactly, one iteration each, replayed {n} times; ours: "
              f"the last iteration's overhead. The ILP schedules one iteration and frees a value right after its "
              f"last use (the replay when the log releases it). Both overheads are over the log's whole op time "
              f"(the ILP's graph leaves out the time of ops that only make views, so its own overhead reads higher). "
              f"Issue 51's target: planned iterations within 1.05x of the optimum.", "",
              "| log | ratio | without plans | with plans | optimum | with plans / optimum | target |",
              "| --- " * 7 + "|"]
    for name, path in _record_small(tmp):
        lg = log.read(path)
        peak = replay.no_eviction_peak(lg)
        g = checkmate.graph_from_log(lg)
        for r in (0.5, 0.6, 0.7, 0.8, 0.9):
            kw = dict(ratio=r, peak=peak, iterations=n, thrash_at=THRASH_AT)
            dyn, pl = replay.simulate(lg, plans=False, **kw), replay.simulate(lg, **kw)
            s = checkmate.solve(g, int(r * peak), time_limit=60.0)
            if s.status in ("optimal", "feasible") and pl.status == "ok":
                # the optimum's recomputations over the replay's op time (the graph leaves out views' time)
                opt_r = 1 + (s.compute - s.base) / lg.op_time_ns()
                rel = pl.per_iteration[-1] / opt_r
                verdict = "met" if rel <= 1.05 else "missed"
                opt, rel_s = f"{opt_r:.3f} ({s.status})", f"{rel:.3f}"
            else:
                opt, rel_s = s.status if s.status not in ("optimal", "feasible") else f"{s.overhead:.3f}", ""
                verdict = "no schedule" if s.status not in ("optimal", "feasible") else "missed"
            lines.append(f"| {name} | {r} | {_cell(dyn, True)} | {_cell(pl, True)} | {opt} | {rel_s} | {verdict} |")
    lines.append("")


def traced(tmp: Path, n: int, lines: list[str], quick: bool) -> list[tuple[float, float]]:
    """The bench's three workloads (``torch-dtr bench``'s sizes) traced live for ``n`` optimizer steps by the compiled
    front end (NOTE [ Traces ]; the trace's ``["S"]`` rows are the steps), replayed at each ratio with and without
    plans: the replay makes the live session's decisions (tests/sim/test_trace.py)."""
    import torch_dtr
    from torch_dtr.bench import workloads
    from torch_dtr.sim.trace import read_trace, simulate_trace, trace_peak

    points = []
    lines += [f"## The bench's workloads, traced live ({n} optimizer steps)", "",
              "Logs of these three run out of memory at every ratio in the log format (their optimizer state counts "
              "as constants there: docs/policy_grid.md), so each is traced live instead, without a budget, "
              f"{'quick' if quick else 'full'} size as `torch-dtr bench` runs it, and the trace replayed: the "
              "replay's decisions are the live session's at that budget. Cells: the last step's overhead without / "
              "with plans (steps that followed their plan; the LSTM loop draws another sequence length every step, "
              "so no step repeats the one before).", "",
              "| workload | ratio: without / with plans (planned steps) |", "| --- | --- |"]
    for name in tqdm(("gpt2", "resnet50", "lstm"), desc="tracing the bench's workloads", file=sys.stderr):
        size = workloads.SIZES[name]["quick" if quick else "full"]
        model, batches, step = workloads.build(name, size, steps=n)
        path = tmp / f"{name}.trace"
        with torch_dtr.enable(budget=None, trace=path):
            for b in batches:
                step(model, b)
        trace = read_trace(path)
        peak = trace_peak(trace)
        cells = []
        for r in (0.3, 0.4, 0.5, 0.7):
            kw = dict(ratio=r, peak=peak, thrash_at=THRASH_AT)
            dyn, pl = simulate_trace(trace, plans=False, **kw), simulate_trace(trace, **kw)
            if dyn.status == pl.status == "ok":
                points.append((dyn.per_iteration[-1], pl.per_iteration[-1]))
            mark = {"better": "**", "worse": "_", "same": ""}[_compare(_value(pl, True), _value(dyn, True))]
            cells.append(f"{r}: {_cell(dyn, True)} / {mark}{_cell(pl, True)}{mark} ({pl.planned})")
        lines.append(f"| {name} | {'; '.join(cells)} |")
    lines.append("")
    return points


def plot(points: list[tuple[float, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    xs, ys = zip(*points, strict=True) if points else ((), ())
    ax.scatter(xs, ys, s=12)
    top = max([*xs, *ys, 1.5])
    ax.plot([1, top], [1, top], color="grey", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("last iteration's overhead without plans")
    ax.set_ylabel("with plans")
    ax.set_title("Below the line: the plan recomputes less")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs"))
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--logs", help="keep the recorded logs in this folder (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="the bench's workloads at their quick size")
    a = ap.parse_args()
    if a.iterations < 4:
        ap.error(f"--iterations must be >= 4 (one recorded, the plan, one without it, then the cheaper), "
                 f"got {a.iterations}")
    import torch
    from policy_grid import SHARED, _record_all

    t0 = time.perf_counter()
    out = Path(a.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    lines = ["# Plans from traced iterations (issue 51)", "",
             f"{datetime.date.today()}, {platform.machine()} CPU, Python {platform.python_version()}, torch "
             f"{torch.__version__}; `python benchmarks/plans.py` (simulated: modelled op costs, no wall clock).", "",
             "A training loop repeats its iteration, so the last one says when each value of the next is read "
             "(NOTE [ Iteration plans ] in src/torch_dtr/core/plan.py). Each log below is one recorded iteration, "
             f"replayed {a.iterations} times as a loop; overhead = (op time + recomputed op time) / op time of one "
             "iteration.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.logs) if a.logs else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = _record_all(folder)
        if SHARED.is_dir():
            paths += sorted(SHARED.glob("*.log"))
        points = grid(paths, a.iterations, lines)
        points += traced(folder, a.iterations, lines, a.quick)
        against_ilp(folder, a.iterations, lines)
    plot(points, out / "img" / "plans.png")
    lines.append(f"Total time of this script: {time.perf_counter() - t0:.0f} s.")
    (out / "plans.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'plans.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
