"""Modelled recomputation costs (NOTE [ Modelled costs ]): FLOPs and bytes instead of timers, so the same
program at the same budget makes the same eviction choices in every run, in this process or a fresh one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import harness
import pytest
import torch
from models import BUILDERS

import torch_dtr
from torch_dtr.eager.costs import RATES, WEIGHTS, flops, model_cost, weights

_RUN = """
import json, sys, torch
sys.path.insert(0, {here!r})
import harness, models
torch.set_num_threads(1)
b = models.BUILDERS["tree_rnn"]
r = harness.run_dtr(b, "adam", {budget}, max_remats=harness.remat_cap(b, "adam"))
s = r.stats
print(json.dumps([s.evictions, s.drops, s.rematerializations, s.peak_bytes, s.ops]))
"""


def test_matmul_cost_is_its_flops_and_bytes_at_the_cpu_rates():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    out = a @ b
    assert flops(torch.ops.aten.mm.default, (a, b), {}, out) == 2 * 64 * 32 * 16
    rate, bandwidth = RATES["cpu"]
    moved = (64 * 32 + 32 * 16 + 64 * 16) * 4
    got = model_cost(torch.ops.aten.mm.default, (a, b), {}, [out], "cpu")
    assert got == pytest.approx(2 * 64 * 32 * 16 / rate + moved / bandwidth)
    relu = model_cost(torch.ops.aten.relu.default, (a,), {}, [a.relu()], "cpu")
    assert relu == pytest.approx(2 * a.nbytes / bandwidth * weights("aten.relu.default")[0])


def test_drawing_random_numbers_weighs_more_than_its_bytes_on_the_cpu_and_nothing_more_on_cuda():
    """NOTE [ Modelled costs ] 5: dropout's mask is no longer modelled as cheap to draw again on the CPU."""
    a = torch.randn(64, 32)
    w_cpu, w_cuda = weights("aten.bernoulli_.float")
    assert w_cpu == WEIGHTS["cpu"]["bernoulli_"] >= 5 and w_cuda == 1.0
    moved = 2 * a.nbytes  # its input and its output
    got = model_cost(torch.ops.aten.bernoulli_.float, (a, 0.5), {}, [a], "cpu")
    assert got == pytest.approx(moved / RATES["cpu"][1] * w_cpu)
    assert model_cost(torch.ops.aten.bernoulli_.float, (a, 0.5), {}, [a], "cuda") == pytest.approx(
        moved / RATES["cuda"][1])
    assert weights("aten.mm.default") == (1.0, 1.0) and weights("mylib.bernoulli_.default") == (1.0, 1.0)


def test_costs_must_be_time_or_model():
    with pytest.raises(ValueError, match="costs must be 'time' .* or 'model' .*got 'flops'"):
        torch_dtr.enable(costs="flops")
    assert not torch_dtr.enabled()


@pytest.mark.slow
def test_tree_rnn_at_33pct_makes_the_same_choices_in_two_fresh_processes_and_matches_plain(monkeypatch):
    # with measured times this case trained in some runs and thrashed in others at 30% (docs/design.md);
    # 33% is just above its smallest budget with the default policy (dtr_eq fails at 30%, dtr_chain trained)
    torch.set_num_threads(1)
    b = BUILDERS["tree_rnn"]
    budget = int(0.33 * harness.unconstrained_peak(b, "adam"))
    ref = harness.run_plain(b, "adam")
    here = str(Path(__file__).parent)
    counters = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _RUN.format(here=here, budget=budget)], capture_output=True,
                             text=True, timeout=600, check=True)
        counters.append(json.loads(out.stdout.strip().splitlines()[-1]))
    monkeypatch.setattr(harness, "SWAP", {"swap": False})  # as the fresh processes run (no conftest there)
    got = harness.run_dtr(b, "adam", budget, max_remats=harness.remat_cap(b, "adam"))
    s = got.stats
    counters.append([s.evictions, s.drops, s.rematerializations, s.peak_bytes, s.ops])
    assert counters[0] == counters[1] == counters[2], counters
    assert s.rematerializations > 0 and s.peak_bytes <= budget
    harness.assert_same(ref, got)
