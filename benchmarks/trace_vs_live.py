"""The simulator against the live runtime (issue 56): each workload's second training iteration is traced once
without a budget (``torch_dtr.enable(trace=...)``), replayed at budgets of 0.3-0.9 of its no-eviction peak, and run
live at the same budgets, each in a session of its own from the same state; the operator log of the same iteration
(``torch_dtr.record``, modelled costs) is replayed too, as ``torch-dtr simulate`` did before traces.

    python benchmarks/trace_vs_live.py            # writes docs/simulation-live.md and docs/img/simulation_live.png
    python benchmarks/trace_vs_live.py --quick    # small sizes, a minute

Nothing else may run meanwhile (the live step times are measured).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_dtr
from torch_dtr.bench.workloads import SIZES, Size, build, describe
from torch_dtr.sim import log as oplog
from torch_dtr.sim.replay import no_eviction_peak, simulate
from torch_dtr.sim.trace import read_trace, simulate_trace, trace_peak

RATIOS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ROOT = Path(__file__).resolve().parent.parent

Make = Callable[[], Callable[[], None]]


def _bench(name: str, size: Size) -> Make:
    def make() -> Callable[[], None]:
        model, batches, step = build(name, size, 2, seed=0)
        step(model, batches[0])  # the warm-up iteration (optimizer state made)

        def run() -> None:
            torch.manual_seed(1)  # dropout draws the same masks in every run
            step(model, batches[1])
        return run
    return make


def _mlp(quick: bool) -> Make:
    width = 256 if quick else 1024

    def make() -> Callable[[], None]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(8)],
                              nn.Linear(width, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(256, width), torch.randint(0, 10, (256,))

        def run() -> None:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        run()
        return run
    return make


def _moe(quick: bool) -> Make:
    width, tokens = (64, 256) if quick else (256, 2048)

    def make() -> Callable[[], None]:
        torch.manual_seed(0)
        gate = nn.Linear(width, 8)
        experts = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                for _ in range(8))
        opt = torch.optim.AdamW([*gate.parameters(), *experts.parameters()], lr=1e-3)
        x = torch.randn(tokens, width)

        def run() -> None:
            h = x
            for _ in range(4):  # four MoE layers sharing their experts, top-2 routing
                weights, chosen = gate(h).softmax(-1).topk(2, dim=-1)
                out = torch.zeros_like(h)
                for e, expert in enumerate(experts):
                    rows, slot = (chosen == e).nonzero(as_tuple=True)
                    out = out.index_add(0, rows, expert(h[rows]) * weights[rows, slot, None])
                h = h + out
            h.square().mean().backward()
            opt.step()
            opt.zero_grad()
        run()
        return run
    return make


def _small_gpt2(quick: bool) -> Make:
    import transformers

    layers, width, seq = (2, 128, 64) if quick else (4, 384, 256)

    def make() -> Callable[[], None]:
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=6 if width % 6 == 0 else 4,
                                      n_positions=seq, vocab_size=8192)
        model = transformers.GPT2LMHeadModel(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ids = torch.randint(0, 8192, (4, seq))

        def run() -> None:
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        run()
        return run
    return make


def workloads(quick: bool) -> dict[str, tuple[str, Make]]:
    size = "quick" if quick else "full"
    out: dict[str, tuple[str, Make]] = {}
    for name in ("gpt2", "resnet50", "lstm"):
        s = SIZES[name][size]
        out[f"bench {name}"] = (describe(name, s), _bench(name, s))
    small = "2 layers x 128, sequence 64" if quick else "4 layers x 384, sequence 256"
    out["small GPT-2"] = (f"GPT-2 (transformers), {small}, batch 4, vocabulary 8192, SGD", _small_gpt2(quick))
    out["MLP"] = (f"8 x Linear({256 if quick else 1024}) + GELU, batch 256, SGD with momentum", _mlp(quick))
    out["MoE"] = (f"4 MoE layers, 8 experts (width {64 if quick else 256}, 4x hidden), top-2 routing, "
                  f"{256 if quick else 2048} tokens, AdamW", _moe(quick))
    return out


def live(make: Make, budget: int) -> dict[str, Any]:
    run = make()
    t0 = time.perf_counter()
    try:
        with torch_dtr.enable(budget=budget):
            run()
            st = torch_dtr.stats()
    except torch_dtr.BudgetError:
        return {"status": "oom", "seconds": time.perf_counter() - t0}
    return {"status": "ok", "evictions": st.evictions, "remats": st.rematerializations,
            "seconds": time.perf_counter() - t0}


def measure(make: Make, tmp: Path) -> dict[str, Any]:
    run = make()
    with torch_dtr.enable(budget=None, trace=tmp / "step.trace"):
        run()
    trace = read_trace(tmp / "step.trace")
    peak = trace_peak(trace)
    run = make()
    with torch_dtr.record(tmp / "step.log", costs="model"):
        run()
    log = oplog.read(tmp / "step.log")
    log_peak = no_eviction_peak(log)
    run = make()
    t0 = time.perf_counter()
    run()
    plain = time.perf_counter() - t0
    rows = []
    for ratio in RATIOS:
        budget = int(ratio * peak)
        o = simulate_trace(trace, budget=budget)
        full = simulate_trace(trace, budget=budget, thrash_at=None)
        lg = simulate(log, budget=int(ratio * log_peak))
        lv = live(make, budget)
        rows.append({"ratio": ratio, "budget": budget, "live": lv,
                     "trace": {"status": o.status, "overhead": o.overhead, "evictions": full.evictions,
                               "remats": full.rematerializations, "full_status": full.status},
                     "log": {"status": lg.status, "overhead": lg.overhead, "evictions": lg.evictions,
                             "remats": lg.rematerializations}})
        print(f"  {ratio:.1f}: live {lv['status']} {lv.get('evictions', '-')}/{lv.get('remats', '-')}, trace "
              f"{full.status} {full.evictions}/{full.rematerializations}, log {lg.status}", file=sys.stderr, flush=True)
    return {"ops": trace.ops(), "peak": peak, "log_peak": log_peak, "plain_seconds": plain, "rows": rows}


def _agree(r: dict[str, Any]) -> bool:
    lv, tr = r["live"], r["trace"]
    if lv["status"] != "ok":
        return tr["full_status"] == "oom"
    return tr["full_status"] == "ok" and (tr["evictions"], tr["remats"]) == (lv["evictions"], lv["remats"])


def _monotonic(rows: list[dict[str, Any]]) -> bool:
    """No ratio that trains (replay ok) is followed, at a larger budget, by one that does not, and the replay's
    overhead never rises with the budget."""
    ok = [r for r in rows if r["trace"]["status"] == "ok"]
    if not ok:
        return True
    first = rows.index(ok[0])
    if any(r["trace"]["status"] != "ok" for r in rows[first:]):
        return False
    ovs = [r["trace"]["overhead"] for r in ok]
    return all(b <= a + 1e-12 for a, b in zip(ovs, ovs[1:], strict=False))


def _cell(d: dict[str, Any], with_overhead: bool) -> str:
    if d["status"] != "ok":
        return d["status"]
    s = f"{d['evictions']} / {d['remats']}"
    return f"{s}, {d['overhead']:.3f}" if with_overhead else s


def report(results: dict[str, dict[str, Any]], descriptions: dict[str, str], quick: bool, took: float) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        "# The simulator against the live runtime",
        "",
        f"{today}, {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, compiled "
        f"front end and core. Command: `python benchmarks/trace_vs_live.py{' --quick' if quick else ''}` "
        f"({took / 60:.0f} min).",
        "",
        "Each workload's second training iteration (after one warm-up step), traced once without a budget "
        "(`torch_dtr.enable(trace=...)`, NOTE [ Traces ]), replayed at each budget, and run live at the same budget "
        "in a session of its own from the same state. Budgets: ratio x the trace's no-eviction peak (constants "
        "included). Cells: evictions / recomputations; for replays also the overhead the replay reports, (op cost + "
        "recomputed op cost) / op cost in modelled seconds (`thrash` past 2.0; the counts are then of the run to "
        "its end). `oom`: a BudgetError. The last column replays the operator log of the same iteration "
        "(`torch_dtr.record(costs=\"model\")`, every aten op; ratio x its own peak), which is what `torch-dtr "
        "simulate` replayed before traces.",
        "",
    ]
    for name, res in results.items():
        agree = all(_agree(r) for r in res["rows"])
        mono = _monotonic(res["rows"])
        lines += [
            f"## {name}",
            "",
            f"{descriptions[name]}: {res['ops']} managed ops, no-eviction peak {res['peak'] / 2**20:.1f} MiB "
            f"(operator log: {res['log_peak'] / 2**20:.1f} MiB), plain step {res['plain_seconds']:.2f} s. Trace "
            f"replay equals live at every budget: **{'yes' if agree else 'NO'}**; its overhead monotonic in the "
            f"budget: **{'yes' if mono else 'NO'}**.",
            "",
            "| ratio | budget | live | live step s | trace replay | operator-log replay |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in res["rows"]:
            tr = dict(r["trace"])
            if tr["status"] == "thrash":  # and the replay run to its end without the thrash limit
                tr_cell = f"thrash; to the end: {_cell(dict(tr, status=tr['full_status']), False)}"
            else:
                tr_cell = _cell(tr, True)
            lines.append(f"| {r['ratio']:.1f} | {r['budget'] / 2**20:.1f} MiB | {_cell(r['live'], False)} | "
                         f"{r['live']['seconds']:.2f} | {tr_cell} | {_cell(r['log'], True)} |")
        lines.append("")
    lines += ["![recomputations against the budget](img/simulation_live.png)", ""]
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(3.3 * len(results), 3.2), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        rows = res["rows"]
        for key, style, label in (("live", "ko", "live"), ("trace", "b-", "trace replay"),
                                  ("log", "r--", "operator-log replay")):
            pts = [(r["ratio"], r[key]["remats"]) for r in rows
                   if r[key]["status"] == "ok" or (key == "trace" and r[key]["full_status"] == "ok")]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, ms=4, label=label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("budget / peak")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("recomputations")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", action="append", help="a workload's name (repeatable)")
    p.add_argument("--out", default=str(ROOT / "docs"))
    args = p.parse_args()
    t0 = time.perf_counter()
    ws = workloads(args.quick)
    names = args.only or list(ws)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            print(f"{name}:", file=sys.stderr, flush=True)
            results[name] = measure(ws[name][1], Path(tmp))
    out = Path(args.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    text = report(results, {n: ws[n][0] for n in names}, args.quick, time.perf_counter() - t0)
    (out / "simulation-live.md").write_text(text)
    plot(results, out / "img" / "simulation_live.png")
    print(text)


if __name__ == "__main__":
    main()
