"""Replaying logs through the core: the reading rules of NOTE [ Replaying a log ], the DTR theorem on a
linear chain, sqrt(n) checkpointing, and the shared logs against the DTR authors' reference results."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest
from chainlog import write_chain_log

from torch_dtr.core import Runtime
from torch_dtr.sim import baselines, chains, log, replay

LOGS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "dtr-logs"
C, R, M, Rel = log.Call, log.Result, log.Mutate, log.Release

# a(8, constant) -> b = f(a) (100 B) -> v = view(b) -> c = g(v) (50 B); b's name released (v keeps the
# storage); c += a in place (a new 50 B version; the old one is still read by that op's recipe)
HAND = log.Log((
    log.Constant("a", 8),
    C("f", ("a",), (R("b", 100, -1),), 10),
    C("view", ("b",), (R("v", 100, 0),), 1),
    C("g", ("v",), (R("c", 50, -1),), 20),
    Rel("b"),
    M("add_", ("c", "a"), (0,), 5),
), 0, None, "hand")


def test_hand_log_no_eviction_peak_counts_views_once_and_mutations_as_new_storage():
    # during add_: a 8 + b 100 (kept by v) + old c 50 + new c 50 = 208; after it the old c is dropped
    rt = Runtime(None)
    replay.Replay(HAND, rt).run()
    assert rt.memory.peak == 208
    assert rt.memory.tracked == 158
    assert rt.drops == 1 and rt.evictions == 0
    assert replay.no_eviction_peak(HAND) == 208


def test_hand_log_under_budget_evicts_then_rematerializes_the_output_at_the_end():
    # at 160 B the add_ must evict b (v's storage; a and c are locked), and v is an output of the
    # iteration, so b is recomputed at the end: one rematerialization of f (10 ns of 36)
    out = replay.simulate(HAND, budget=160)
    assert out.status == "ok"
    assert (out.evictions, out.rematerializations) == (1, 1)
    assert out.overhead == pytest.approx(46 / 36)
    assert out.peak_bytes <= 160


def test_budget_below_constants_is_oom_with_the_numbers():
    out = replay.simulate(HAND, budget=4)
    assert out.status == "oom"
    assert "budget 4 B" in out.error and "constant a" in out.error


def test_thrash_stops_at_twice_the_op_time():
    lg = chains.linear_chain(200)
    out = replay.simulate(lg, "lru", budget=4)
    assert out.status == "thrash"
    assert 2.0 < out.overhead < 2.2  # stopped at the first recomputation past 2.0


def test_simulate_needs_exactly_one_of_ratio_and_budget():
    with pytest.raises(ValueError, match="exactly one of ratio"):
        replay.simulate(HAND)
    with pytest.raises(ValueError, match="ratio must be > 0"):
        replay.simulate(HAND, ratio=0)


def test_use_of_an_unknown_name_is_a_clear_error():
    bad = log.Log((C("f", ("ghost",), (R("b", 8, -1),), 1),), 0, None, "bad")
    with pytest.raises(KeyError, match="'ghost' is used but was never defined"):
        replay.no_eviction_peak(bad)


@pytest.mark.parametrize("n", [1000, 4000])
def test_dtr_theorem_linear_chain_budget_2_sqrt_n(n):
    # Kirisame et al.: on a unit-cost chain with O(sqrt(n)) memory, DTR recomputes O(n) ops in all
    lg = chains.linear_chain(n)
    out = replay.simulate(lg, budget=int(2 * math.sqrt(n)), thrash_at=None)
    assert out.status == "ok" and out.peak_bytes <= int(2 * math.sqrt(n))
    assert out.rematerializations > 0
    assert out.rematerializations / n < 1.5  # measured ~1.0 to 1.1 for n = 1,000 to 16,000


@pytest.mark.parametrize("n", [16, 100])
def test_sqrt_checkpointing_on_a_chain_recomputes_each_non_checkpoint_once(n):
    out = baselines.sqrt_checkpoint(chains.linear_chain(n))
    k = math.ceil(math.sqrt(n))
    assert out.rematerializations == n - n // k
    assert out.peak_bytes <= 2 * k + 2  # k checkpoints, one segment of k, the constant, a gradient
    assert out.overhead == pytest.approx((2 * n + n - n // k) / (2 * n))


# The DTR authors' union-find h_DTR results on these logs (shared/dtr-logs/README.md)
REFERENCE = {
    "resnet32-bs56": {0.2: 1.33, 0.3: 1.18, 0.4: 1.14, 0.5: 1.11, 0.7: 1.05, 0.9: 1.01},
    "transformer-bs10": {0.2: 1.54, 0.3: 1.12, 0.4: 1.09, 0.5: 1.06, 0.7: 1.03, 0.9: 1.01},
    "lstm-seq128": {0.2: 1.55, 0.3: 1.37, 0.4: 1.16, 0.5: 1.07, 0.7: 1.03, 0.9: 1.02},
}


@pytest.mark.skipif(not LOGS.is_dir(), reason="shared DTR logs not beside the checkout")
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_shared_logs_feasible_and_near_the_reference(name):
    lg = log.read(LOGS / f"{name}.log")
    peak = replay.no_eviction_peak(lg)
    for ratio, ref in REFERENCE[name].items():
        out = replay.simulate(lg, ratio=ratio, peak=peak)
        assert out.status == "ok", (ratio, out.status, out.error)
        assert out.peak_bytes <= out.budget
        assert round(out.overhead, 2) <= ref, (ratio, out.overhead, ref)  # the target: never worse
        if ratio <= 0.5:
            assert out.rematerializations > 0


def test_cli_simulate_json(tmp_path):
    path = write_chain_log(tmp_path / "chain.log", 50)
    p = subprocess.run([sys.executable, "-m", "torch_dtr.cli", "simulate", str(path), "--format", "json",
                        "--ratios", "0.3,1.0", "--policy", "dtr_eq", "--policy", "lru", "--baselines",
                        "--ilp-seconds", "1"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    grid = [r for r in rows if not r.get("baseline")]
    assert [(r["policy"], r["ratio"]) for r in grid] == [("dtr_eq", 0.3), ("dtr_eq", 1.0), ("lru", 0.3),
                                                         ("lru", 1.0)]
    assert all({"policy", "ratio", "status", "overhead"} <= set(r) for r in rows)
    assert grid[1]["overhead"] == 1.0 and grid[1]["evictions"] == 0
    assert [r["policy"] for r in rows if r.get("baseline")][-1].startswith("sqrt(n) checkpoints")
    assert [(r["policy"], r["ratio"]) for r in rows if r.get("baseline")][:2] == [("optimum (ILP)", 0.3),
                                                                                 ("optimum (ILP)", 1.0)]


def test_cli_simulate_rejects_a_malformed_log(tmp_path):
    path = tmp_path / "bad.log"
    path.write_text('{"INSTRUCTION": "CONSTANT", "NAME": "a"}\n{"INSTRUCTION": "CALL"}\n')
    p = subprocess.run([sys.executable, "-m", "torch_dtr.cli", "simulate", str(path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0
    assert "bad.log:2:" in p.stderr


@pytest.mark.skipif(not LOGS.is_dir(), reason="shared DTR logs not beside the checkout")
def test_dtr_chain_strictly_better_than_reference_at_low_budgets():
    # an earlier issue's target for the default of the time, dtr_chain: strictly better at ratios 0.2 and 0.3
    # on at least two of the three logs. The default is h_DTR^eq since 2026-11-25 (policies.py: dtr_chain is
    # worse than it in 49 of 240 cells of 24 logs); h_DTR^eq is only held to the reference (test above).
    wins = 0
    for name, refs in REFERENCE.items():
        lg = log.read(LOGS / f"{name}.log")
        peak = replay.no_eviction_peak(lg)
        outs = [replay.simulate(lg, "dtr_chain", ratio=r, peak=peak) for r in (0.2, 0.3)]
        wins += all(o.status == "ok" and round(o.overhead, 2) < refs[o.ratio] for o in outs)
    assert wins >= 2
