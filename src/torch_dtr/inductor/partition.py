"""Compile's own partitioner, at the activation memory budget whose predicted bytes fit a byte allowance
(NOTE [ Compiled regions under a budget ] 3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch._functorch.config as functorch_config
import torch.fx as fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from .graphmem import region_bytes

# activation memory budgets tried, most saved first; then two halvings between the first that fits and the one
# before it
FRACTIONS = (1.0, 0.85, 0.7, 0.5, 0.35, 0.2, 0.1, 0.0)


@dataclass
class Choice:
    allowance: int  # bytes the region may hold beyond what lives outside it
    fraction: float  # compile's activation memory budget chosen
    predicted: int  # the region's bytes expected at it (graphmem.region_bytes, corrected by what was measured)
    fits: bool  # predicted <= allowance (else: the least expected of those tried)
    tried: dict[float, int] = field(default_factory=dict)  # fraction -> bytes expected


class BudgetPartitioner(CustomPartitionerFn):
    """Partitions a joint graph as inductor's default partitioner does, at the largest activation memory budget
    whose expected bytes fit ``allowance``; the choice is left in ``choice``. The bytes expected at a fraction:
    those ``measured`` there before, else graphmem's prediction times ``short`` (how far predictions fell short
    of measurements elsewhere). Plain data only: inductor pickles its configuration, this included."""

    def __init__(self, allowance: int, measured: dict[float, int] | None = None, short: float = 1.0) -> None:
        self.allowance = allowance
        self.measured = dict(measured or {})
        self.short = max(1.0, short)
        self.predicted: dict[float, int] = {}  # fraction -> graphmem's prediction
        self.choice: Choice | None = None

    def expect(self, fraction: float, predicted: int) -> int:
        self.predicted[fraction] = predicted
        return self.measured.get(fraction, int(predicted * self.short))

    def __call__(self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        made: dict[float, tuple[int, fx.GraphModule, fx.GraphModule]] = {}

        def at(f: float) -> int:
            if f not in made:
                with functorch_config.patch(activation_memory_budget=f):
                    fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
                made[f] = (self.expect(f, region_bytes(fw, bw)), fw, bw)
            return made[f][0]

        best = None
        before = None
        for f in FRACTIONS:
            if at(f) <= self.allowance:
                best = f
                break
            before = f
        if best is not None and before is not None:
            lo, hi = best, before  # lo fits, hi does not
            for _ in range(2):
                mid = round((lo + hi) / 2, 4)
                lo, hi = (mid, hi) if at(mid) <= self.allowance else (lo, mid)
            best = lo
        fits = best is not None
        if best is None:  # none fits: the least bytes of those tried (the curve need not fall with the fraction)
            best = min(made, key=lambda f: (made[f][0], -f))
        predicted, fw, bw = made[best]
        self.choice = Choice(self.allowance, best, predicted, fits, {f: m[0] for f, m in sorted(made.items())})
        return fw, bw

    def uuid(self) -> Any:
        return None  # no cached compilation: the choice depends on the allowance, and is read from ``choice``
