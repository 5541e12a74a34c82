"""Partition plans live (NOTE [ Partition plans live ]): an MLP on 2 and 4 CPU ranks (gloo) under the planner's
plan, with DTensor, each rank under torch-dtr at a budget below data parallelism's single-op floor (data
parallelism then raises BudgetError on every rank; checked on the default front end): the losses
equal one process's within floating-point tolerance (sums are split across ranks), every rank within its
budget, bitwise the same as the same plan without torch-dtr and across reruns. Each run is a subprocess with
a timeout; 4 ranks run on the default front end only (minutes on 2 cores). The bench's GPT-2 too, on 2 ranks.
Gradients go to their parameters' placements before each optimizer step (``dtp.reduce_grads``)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
WORKER = Path(__file__).with_name("dtp_worker.py")


def _run(world: int, mode: str, budget: int | None = None, plan: str = "dtp", model: str = "mlp",
         follow: str = "", diverge: bool = False) -> list[dict]:
    if mode in ("single", "plain"):  # without torch-dtr: the same for both front ends' cases, run once
        return json.loads(_without(world, mode, plan, model, follow, diverge))
    return _spawn(world, mode, budget, plan, model, follow, diverge)


@functools.cache
def _without(world: int, mode: str, plan: str, model: str, follow: str, diverge: bool) -> str:
    return json.dumps(_spawn(world, mode, None, plan, model, follow, diverge))


def _spawn(world: int, mode: str, budget: int | None, plan: str, model: str, follow: str = "",
           diverge: bool = False) -> list[dict]:
    cmd = [sys.executable, str(WORKER), str(world), mode] + ([str(budget), "-1"] if budget is not None else [])
    env = {**os.environ, "DTP_PLAN": plan, "DTP_MODEL": model, "DTP_FOLLOW": follow,
           "DTP_DIVERGE": "1" if diverge else ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("world", [2, 4])
def test_the_plan_trains_where_data_parallelism_cannot(world: int, dtr_front: str) -> None:
    if world == 4 and dtr_front == "python":
        pytest.skip("4 ranks run on the default front end only (the suite's time)")
    single = _run(world, "single")[0]["losses"]
    plain = _run(world, "plain")
    free = _run(world, "dtr")
    for a, b in zip(plain, free, strict=True):
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"]  # bitwise the plan without torch-dtr
        assert a["losses"] == pytest.approx(single, rel=1e-5)
    assert {r["plan"]["name"] for r in free} == {"dtp"} and len({json.dumps(r["plan"]) for r in free}) == 1
    assert any(p >= 0 for p in free[0]["plan"]["params"].values())  # some parameter is sharded
    floor, peak = max(r["floor_bytes"] for r in free), min(r["peak_bytes"] for r in free)
    budget = int(0.95 * peak)  # near the peak: under a budget, collectives' pinned outputs raise the floor
    if dtr_front == "default":  # (the Python front end, the fallback, counts DTensor's floors otherwise)
        dp_floor = min(r["floor_bytes"] for r in _run(world, "dtr", plan="dp"))  # all state whole on every rank
        assert floor < budget < dp_floor, (floor, peak, dp_floor)
        dp = _run(world, "dtr", budget, plan="dp")
        assert all("BudgetError" in r.get("error", "") for r in dp), dp
    runs = [_run(world, "dtr", budget) for _ in range(2 if world == 2 else 1)]
    for a, *bs in zip(plain, *runs, strict=True):
        for b in bs:
            assert "error" not in b, b["error"]
            assert b["peak_bytes"] <= budget and b["evictions"] > 0, b
            assert a["losses"] == b["losses"] and a["digest"] == b["digest"]


@pytest.mark.parametrize("world", [2, 4])
def test_the_bench_gpt2_trains_following_its_plan_within_a_budget(world: int, dtr_front: str) -> None:
    """The bench's GPT-2 (2 layers, width 128, 4 x 64 tokens, dropout off) on 2 and 4 ranks, its plan followed op
    by op, near its modelled peak without a budget and at 0.9-0.97 of it with one: bitwise as without torch-dtr,
    equal to one process within 1e-5."""
    if dtr_front == "python":
        pytest.skip("the default front end only (the suite's time)")
    single = _run(2, "single", model="gpt2")[0]["losses"]
    plain = _run(world, "plain", model="gpt2", follow="1")
    free = _run(world, "dtr", model="gpt2", follow="1")
    for a, b in zip(plain, free, strict=True):
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"]
        assert a["losses"] == pytest.approx(single, rel=1e-5)
        f = b["follow"]
        assert f["followed"] > 0 and f["off_plan"] <= f["kept"], f  # off the plan only where a write kept it
    # about the plan's memory, as modelled: one shard dimension turns into another by an all-to-all, not by
    # gathering the whole tensor (1.6x the modelled peak on 4 ranks that way). With the all-to-all most ranks peak
    # within 0.2% of the model, but when freed DTensors' shards go back varies from run to run: in 4 of 7 runs on
    # 4 ranks (2026-12-01) one rank peaked at 1.15-1.33x. So the lower median rank is held to the
    # model, and every rank below the gathering's 1.6x.
    peaks = sorted(b["peak_bytes"] / b["plan"]["modelled_peak"] for b in free)
    assert peaks[(len(peaks) - 1) // 2] <= 1.05 and peaks[-1] <= 1.5, peaks
    assert any(p >= 0 for p in free[0]["plan"]["params"].values())
    # 0.9 of the followed peak, or 0.97 of the modelled one where more: on 4 ranks the followed peak is within a few
    # percent of the model, and what a step needs varies from run to run with when freed DTensors' shards go back
    # (2026-12-01: 0.92 of the model, 4.03 MB, raised a BudgetError in 2 of 4 runs, asking for 4.09 MB; 0.97 trained
    # in 6 of 6, evicting on every rank; on 2 ranks, 3 of 3)
    budget = int(max(0.9 * min(r["peak_bytes"] for r in free), 0.97 * free[0]["plan"]["modelled_peak"]))
    for a, b in zip(plain, _run(world, "dtr", budget, model="gpt2", follow="1"), strict=True):
        assert "error" not in b, b["error"]
        assert b["peak_bytes"] <= budget and b["evictions"] > 0, b
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"]


def test_the_plan_is_followed_op_by_op_and_a_diverging_step_falls_back(dtr_front: str) -> None:
    """NOTE [ Partition plans live ] 3 on the MLP, 2 ranks: every op of the traced iteration runs in the plan's
    placements (DTensor's own choices leave it: counted below), the memory is the plan's, and a step whose
    batch is half the traced one's (it matches nothing) runs on DTensor's own choices, then the next step
    follows again; under torch-dtr at 0.95 of the followed peak, bitwise the same as without it, and on reruns."""
    if dtr_front == "python":
        pytest.skip("the default front end only (the suite's time)")
    single = _run(2, "single", diverge=True)[0]["losses"]
    plain = _run(2, "plain", follow="1", diverge=True)
    free = _run(2, "dtr", follow="1", diverge=True)
    for a, b in zip(plain, free, strict=True):
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"]
        assert a["losses"] == pytest.approx(single, rel=1e-5)
        f = b["follow"]
        assert f["off_plan"] == 0 and f["followed"] > 0 and f["converted"] > 0 and f["reduced"] > 0, f
        assert f["skipped"] > 0 and f["unmatched"] > 0, f  # the half batch's step matched nothing
        assert b["peak_bytes"] <= 1.05 * b["plan"]["modelled_peak"], b  # the plan's memory, as modelled
    budget = int(0.95 * min(r["peak_bytes"] for r in free))
    runs = [_run(2, "dtr", budget, follow="1", diverge=True) for _ in range(2)]
    for a, b, c in zip(plain, *runs, strict=True):
        for r in (b, c):
            assert "error" not in r, r["error"]
            assert r["peak_bytes"] <= budget and r["evictions"] > 0, r
            assert a["losses"] == r["losses"] and a["digest"] == r["digest"]
    observed = _run(2, "plain", follow="observe")  # DTensor's own choices from the plan's parameter placements
    assert all(r["follow"]["off_plan"] > 0 for r in observed), [r["follow"] for r in observed]


@pytest.mark.parametrize("world", [2, 4])
def test_one_shard_dimension_for_another_by_all_to_all_equals_dtensors_redistribute(world: int) -> None:
    """``dtp._all_to_all`` (the follower's Shard(a) -> Shard(b)) gives DTensor's own result, local shards bitwise,
    for every pair of dimensions of 2-4 dimensional tensors; plain and under torch-dtr at a budget that evicts."""
    out = _spawn(world, "alltoall", None, "dtp", "mlp")
    for r in out:
        assert "error" not in r, r["error"]
        assert r["checked"] >= 20 and r["mismatches"] == [], r
        assert r["evictions"] > 0, r
