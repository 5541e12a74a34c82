"""The compiled front end against the Python one under budgets: step time over plain PyTorch, evictions and
recomputations, on the bench's workloads. Writes docs/native-live.md.

    python benchmarks/native_live.py [--out docs] [--repeats 3] [--which quick,full] [--fractions 0.5]

For each workload: plain, then each front end with no budget and at each fraction of the peak that front end
measured with no budget, interleaved round by round (plain, Python, native, ...), median step of ``--repeats``
after one warm-up step per session. The two front ends feed the same core the same calls, so their evictions
and recomputations must be equal (tests/native checks it on smaller programs); the table shows them side by
side. About 3 minutes at ``--which quick``, 15 at ``full`` on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import torch_dtr
from torch_dtr import native
from torch_dtr.bench import workloads

FRONTS = {
    "python": (torch_dtr.enable, torch_dtr.disable, lambda: dataclasses.asdict(torch_dtr.stats())),
    "native": (native.enable, native.disable, native.stats),
}


def _runner(name: str, which: str):
    """A function that makes a fresh ``run(i)``: the same model, optimizer and batches every time (each session
    starts from the same weights and optimizer state, and replays the same batches: the LSTM's lengths vary)."""
    size = workloads.SIZES[name][which]

    def fresh():
        torch.manual_seed(0)
        model, batches, step = workloads.build(name, size, 4)

        def run(i: int) -> float:
            torch.manual_seed(i)
            t0 = time.perf_counter()
            step(model, batches[i % len(batches)])
            return time.perf_counter() - t0

        return run

    return fresh, workloads.describe(name, size)


def _session(front: str, budget: int | None, fresh, repeats: int) -> dict:
    enable, disable, stats = FRONTS[front]
    run = fresh()
    enable(budget)
    try:
        run(0)  # warm-up: caches, first recipes
        ts = [run(i + 1) for i in range(repeats)]
        s = stats()
    except torch_dtr.BudgetError:
        return {"s": float("nan"), "evictions": float("nan"), "remats": float("nan"), "peak": 0}
    finally:
        disable()
    n = repeats + 1
    return {"s": statistics.median(ts), "evictions": s["evictions"] / n, "remats": s["rematerializations"] / n,
            "peak": s["peak_bytes"]}


def measure(name: str, which: str, repeats: int, fractions: list[float]) -> dict:
    fresh, desc = _runner(name, which)
    plain = fresh()
    plain(0)
    peaks = {f: _session(f, None, fresh, 1)["peak"] for f in FRONTS}
    rows: dict[str, dict] = {}
    for _ in range(repeats):  # rounds: each setting once per round, so that drift hits all alike
        rows.setdefault("plain", {"s": []})["s"].append(plain(1))
        for frac in [None, *fractions]:
            for f in FRONTS:
                budget = None if frac is None else int(peaks[f] * frac)
                r = _session(f, budget, fresh, 1)
                row = rows.setdefault(f"{f} {frac}", {"s": [], "evictions": [], "remats": []})
                for k in ("s", "evictions", "remats"):
                    row[k].append(r[k])
    plain = statistics.median(rows["plain"]["s"])
    out = {"desc": desc, "plain_s": plain, "peaks": peaks, "rows": {}}
    for key, row in rows.items():
        if key == "plain":
            continue
        med = statistics.median(row["s"])
        out["rows"][key] = {"ratio": med / plain, "evictions": statistics.median(row["evictions"]),
                            "remats": statistics.median(row["remats"])}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--which", default="quick", help="sizes, comma-separated: quick, full")
    ap.add_argument("--fractions", default="0.5")
    ap.add_argument("--workloads", default="lstm,gpt2")
    a = ap.parse_args()
    if not native.available():
        print("the C++ front end cannot be built here", file=sys.stderr)
        return 1
    fractions = [float(x) for x in a.fractions.split(",")]
    torch.manual_seed(0)
    results = {}
    for which in a.which.split(","):
        for name in a.workloads.split(","):
            print(f"measuring {name} ({which}) ...", file=sys.stderr, flush=True)
            results[f"{name} ({which})"] = measure(name, which, a.repeats, fractions)
    lines = ["# The compiled front end under budgets", "",
             f"Measured {datetime.date.today().isoformat()} on {torch.get_num_threads()} threads, "
             f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch "
             f"{torch.__version__}. Command: `python benchmarks/native_live.py --which {a.which} --repeats "
             f"{a.repeats} --fractions {a.fractions} --workloads {a.workloads}`.", "",
             "Step time over plain PyTorch (median of the rounds; each setting one timed step per round, on the "
             "same batch, after a warm-up step on another in its own session), and evictions and recomputations "
             "per step. Budgets are fractions "
             "of the peak each front end counted with no budget. *python*: `torch_dtr.enable`; *native*: "
             "`torch_dtr.native.enable` (docs/native.md).", "",
             "| workload | plain step (ms) | budget | python: ratio | evictions | recomputations | "
             "native: ratio | evictions | recomputations |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | "
             "---: |"]
    for name, r in results.items():
        for frac in [None, *fractions]:
            p, n = r["rows"][f"python {frac}"], r["rows"][f"native {frac}"]
            label = "none" if frac is None else f"{frac:.0%} of the peak"
            cells = []
            for x in (p, n):
                if x["ratio"] != x["ratio"]:  # NaN: a BudgetError in some round
                    cells.append("BudgetError | - | -")
                else:
                    cells.append(f"{x['ratio']:.2f}x | {x['evictions']:.0f} | {x['remats']:.0f}")
            lines.append(f"| {name}: {r['desc']} | {r['plain_s'] * 1e3:.1f} | {label} | {cells[0]} | {cells[1]} |")
    path = Path(a.out) / "native-live.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
