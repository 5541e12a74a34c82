"""The bench's LSTM loop at a smaller size, in one process: which budgets train, at what cost.

    python benchmarks/experiments/lstm_budgets.py [--width 384] [--seq 48] [--banish 0] [--ratios 0.6 0.55 0.5]

Builds ``torch_dtr.bench.workloads``' LSTM loop (batch 32) and trains 3 steps plainly, then 3 steps under
torch-dtr without a budget (its tracked peak), then 3 steps at each ratio of that peak, printing the step
time against plain, the recomputations per step and the single-op floor, or why the budget failed. A run
passing 30,000 recomputations is stopped as thrashing. docs/design.md (Banishing, Known limits) quotes it;
step times are only comparable within one run on an idle machine.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

import torch_dtr
from torch_dtr.bench import workloads


class _Thrash(RuntimeError):
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--seq", type=int, default=48)
    ap.add_argument("--banish", type=int, default=None, help="enable(banish_depth=...) (default: the library's)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.6, 0.55, 0.5])
    a = ap.parse_args()
    size = workloads.Size(32, 1, a.width, a.seq)

    def build():
        torch.manual_seed(0)
        return workloads.build("lstm", size, steps=3, seed=0)

    model, batches, step = build()
    t0 = time.perf_counter()
    for b in batches:
        step(model, b)
    plain = (time.perf_counter() - t0) / 3
    print(f"plain: {plain:.3f} s/step", flush=True)
    peak = None
    for ratio in [1.0, *a.ratios]:
        opts = {"policy": a.policy} if a.policy else {}
        if a.banish is not None:
            opts["banish_depth"] = a.banish
        torch_dtr.enable(budget=None if peak is None else int(ratio * peak), **opts)
        try:
            model, batches, step = build()
            rt = torch_dtr.runtime()

            def cap(kind: str, _s: object, rt=rt) -> None:
                if kind == "remat" and rt.rematerializations > 30_000:
                    raise _Thrash("more than 30,000 recomputations")

            torch_dtr.listen(cap)
            t0 = time.perf_counter()
            for b in batches:
                step(model, b)
            dt = (time.perf_counter() - t0) / 3
            st = torch_dtr.stats()
            print(f"{ratio:.2f} of the peak: {dt:.3f} s/step ({dt / plain:.2f}x plain), tracked peak "
                  f"{st.peak_bytes / 2**20:.1f} MiB, floor {st.floor_bytes / 2**20:.1f} MiB, "
                  f"{st.rematerializations / 3:.0f} recomputations/step, {st.banished} banished", flush=True)
            if peak is None:
                peak = st.peak_bytes
        except (torch_dtr.BudgetError, _Thrash) as e:
            print(f"{ratio:.2f} of the peak: fails: {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            torch_dtr.disable()
            gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
