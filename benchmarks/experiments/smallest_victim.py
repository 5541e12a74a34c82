"""NOTE [ The smallest victim ] (src/torch_dtr/core/runtime.py): the bench's LSTM loop (full size) trained five
steps after a warm-up under 45% of its no-eviction peak, live sessions' smallest victim at 64 B (the default) and
at 0 (any storage may go); prints the recomputations and evictions of each.

    python benchmarks/experiments/smallest_victim.py    # about a minute on 2 cores
"""

from __future__ import annotations

import torch_dtr
import torch_dtr.eager.front as front
import torch_dtr.native.session as session
from torch_dtr.bench.workloads import SIZES, build

PEAK = int(177.4 * 2**20)  # the LSTM loop's tracked peak in docs/benchmarks.md
RATIO = 0.45


def run(minimum: int) -> tuple[int, int]:
    front.EVICT_MINIMUM = session.EVICT_MINIMUM = minimum  # both front ends read it when a session starts
    model, batches, step = build("lstm", SIZES["lstm"]["full"], 6, seed=0)
    step(model, batches[0])
    with torch_dtr.enable(budget=int(RATIO * PEAK), learn=False):
        for b in batches[1:]:
            step(model, b)
        st = torch_dtr.stats()
    return st.rematerializations, st.evictions


if __name__ == "__main__":
    for minimum in (64, 0):
        remats, evictions = run(minimum)
        print(f"smallest victim {minimum} B: {remats} recomputations, {evictions} evictions")
