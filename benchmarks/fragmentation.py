"""What a budget leaves the device holding (issue 52): the bench's GPT-2, ResNet-50 and LSTM loop, three training
steps each on the simulated CUDA caching allocator (NOTE [ Simulated allocator ], expandable segments on and off),
plain and under budgets of a share of plain's peak allocated bytes; for each, the allocator's peak allocated and
reserved bytes. Then the same budgets with the simulated device's capacity set to the budget: whether the step
trains when the device really holds no more than the budget. Writes docs/fragmentation.md and
docs/img/fragmentation.png.

    python benchmarks/fragmentation.py            # about 10 minutes on 2 cores
    python benchmarks/fragmentation.py --quick    # small sizes, a minute
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from pathlib import Path
from typing import Any

import torch

import torch_dtr
from torch_dtr.bench.workloads import SIZES, build, describe
from torch_dtr.core.errors import fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
RATIOS = (0.8, 0.65, 0.5)
STEPS = 3  # measured after one warm-up step (the optimizer's state made)


def measure(name: str, quick: bool, expandable: bool, ratio: float | None = None, peak: int = 0,
            capped: bool = False, layout: bool = True) -> dict[str, Any]:
    """One run: plain (``ratio`` None) or under ``ratio`` x ``peak`` allocated bytes; ``capped``: the simulated
    device's capacity is that budget too; ``layout``: NOTE [ Layout-aware eviction ] on (the default)."""
    was = torch_dtr.SimulatedDevice.cheap_layout
    torch_dtr.SimulatedDevice.cheap_layout = layout
    try:
        return _measure(name, quick, expandable, ratio, peak, capped)
    finally:
        torch_dtr.SimulatedDevice.cheap_layout = was


def _measure(name: str, quick: bool, expandable: bool, ratio: float | None, peak: int,
             capped: bool) -> dict[str, Any]:
    budget = None if ratio is None else int(ratio * peak)
    size = SIZES[name]["quick" if quick else "full"]
    with torch_dtr.SimulatedDevice(budget if capped else None, expandable=expandable,
                                   scale=1 / 16 if quick else 1.0) as dev:
        model, batches, step = build(name, size, STEPS + 1, seed=0)
        out: dict[str, Any] = {"ratio": ratio, "budget": budget, "status": "ok"}
        if budget is not None:  # (from the warm-up step on: under a capped device it needs the budget too)
            torch_dtr.enable(budget=budget, device=dev, expandable_segments=expandable, learn=False)
        t0 = time.perf_counter()
        try:
            step(model, batches[0])
            dev.reset_peak()
            t0 = time.perf_counter()
            for i in range(1, STEPS + 1):
                step(model, batches[i])
        except (torch_dtr.BudgetError, torch.OutOfMemoryError) as e:
            out["status"] = "BudgetError" if isinstance(e, torch_dtr.BudgetError) else "out of memory"
        finally:
            if budget is not None:
                st = torch_dtr.stats()
                out |= {"evictions": st.evictions, "remats": st.rematerializations, "oom_retries": st.oom_retries}
                torch_dtr.disable()
        out |= {"seconds": time.perf_counter() - t0, "allocated": dev.max_allocated(), "reserved": dev.peak_reserved}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for name in ("gpt2", "resnet50", "lstm"):
        size = SIZES[name]["quick" if args.quick else "full"]
        r: dict[str, Any] = {"what": describe(name, size)}
        for exp in (True, False):
            plain = measure(name, args.quick, exp)
            rows = [plain] + [measure(name, args.quick, exp, ratio, plain["allocated"]) for ratio in RATIOS]
            r["expandable" if exp else "segments"] = rows
            for row in rows:
                print(f"{name} expandable={exp} {row['ratio']}: {row['status']} allocated {fmt_bytes(row['allocated'])}"
                      f" reserved {fmt_bytes(row['reserved'])}", flush=True)
        peak = r["expandable"][0]["allocated"]
        r["blind"] = [measure(name, args.quick, True, ratio, peak, layout=False) for ratio in RATIOS]
        for row in r["blind"]:
            print(f"{name} without layout-aware eviction {row['ratio']}: {row['status']} reserved "
                  f"{fmt_bytes(row['reserved'])}", flush=True)
        r["capped"] = [measure(name, args.quick, True, ratio, peak, capped=True) for ratio in RATIOS]
        for row in r["capped"]:
            print(f"{name} capped {row['ratio']}: {row['status']}", flush=True)
        results[name] = r
    write(results, args.quick, time.perf_counter() - t0)


def _ratio(row: dict[str, Any]) -> str:
    return f"{row['reserved'] / row['allocated']:.2f}" if row["allocated"] else "-"


def _over(row: dict[str, Any]) -> str:
    return "-" if row["budget"] is None else f"{row['reserved'] / row['budget']:.2f}"


def _blind(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return _over(row) + ("" if row["status"] == "ok" else f" ({row['status']})")


def write(results: dict[str, dict[str, Any]], quick: bool, seconds: float) -> None:
    lines = ["# What a budget leaves the device holding (issue 52)", "",
             f"{datetime.date.today()}, {platform.machine()} CPU (no GPU), Python {platform.python_version()}, torch "
             f"{torch.__version__}; `python benchmarks/fragmentation.py{' --quick' if quick else ''}` "
             f"({seconds / 60:.0f} min). Each workload trains {STEPS} steps after a warm-up step (under the budget "
             f"where there is one) on the simulated CUDA "
             f"caching allocator (NOTE [ Simulated allocator ] in src/torch_dtr/native/simdevice.py: PyTorch's "
             f"rules for segments, splitting, best fit and, with expandable segments, pages mapped where a request "
             f"reaches and kept mapped once freed). Budgets are shares of plain PyTorch's peak allocated bytes "
             f"(what the budget bounds on CUDA); *reserved / allocated* divides the allocator's peak reserved bytes "
             f"by its peak allocated ones, *reserved / budget* by the budget.", "",
             "Workloads: " + "; ".join(f"{name}: {r['what']}" for name, r in results.items()) + ".", "",
             "Expandable segments on (what `enable()` sets on CUDA), with layout-aware eviction (NOTE [ Layout-aware "
             "eviction ] in src/torch_dtr/eager/device.py; the default on the simulated device), then the same "
             "budgets without it, and without expandable segments:", "",
             "| workload | budget | outcome | allocated | reserved | reserved / allocated | reserved / budget | "
             "without layout-aware eviction: reserved / budget | without expandable segments: reserved / budget |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        blind = [None, *r["blind"]]
        for e, b, s in zip(r["expandable"], blind, r["segments"], strict=True):
            budget = "plain" if e["ratio"] is None else f"{e['ratio']:.0%}"
            lines.append(f"| {name} | {budget} | {e['status']} | {fmt_bytes(e['allocated'])} | "
                         f"{fmt_bytes(e['reserved'])} | {_ratio(e)} | {_over(e)} | "
                         f"{_blind(b)} | {_over(s)} |")

    def worst(key: str) -> str:
        ok = [row for r in results.values() for row in r[key] if row["budget"] and row["status"] == "ok"]
        return f"{max(row['reserved'] / row['budget'] for row in ok):.2f}" if ok else "-"

    lines += ["", f"Where a run trained under a budget, the device held up to {worst('expandable')}x the budget with "
              f"layout-aware eviction and {worst('blind')}x without it (issue 52's target: within the budget, reserved "
              f"/ allocated at most 1.05); plain PyTorch's own reserved / allocated stays near 1. Evicting scattered "
              f"tensors leaves holes that later, larger requests cannot use, so the range grows at its end; H200 "
              f"figures for GPT-2 small without layout-aware eviction (docs/benchmarks-cuda.md): 1.41 at 50% and 1.57 "
              f"at 37%. What layout-aware eviction does not reach: each pool's pages stay mapped at its own high-water "
              f"mark, so a program whose small activations and large temporaries peak at different times (the LSTM "
              f"loop) holds their sum.", ""]
    lines += ["With the device's capacity set to the budget (so that the device may hold no more than it), under "
              "expandable segments:", "", "| workload | budget | outcome | out-of-memory retries | evictions | "
              "recomputations |", "| --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        for row in r["capped"]:
            lines.append(f"| {name} | {row['ratio']:.0%} | {row['status']} | {row.get('oom_retries', '-')} | "
                         f"{row.get('evictions', '-')} | {row.get('remats', '-')} |")
    lines += ["", "A run that ends in *out of memory* is one where evicting on the allocator's failure (a window of "
              "adjacent blocks first, NOTE [ Device memory ]) did not free a block the request could use: what "
              "planned addresses (docs/arena.md) and layout-aware eviction are for.", "",
              "![fragmentation](img/fragmentation.png)"]
    out = ROOT / "docs" / "fragmentation.md"
    out.write_text("\n".join(lines) + "\n")
    _plot(results, ROOT / "docs" / "img" / "fragmentation.png")
    print(f"wrote {out}")


def _plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.4), sharey=True)
    for ax, (name, r) in zip(axes, results.items(), strict=True):
        labels = ["plain" if row["ratio"] is None else f"{row['ratio']:.0%}" for row in r["expandable"]]
        x = range(len(labels))
        for off, key, label in ((-0.2, "expandable", "expandable segments"), (0.2, "segments", "without")):
            vals = [row["reserved"] / row["allocated"] if row["allocated"] else 0 for row in r[key]]
            bars = ax.bar([i + off for i in x], vals, 0.4, label=label)
            for b, row in zip(bars, r[key], strict=True):
                if row["status"] != "ok":
                    ax.annotate("fail", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", fontsize=7)
        ax.axhline(1.05, color="grey", lw=0.8, ls="--")
        ax.set_xticks(list(x), labels)
        ax.set_title(name)
        ax.set_ylim(0.9, None)
    axes[0].set_ylabel("peak reserved / peak allocated")
    axes[0].legend(fontsize=8)
    fig.suptitle("Simulated CUDA caching allocator under a budget (dashed: issue 52's 1.05)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
