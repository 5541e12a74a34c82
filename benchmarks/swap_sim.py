"""Swapping against recomputation alone, replayed on operator logs: writes docs/swap.md and docs/img/swap_sim.png.

    python benchmarks/swap_sim.py [--logs DIR] [--out docs/swap.md] [--policy dtr_comp]

Replays every log that ``benchmarks/policy_grid.py`` records (the tests' models, an MLP, the bench's three
workloads; modelled costs at the CPU's rates) and the DTR authors' shared logs at ratios 0.2-0.9 of its
no-eviction peak, with the default policy: recomputation alone, then with a host tier (NOTE [ Swapping ])
whose bandwidth is the log device's memory bandwidth / 50 (the ratio of PCIe 3.0 x16, 13 GB/s, to the Titan V
the shared logs were measured on: 650 GB/s), copies out paid, and copies out overlapped with compute (the
live runtime's CUDA tier). A cell is worse when its overhead is more than 0.05% above recomputation alone's
(``oom``/``thrash`` count as infinitely bad). About 75 s on 2 cores with the compiled core (2026-11-30).
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from policy_grid import SHARED, _cell, _record_all, _value  # noqa: E402
from simulation import _record_small  # noqa: E402

RATIOS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
TOLERANCE = 1.0005
LINK = 50  # memory bandwidth / copy bandwidth
MEMORY_GBPS = {"shared": 650.0, "recorded": 5.0}  # Titan V; torch_dtr.eager.costs.RATES["cpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", help="keep the recorded logs in this folder (default: a temporary one)")
    ap.add_argument("--reuse", action="store_true", help="replay the logs already in --logs instead of recording")
    ap.add_argument("--out", default=str(ROOT / "docs" / "swap.md"))
    ap.add_argument("--policy", default=None)
    ap.add_argument("--no-optimum", action="store_true", help="skip the comparison with the exact ILP")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per ILP solve (default 30)")
    a = ap.parse_args()
    from torch_dtr.core.policies import DEFAULT_POLICY  # noqa: PLC0415
    from torch_dtr.sim import log, replay  # noqa: PLC0415

    policy = a.policy or DEFAULT_POLICY
    variants = (("recompute only", None, False), ("host tier, copies out paid", LINK, False),
                ("host tier, copies out overlapped", LINK, True))
    grid: dict[tuple[str, str, float], object] = {}
    kinds: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.logs) if a.logs else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = sorted(folder.glob("*.log")) if a.reuse else _record_all(folder)
        kinds = {p.stem: "recorded" for p in paths}
        if SHARED.is_dir():
            shared = sorted(SHARED.glob("*.log"))
            paths += shared
            kinds |= {p.stem: "shared" for p in shared}
        for path in tqdm(paths, desc="replaying", file=sys.stderr):
            lg = log.read(path)
            peak = replay.no_eviction_peak(lg)
            gbps = MEMORY_GBPS[kinds[path.stem]] / LINK
            for label, link, free in variants:
                for r in RATIOS:
                    swap = {} if link is None else {"swap_gbps": gbps, "swap_out_free": free}
                    grid[(path.stem, label, r)] = replay.simulate(lg, policy, ratio=r, peak=peak, **swap)
    names = [p.stem for p in paths]
    base = variants[0][0]
    lines = [f"# Swapping or recomputing: {policy} on operator logs", "",
             f"Written by `python benchmarks/swap_sim.py` on {datetime.date.today()}. Overhead = (op time + "
             f"recomputed op time + copy time) / op time, replayed at ratio x the log's no-eviction peak "
             f"(NOTE [ Replaying a log ] 8); `thrash`: over 2.0; `oom`: nothing left to evict. The host tier's "
             f"bandwidth is the log's device memory bandwidth / {LINK} (the shared logs: a Titan V, "
             f"{MEMORY_GBPS['shared'] / LINK:.0f} GB/s, PCIe 3.0 x16; the recorded logs: the CPU's modelled "
             f"{MEMORY_GBPS['recorded']:.0f} GB/s, so {MEMORY_GBPS['recorded'] / LINK:.2f} GB/s), with an unlimited "
             f"host budget. A cell is worse (better) than recomputation alone when its overhead is more than "
             f"0.05% above (below) it.", "",
             "## Summary", "",
             "| variant | worse | better | oom/thrash fixed | worst (log @ ratio: variant vs recompute only) |",
             "| --- | --- | --- | --- | --- |"]
    for label, _, _ in variants[1:]:
        worse, better, fixed, worst = 0, 0, 0, (1.0, "")
        for n in names:
            for r in RATIOS:
                mine, alone = _value(grid[(n, label, r)]), _value(grid[(n, base, r)])
                if mine > alone * TOLERANCE:
                    worse += 1
                    ratio = math.inf if math.isinf(mine) else mine / alone
                    if ratio > worst[0]:
                        worst = (ratio, f"{n} @ {r}: {_cell(grid[(n, label, r)])} vs {_cell(grid[(n, base, r)])}")
                elif alone > mine * TOLERANCE:
                    better += 1
                    fixed += math.isinf(alone)
        lines.append(f"| {label} | {worse} of {len(names) * len(RATIOS)} | {better} | {fixed} | {worst[1] or '-'} |")
    lines += ["", "![overhead with the host tier against recomputation alone](img/swap_sim.png)", "",
              "## Every cell", "", "Overhead, and in brackets the copies back, per log and ratio.", ""]
    for n in names:
        lines += [f"### {n} ({kinds[n]})", "", "| variant | " + " | ".join(map(str, RATIOS)) + " |",
                  "| --- " * (len(RATIOS) + 1) + "|"]
        for label, _, _ in variants:
            cells = []
            for r in RATIOS:
                o = grid[(n, label, r)]
                cells.append(_cell(o) + (f" ({o.swaps_in})" if o.swaps_in else ""))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if not a.no_optimum:
        lines += _optimum(policy, a.time_limit)
    Path(a.out).write_text("\n".join(lines) + "\n")
    _plot(grid, names, variants, Path(a.out).parent / "img" / "swap_sim.png")
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


def _optimum(policy: str, limit: float) -> list[str]:
    """The policy with the host tier against the exact optimum with offload (Checkmate's ILP with a copy-back
    choice per value and stage), both with copies out overlapped, on graphs the solver handles."""
    from torch_dtr.sim import chains, checkmate, log, replay  # noqa: PLC0415

    cases = [(f"unit chain n={n}", chains.linear_chain(n), 2.0) for n in (16, 32)]  # a copy: half an op
    with tempfile.TemporaryDirectory() as tmp:
        cases += [(f"recorded {name}", log.read(path), MEMORY_GBPS["recorded"] / LINK)
                  for name, path in _record_small(Path(tmp))]
    lines = ["", "## Against the exact optimum with offload", "",
             f"Checkmate's ILP with a third choice per value and stage (copy back from host memory; "
             f"`torch_dtr.sim.checkmate.solve(..., swap_gbps=B, swap_out_free=True)`, HiGHS, {limit:.0f} s per "
             "solve) against the replay with the host tier at the same bandwidth, copies out overlapped in both; "
             "same absolute budget (ratio x the replay's no-eviction peak). The ILP frees a value right after "
             "its last use, the replay when the log releases it: its memory model is the more generous one.", "",
             "| graph | nodes | GB/s | ratio | ours (copies back) | optimum with offload | optimum without | "
             "ours / optimum |", "| --- " * 8 + "|"]
    worst = 0.0
    for label, lg, gbps in tqdm(cases, desc="optimum", file=sys.stderr):
        peak = replay.no_eviction_peak(lg)
        g = checkmate.graph_from_log(lg)
        if g.n > checkmate.DIRECT_MAX_NODES:
            lines.append(f"| {label} | {g.n} | | | (too large for the offload model) | | | |")
            continue
        for r in (0.3, 0.5, 0.7, 0.9):
            b = int(r * peak)
            o = replay.simulate(lg, policy, ratio=r, peak=peak, swap_gbps=gbps, swap_out_free=True)
            s = checkmate.solve(g, b, time_limit=limit, swap_gbps=gbps, swap_out_free=True)
            s0 = checkmate.solve(g, b, time_limit=limit)
            ok = s.status in ("optimal", "feasible")
            opt = f"{s.overhead:.3f} ({s.status})" if ok else s.status
            opt0 = f"{s0.overhead:.3f}" if s0.status in ("optimal", "feasible") else s0.status
            rel = "-"
            if ok and o.status == "ok":
                worst = max(worst, o.overhead / s.overhead)
                rel = f"{o.overhead / s.overhead:.3f}"
            elif ok:
                rel = "**policy failed**"
            lines.append(f"| {label} | {g.n} | {gbps:g} | {r} | {_cell(o)} ({o.swaps_in}) | {opt} | {opt0} | {rel} |")
    lines += ["", f"Largest ours / optimum where both ran: {worst:.3f}.", ""]
    return lines


def _plot(grid: dict, names: list[str], variants: tuple, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5.5, 5))
    base = variants[0][0]
    for (label, _, _), marker in zip(variants[1:], "ox", strict=True):
        xs, ys = [], []
        for n in names:
            for r in RATIOS:
                a, b = grid[(n, base, r)], grid[(n, label, r)]
                xs.append(min(a.overhead, 2.05) if a.status == "ok" else 2.05)
                ys.append(min(b.overhead, 2.05) if b.status == "ok" else 2.05)
        ax.scatter(xs, ys, s=12, marker=marker, alpha=0.7, label=label)
    ax.plot([1, 2.05], [1, 2.05], "k--", lw=1)
    ax.set_xlabel("overhead, recomputation alone (2.05: oom or thrash)")
    ax.set_ylabel("overhead with the host tier")
    ax.set_title("each (log, budget ratio): below the diagonal is better")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
