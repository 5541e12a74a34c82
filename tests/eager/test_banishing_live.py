"""Banishing live (NOTE [ Banishing ] 6): the default depth trains the tests' LSTM loop at a budget where
no banishing fails, with the same bits as plain PyTorch."""

from __future__ import annotations

import harness
import models
import pytest

import torch_dtr
from torch_dtr.eager.front import DEFAULT_BANISH_DEPTH


def test_the_default_banishes_at_two_links():
    assert DEFAULT_BANISH_DEPTH == 2


def test_lstm_loop_at_58pct_trains_bitwise_with_banishing_and_fails_without(monkeypatch):
    # measured 2026-11-25 (benchmarks/floors.py, SGD, 3 steps): smallest feasible 54% of the peak with
    # depth 2, 65% without. 58% sits between them; both runs are deterministic (modelled costs)
    monkeypatch.setattr(harness, "SWAP", {"swap": False})  # recomputation alone (the host tier trains both)
    b = models.BUILDERS["lstm_loop"]
    peak = harness.unconstrained_peak(b, "sgd")
    budget = int(0.58 * peak)
    cap = harness.remat_cap(b, "sgd")
    want = harness.run_plain(b, "sgd")
    got = harness.run_dtr(b, "sgd", budget, max_remats=cap)
    harness.assert_same(want, got)
    assert got.stats.banished > 0 and got.stats.rematerializations + got.stats.swaps_in > 0
    assert got.stats.peak_bytes <= budget
    monkeypatch.setattr(harness, "BANISH", 0)
    with pytest.raises((torch_dtr.BudgetError, harness.TooMuchRecomputation)):
        harness.run_dtr(b, "sgd", budget, max_remats=cap)
