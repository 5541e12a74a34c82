"""A traced iteration's allocations, planned (NOTE [ Planned allocation ]; sim/arena.py): the spans the replay
records add up to the runtime's own count, and the plan needs no more than an allocator without one."""

from __future__ import annotations

import pytest
from steps import fresh, lstm_cells, mlp

import torch_dtr
from torch_dtr.sim.arena import arena_for_trace, describe
from torch_dtr.sim.trace import read_trace

pytestmark = pytest.mark.skipif(not torch_dtr.native.available(), reason="traces come from the compiled front end")


@pytest.mark.parametrize("make", [mlp, lstm_cells])
def test_the_planned_arena_of_a_traced_step_lies_between_its_live_bytes_and_first_fit(tmp_path, make):
    step = fresh(make)
    with torch_dtr.enable(budget=None, trace=tmp_path / "step.trace"):
        step()
    trace = read_trace(tmp_path / "step.trace")
    for ratio in (None, 0.5):
        o = arena_for_trace(trace, ratio=ratio)  # (raises where the spans do not add up to the runtime's count)
        d = describe(o)
        assert o.status == "ok" and o.requests > 10, d
        assert o.max_live <= o.planned <= o.first_fit, d
        if ratio is not None:
            assert o.max_live <= o.budget, d  # managed bytes stay within the budget (constants come on top)
