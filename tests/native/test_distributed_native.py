"""The native front end under torch.distributed on two CPU ranks (gloo): FSDP2, DDP and tensor parallelism, each
bitwise against the same program without torch-dtr, with no budget and under one, on every rank (the worker of
tests/eager/test_distributed.py, ``native`` mode). c10d's collectives have PrivateUse1 kernels of their own, which
the thread's PrivateUse1 bit selected: every program failed with "No backend type associated with device type
privateuseone" before the kernel took them over (front.cpp, ``claim``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from torch_dtr import native

pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
              pytest.mark.skipif(not native.available(), reason="the native front end does not build here")]
WORKER = Path(__file__).parents[1] / "eager" / "dist_worker.py"


def _run(program: str, mode: str, budget: int | None = None) -> list[dict]:
    cmd = [sys.executable, str(WORKER), program, mode] + ([str(budget)] if budget is not None else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for r in out:
        assert "error" not in r, r
    return out


@pytest.mark.parametrize("program", ("fsdp", "ddp", "tp"))
def test_native_is_bitwise_plain_on_every_rank_without_and_with_a_budget_between_floor_and_peak(program: str):
    plain = _run(program, "plain")
    free = _run(program, "native")
    for a, b in zip(plain, free, strict=True):
        assert (a["losses"], a["digest"]) == (b["losses"], b["digest"]), (a, b)
    # as test_distributed.py: collectives' outputs are pinned, so the budget is halfway between the larger rank's
    # single-op floor and the smaller rank's peak
    floor, peak = max(r["floor"] for r in free), min(r["peak"] for r in free)
    budget = (floor + peak) // 2
    assert floor < budget < peak, (floor, peak)
    ours = _run(program, "native", budget)
    for a, b in zip(plain, ours, strict=True):
        assert (a["losses"], a["digest"]) == (b["losses"], b["digest"]), (a, b)
    for r in ours:
        assert r["peak"] <= budget and r["evictions"] > 0, r


@pytest.mark.parametrize("program", ("fsdp", "ddp"))
def test_native_with_the_host_tier_trains_at_half_its_peak_bitwise_on_every_rank(program: str):
    # as test_distributed.py's host-tier test: what FSDP2's reshards pin goes to host memory instead
    plain = _run(program, "plain")
    free = _run(program, "native_swap")
    floor, peak = max(r["floor"] for r in free), min(r["peak"] for r in free)
    budget = max(peak // 2, int(1.25 * floor))
    assert budget < 0.55 * peak, (budget, floor, peak)
    ours = _run(program, "native_swap", budget)
    for a, b in zip(plain, ours, strict=True):
        assert (a["losses"], a["digest"]) == (b["losses"], b["digest"]), (a, b)
    for r in ours:
        assert r["peak"] <= budget and r["evictions"] > 0 and r["swaps_out"] > 0 and r["swaps_in"] > 0, r
