"""Write docs/simulation.md and its plots: policies on the shared DTR logs against the authors' reference
results and the baselines (sqrt(n) checkpointing, the Checkmate ILP optimum), and the DTR theorem on
linear chains.

    python benchmarks/simulation.py [--logs DIR] [--out docs] [--quick]

Takes about 10 to 20 minutes on 2 cores (the ILP solves dominate); ``--quick`` skips the slow solves.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import time
from pathlib import Path

from tqdm import tqdm

from torch_dtr.core import fmt_bytes
from torch_dtr.core.policies import DEFAULT_POLICY, POLICIES
from torch_dtr.sim import chains, checkmate, log, replay
from torch_dtr.sim.baselines import sqrt_checkpoint
from torch_dtr.sim.command import plot

RATIOS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
REF_RATIOS = (0.2, 0.3, 0.4, 0.5, 0.7, 0.9)
# the DTR authors' simulator, union-find h_DTR (shared/dtr-logs/README.md); None = thrash or OOM
REFERENCE = {
    "resnet32-bs56": (1.33, 1.18, 1.14, 1.11, 1.05, 1.01),
    "transformer-bs10": (1.54, 1.12, 1.09, 1.06, 1.03, 1.01),
    "lstm-seq128": (1.55, 1.37, 1.16, 1.07, 1.03, 1.02),
}
REFERENCE_EXACT = {
    "resnet32-bs56": (1.37, 1.18, 1.14, 1.11, 1.05, 1.01),
    "transformer-bs10": (1.35, 1.12, 1.08, 1.06, 1.03, 1.01),
    "lstm-seq128": (1.60, 1.30, 1.14, 1.07, 1.03, 1.02),
}
CHAIN_NS = (1000, 2000, 4000, 8000, 16000)
KEEP = "<!-- kept by simulation.py: written by hand from here -->"


def _cell(o: replay.Outcome) -> str:
    return f"{o.overhead:.3f}" if o.status == "ok" else o.status


def shared_logs(logdir: Path, policies: list[str], lines: list[str], img: Path) -> dict:
    series, verdict = {}, {}
    lines += ["## The shared logs (DTR authors, Titan V, 2020)", "",
              "Overhead = (op time + recomputed op time) / op time at budget = ratio x the no-eviction peak "
              "(constants included); `thrash`: overhead would pass 2.0; `oom`: nothing left to evict. "
              "Reference rows are the authors' own simulator (README of `shared/dtr-logs`).", ""]
    for name in REFERENCE:
        lg = log.read(logdir / f"{name}.log")
        peak = replay.no_eviction_peak(lg)
        outs = []
        for p in tqdm(policies, desc=name, file=sys.stderr, leave=False):
            outs += [replay.simulate(lg, p, ratio=r, peak=peak) for r in RATIOS]
        sq = sqrt_checkpoint(lg, peak)
        series[name] = (peak, outs, [sq])
        lines += [f"### {name}: {lg.op_count()} ops, {lg.op_time_ns() / 1e6:.1f} ms, "
                  f"no-eviction peak {fmt_bytes(peak)}",
                  "", "| policy | " + " | ".join(f"{r:g}" for r in RATIOS) + " | replay s (max) |",
                  "| --- " * (len(RATIOS) + 2) + "|"]
        for p in policies:
            row = [o for o in outs if o.policy == p]
            wall = max(o.wall_seconds for o in row)
            lines.append(f"| {p} | " + " | ".join(_cell(o) for o in row) + f" | {wall:.2f} |")
        for label, ref in (("reference h_DTR (union-find)", REFERENCE), ("reference h_DTR (exact)", REFERENCE_EXACT)):
            vals = dict(zip(REF_RATIOS, ref[name], strict=True))
            lines.append(f"| *{label}* | " + " | ".join(f"{vals[r]:.2f}" if r in vals else "" for r in RATIOS) + " | |")
        lines += ["", f"sqrt(n) checkpointing ({sq.policy}): peak {sq.ratio:.2f} of the no-eviction peak, "
                  f"overhead {sq.overhead:.3f}.", ""]
        mine = {o.ratio: o for o in outs if o.policy == DEFAULT_POLICY}
        verdict[name] = [(r, mine[r], dict(zip(REF_RATIOS, REFERENCE[name], strict=True))[r]) for r in REF_RATIOS]
    plot(img / "sim_logs.png", series, {n: dict(zip(REF_RATIOS, v, strict=True)) for n, v in REFERENCE.items()})
    lines += ["![overhead vs budget](img/sim_logs.png)", ""]
    # targets
    lines += [f"### Targets for the default policy (`{DEFAULT_POLICY}`)", "",
              "| log | ratio | ours | reference (uf) | ours <= reference | strictly better |", "| --- " * 6 + "|"]
    for name, rows in verdict.items():
        for r, o, ref in rows:
            ours = round(o.overhead, 2) if o.status == "ok" else math.inf
            lines.append(f"| {name} | {r} | {_cell(o)} | {ref:.2f} | {'yes' if ours <= ref else '**no**'} | "
                         f"{'yes' if ours < ref else 'no'} |")
    lines += ["", "(ours is rounded to two decimals, as the reference is, before comparing)", ""]
    return series


def chain_theorem(lines: list[str], img: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for n in tqdm(CHAIN_NS, desc="chains", file=sys.stderr, leave=False):
        b = int(2 * math.sqrt(n))
        t0 = time.perf_counter()
        o = replay.simulate(chains.linear_chain(n), budget=b, thrash_at=None)
        rows.append((n, b, o, time.perf_counter() - t0))
    lines += ["## The DTR theorem on a linear chain", "",
              "Unit-cost, unit-size chain of n forward ops and n backward ops, budget 2 sqrt(n) tensors, default "
              "policy. The theorem: O(n) recomputations in all, i.e. recomputations / n bounded by a constant.", "",
              "| n | budget (tensors) | status | recomputations | recomputations / n | replay s |", "| --- " * 6 + "|"]
    for n, b, o, s in rows:
        lines.append(f"| {n} | {b} | {o.status} | {o.rematerializations} | {o.rematerializations / n:.3f} | {s:.2f} |")
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot([r[0] for r in rows], [r[2].rematerializations / r[0] for r in rows], marker="o")
    ax.set_xscale("log")
    ax.set_ylim(0, max(2.0, max(r[2].rematerializations / r[0] for r in rows) * 1.2))
    ax.set_xlabel("chain length n")
    ax.set_ylabel("recomputations / n")
    ax.set_title("linear chain, budget 2 sqrt(n)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "sim_chain.png", dpi=110)
    plt.close(fig)
    lines += ["", "![chain](img/sim_chain.png)", ""]


def _record_small(out: Path) -> list[tuple[str, Path]]:
    """Forward+backward logs of two small models, recorded live with torch_dtr.record."""
    import torch
    import torch.nn as nn

    from torch_dtr.recorder import record

    torch.manual_seed(0)
    made = []
    # sized so that activations, not weights, fill memory (as in training at scale)
    mlp = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(64, 64), nn.Tanh())], nn.Linear(64, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(8, 10))
    for name, model, x in (("mlp5", mlp, torch.randn(2048, 64)), ("cnn3", cnn, torch.randn(32, 3, 32, 32))):
        path = out / f"{name}.log"
        y = torch.randint(0, 10, (x.shape[0],))
        with record(path, costs="model"):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
        made.append((name, path))
    return made


def _smallest_replay(lg: log.Log, policy: str, peak: int, thrash_at: float | None) -> int:
    """The smallest budget (bytes) at which the replay runs (``ok``), by bisection between 1 and ``peak``."""
    lo, hi = 0, peak
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if replay.simulate(lg, policy, budget=mid, thrash_at=thrash_at).status == "ok":
            hi = mid
        else:
            lo = mid
    return hi


SMALLEST_MAX_NODES = 40


def smallest(lines: list[str], cases: list, limit: float) -> None:
    """Issue 13's target: the smallest budget the policy runs at <= 1.1x the ILP's smallest feasible one."""
    cap = replay.THRASH_AT
    lines += ["", "### Smallest budgets against the ILP's", "",
              f"Bytes, constants included, each found by bisection to the byte: the single-op floor "
              f"(`checkmate.min_budget`, a lower bound for any schedule); the ILP's smallest feasible budget "
              f"(`checkmate.smallest_budget`, {limit:.0f} s per probe) and the replay's, first at any compute, "
              f"then counting only runs within {cap:g}x the compute of one pass (the replay's thrash limit; for "
              f"the ILP, `max_overhead={cap:g}`), for the default `{DEFAULT_POLICY}` and `dtr_eq`. Issue 13's "
              f"target: ours <= 1.1x the ILP's within {cap:g}x. The ILP's memory model frees a value right after "
              f"its last use and recomputes in index order, the replay frees when the log releases a value; "
              f"so the replay can go below the ILP at any compute. Graphs of at most {SMALLEST_MAX_NODES} nodes "
              f"(beyond, probes near the smallest budget time out).", "",
              f"| graph | peak | single-op floor | ILP, any compute | ours, any compute | ILP within {cap:g}x | "
              f"ours within {cap:g}x | ours / ILP | dtr_eq within {cap:g}x | dtr_eq / ILP | target |",
              "| --- " * 11 + "|"]
    for label, lg in cases:
        peak = replay.no_eviction_peak(lg)
        g = checkmate.graph_from_log(lg)
        if g.n > SMALLEST_MAX_NODES:
            continue
        floor = checkmate.min_budget(g)
        any_ilp, exact_any = checkmate.smallest_budget(g, time_limit=limit)
        ilp, exact = checkmate.smallest_budget(g, time_limit=limit, max_overhead=cap)
        any_ours = _smallest_replay(lg, DEFAULT_POLICY, peak, None)
        ours = _smallest_replay(lg, DEFAULT_POLICY, peak, cap)
        eq = _smallest_replay(lg, "dtr_eq", peak, cap)
        up = " (a probe timed out: upper bound)"
        lines.append(f"| {label} | {peak} | {floor} | {any_ilp}{'' if exact_any else up} | {any_ours} | "
                     f"{ilp}{'' if exact else up} | {ours} | {ours / ilp:.3f} | {eq} | {eq / ilp:.3f} | "
                     f"{'met' if ours <= 1.1 * ilp else 'missed'} |")
    lines.append("")


def optimum(lines: list[str], logdir: Path, tmp: Path, quick: bool) -> None:
    limit = 20.0 if quick else 60.0
    lines += ["## Against the optimum (Checkmate ILP, HiGHS)", "",
              f"Same absolute budget for both: ratio x the replay's no-eviction peak. Our overhead is the "
              f"replay's; the optimum's is the MILP's (time limit {limit:.0f} s; `feasible` = limit hit, gap "
              f"shown). The ILP frees a value right after its last use, the replay when the log releases it, "
              f"so the ILP's memory model is the more generous one.", "",
              "| graph | nodes | ratio | ours | optimum | gap | ours / optimum (extra compute) | solve s |",
              "| --- " * 8 + "|"]
    cases = []
    for n in (16, 32):
        cases.append((f"unit chain n={n}", chains.linear_chain(n)))
    for name, path in _record_small(tmp):
        cases.append((f"recorded {name}", log.read(path)))
    for label, lg in cases:
        peak = replay.no_eviction_peak(lg)
        g = checkmate.graph_from_log(lg)
        for r in (0.3, 0.5, 0.6, 0.7, 0.9):
            b = int(r * peak)
            o = replay.simulate(lg, ratio=r, peak=peak)
            if g.n > 130:
                lines.append(f"| {label} | {g.n} | {r} | {_cell(o)} | (too large for the exact solve) | | | |")
                continue
            s = checkmate.solve(g, b, time_limit=limit)
            if s.status in ("optimal", "feasible") and o.status == "ok":
                extra_ours, extra_opt = o.overhead - 1, s.overhead - 1
                rel = "1.00" if extra_ours <= 1e-9 and extra_opt <= 1e-9 else (
                    f"{(1 + extra_ours) / (1 + extra_opt):.3f} ({extra_ours / extra_opt:.2f}x)" if extra_opt > 1e-9
                    else f"{(1 + extra_ours) / (1 + extra_opt):.3f} (opt. 0)")
                lines.append(f"| {label} | {g.n} | {r} | {_cell(o)} | {s.overhead:.3f} ({s.status}) | "
                             f"{s.gap:.3f} | {rel} | {s.seconds:.1f} |")
            elif s.status in ("optimal", "feasible"):  # the policy failed where a schedule exists
                lines.append(f"| {label} | {g.n} | {r} | {_cell(o)} | {s.overhead:.3f} ({s.status}) | {s.gap:.3f} | "
                             f"**policy failed** | {s.seconds:.1f} |")
            else:
                lines.append(f"| {label} | {g.n} | {r} | {_cell(o)} | {s.status} | | | {s.seconds:.1f} |")
    # beyond the exact solve: the LP relaxation bounds the optimum from below
    if not quick:
        n = 65
        lg = chains.linear_chain(n)
        peak = replay.no_eviction_peak(lg)
        g = checkmate.graph_from_log(lg)
        b = int(2 * math.sqrt(n))
        o = replay.simulate(lg, budget=b)
        lp = checkmate.solve(g, b, time_limit=limit, relax=True)
        s = checkmate.solve(g, b, time_limit=limit)
        lines.append(f"| unit chain n={n}, budget 2 sqrt(n) = {b} | {g.n} | {b / peak:.2f} | {_cell(o)} | "
                     f"{s.overhead:.3f} ({s.status}); LP bound {lp.overhead:.3f} | {s.gap:.3f} | "
                     f"ours / LP bound {o.overhead / lp.overhead:.3f} | {s.seconds + lp.seconds:.1f} |")
    lines += ["", "`ours / optimum` divides total compute; in brackets, our extra compute over the optimum's. Where "
              "ours is `oom` or `thrash` and the optimum is feasible, the policy failed where a schedule exists.", ""]
    smallest(lines, cases, limit)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", default=str(Path(__file__).resolve().parents[2] / "shared" / "dtr-logs"))
    ap.add_argument("--out", default="docs")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    out, logdir = Path(a.out), Path(a.logs)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    tmp = out / ".sim_tmp"
    tmp.mkdir(exist_ok=True)
    # "dtr" (exact neighbourhood, a graph walk per candidate) takes minutes per low-ratio replay of the
    # transformer log: left out of the grid (the authors' exact results are shown as a reference row)
    policies = [p for p in POLICIES if p != "dtr"]
    lines = ["# Simulation: policies on operator logs", "",
             f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()}. Command: `python benchmarks/simulation.py{' --quick' if a.quick else ''}`. "
             f"Replays run the live runtime's core (`torch_dtr.core`) with a simulated clock and memory "
             f"(`torch_dtr.sim.replay`, NOTE [ Replaying a log ]). Default policy: `{DEFAULT_POLICY}`.", ""]
    t0 = time.perf_counter()
    shared_logs(logdir, policies, lines, img)
    chain_theorem(lines, img)
    optimum(lines, logdir, tmp, a.quick)
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    lines.append(f"Total time of this script: {time.perf_counter() - t0:.0f} s.")
    old = (out / "simulation.md").read_text() if (out / "simulation.md").exists() else ""
    kept = old[old.index(KEEP):] if KEEP in old else ""  # notes written by hand on the figures stay
    (out / "simulation.md").write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    print(f"wrote {out / 'simulation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
