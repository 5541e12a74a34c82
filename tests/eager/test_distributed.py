"""torch-dtr under torch.distributed on two CPU ranks (gloo): FSDP2 (``fully_shard``), DDP and tensor
parallelism (DTensor), each bitwise against the same program without torch-dtr, with no budget and under one
(NOTE [ Resharded parameters ], NOTE [ Managed vs constant ] 7). Each run is a subprocess with a timeout, so a
hang fails the test instead of blocking the suite."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from torch_dtr import native

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
WORKER = Path(__file__).with_name("dist_worker.py")
PROGRAMS = ("fsdp", "ddp", "tp")


@functools.cache
def _plain(program: str) -> str:
    """Plain PyTorch's run of a program, the same for both front ends' cases: run once (a 2-rank spawn is ~5 s)."""
    return json.dumps(_spawn(program, "plain"))


def _run(program: str, mode: str, budget: int | None = None) -> list[dict]:
    return json.loads(_plain(program)) if mode == "plain" else _spawn(program, mode, budget)


def _spawn(program: str, mode: str, budget: int | None = None) -> list[dict]:
    cmd = [sys.executable, str(WORKER), program, mode] + ([str(budget)] if budget is not None else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _same(plain: list[dict], ours: list[dict]) -> None:
    """Bitwise on every rank, and (under torch-dtr) on the front end the test runs: under "default" the compiled
    one where it builds, so these tests are the compiled front end's distributed tests too."""
    want = "python" if os.environ.get("TORCH_DTR_FRONT") == "python" or not native.available() else "native"
    for a, b in zip(plain, ours, strict=True):
        assert b["front"] == want, (b["front"], want)
        assert "error" not in a, a["error"]
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"], (a, b)


@pytest.mark.parametrize("program", PROGRAMS)
def test_bitwise_plain_without_and_with_a_budget_held_on_every_rank(program: str) -> None:
    plain = _run(program, "plain")
    free = _run(program, "dtr")
    _same(plain, free)
    # FSDP2's reshards pin what was computed from the freed parameters and collectives' outputs are pinned
    # (never replayed on one rank), so these small programs' floors are near their peaks: the budget is
    # halfway between the larger rank's single-op floor and the smaller rank's peak
    floor, peak = max(r["floor"] for r in free), min(r["peak"] for r in free)
    budget = (floor + peak) // 2
    assert floor < budget < peak, (floor, peak)
    ours = _run(program, "dtr", budget)
    _same(plain, ours)
    for r in ours:
        assert r["peak"] <= budget and r["evictions"] > 0, r


def test_fsdp2_keeping_parameters_unsharded_until_backward_trains_at_half_its_peak() -> None:
    # reshard_after_forward=False: no reshard between a layer's forward and its backward, so nothing is pinned
    # for it (NOTE [ Resharded parameters ] 5) and the budget can go far below the peak
    plain = _run("fsdp_keep", "plain")
    free = _run("fsdp_keep", "dtr")
    _same(plain, free)
    floor, peak = max(r["floor"] for r in free), min(r["peak"] for r in free)
    budget = max(peak // 2, int(1.25 * floor))
    assert budget < 0.55 * peak, (budget, floor, peak)
    ours = _run("fsdp_keep", "dtr", budget)
    _same(plain, ours)
    for r in ours:
        assert r["peak"] <= budget and r["remats"] > 0, r


@pytest.mark.parametrize("program", ("fsdp", "ddp"))
def test_with_the_host_tier_trains_at_half_its_peak_copying_what_cannot_be_recomputed(program: str) -> None:
    # FSDP2's default resharding pins each parameter op's output from its forward to its backward (most of the
    # peak cannot be evicted: docs/distributed.json); with swap=True those values are copied to host memory
    # instead (NOTE [ Swapping ] 9)
    plain = _run(program, "plain")
    free = _run(program, "dtr_swap")
    _same(plain, free)
    floor, peak = max(r["floor"] for r in free), min(r["peak"] for r in free)
    budget = max(peak // 2, int(1.25 * floor))
    assert budget < 0.55 * peak, (budget, floor, peak)
    ours = _run(program, "dtr_swap", budget)
    _same(plain, ours)
    for r in ours:
        assert r["peak"] <= budget and r["evictions"] > 0, r
        if program == "fsdp" or r["front"] == "native":  # what the reshards pinned went to the host tier
            assert r["swaps_out"] > 0 and r["swaps_in"] > 0, r
