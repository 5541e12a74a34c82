"""Eviction policies live on the bench's workloads, in one process: what each recomputes and what its search costs.

    python benchmarks/policy_live.py [--policies dtr_eq dtr] [--runs gpt2:0.3 resnet50:0.5 lstm:0.5]
                                     [--out docs/policy_live.md]

For each workload (``torch-dtr bench``'s full sizes) and budget (a fraction of plain PyTorch's tracked peak
as the bench measured it, ``PEAK_MIB``), trains 3 steps under each policy and reports the last step's
recomputations, their modelled cost (NOTE [ Modelled costs ]: the same in every run), the eviction search's
seconds and the step's seconds (one run each on a shared machine: read the step times to about +-10%).
Iteration plans are off (``plans=False``): the third step would be their trial iteration (NOTE [ Iteration
plans ] 5), and this compares the policies alone. The simulator compares policies on recorded logs
(``policy_grid.py``); this measures the live runtime, where the search's own cost counts. About 3 minutes with
``dtr`` (exact neighbourhoods are slow on the LSTM loop).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

import torch_dtr
from torch_dtr.bench import workloads

PEAK_MIB = {"gpt2": 695.8, "resnet50": 312.8, "lstm": 181.3}  # plain's tracked peaks, docs/benchmarks.md


def _run(name: str, ratio: float, policy: str) -> list[str]:
    torch.manual_seed(0)
    model, batches, step = workloads.build(name, workloads.SIZES[name]["full"], steps=3)
    torch_dtr.enable(budget=int(ratio * PEAK_MIB[name] * 2**20), policy=policy, plans=False)
    rt = torch_dtr.runtime()
    try:
        for b in batches:
            r0, s0, c0, t0 = rt.rematerializations, rt.search_seconds, rt.remat_cost, time.perf_counter()
            float(torch_dtr.unwrap(step(model, b)))
        return [str(rt.rematerializations - r0), f"{rt.remat_cost - c0:.2f}", f"{rt.search_seconds - s0:.3f}",
                f"{time.perf_counter() - t0:.2f}"]
    except torch_dtr.BudgetError:
        return ["BudgetError", "", "", ""]
    finally:
        torch_dtr.disable()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", nargs="+", default=["dtr_eq", "dtr"])
    ap.add_argument("--runs", nargs="+", default=["gpt2:0.3", "resnet50:0.5", "lstm:0.5"])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "policy_live.md"))
    a = ap.parse_args()
    torch.set_num_threads(2)
    lines = ["# Eviction policies live on the bench's workloads", "",
             f"Written by `python benchmarks/policy_live.py --policies {' '.join(a.policies)} --runs "
             f"{' '.join(a.runs)}` on {datetime.date.today()} (2 CPU cores). The third of 3 training steps, "
             "iteration plans off, one process per table row; *modelled cost*: the recomputed recipes' modelled "
             "seconds.", "",
             "| workload | budget | policy | recomputations | modelled cost | search (s) | step (s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for run in a.runs:
        name, ratio = run.split(":")
        for p in a.policies:
            cells = _run(name, float(ratio), p)
            print(name, ratio, p, *cells, file=sys.stderr, flush=True)
            lines.append(f"| {name} | {float(ratio):.0%} | `{p}` | " + " | ".join(cells) + " |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
