"""FSDP2 (``fully_shard``) under torch-dtr on two CPU ranks (gloo), bitwise against the same program without
torch-dtr (NOTE [ Resharded parameters ]). Each run is a subprocess with a timeout: a hang fails the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
WORKER = Path(__file__).with_name("fsdp_worker.py")


def _run(mode: str, budget: int | None = None) -> list[dict]:
    cmd = [sys.executable, str(WORKER), mode] + ([str(budget)] if budget is not None else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain() -> list[dict]:
    return _run("plain")


def test_fsdp2_without_a_budget_is_bitwise_plain(plain: list[dict]) -> None:
    ours = _run("dtr")
    for a, b in zip(plain, ours, strict=True):
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"], (a, b)


def test_fsdp2_under_a_budget_is_bitwise_plain_and_held_on_every_rank(plain: list[dict]) -> None:
    free = _run("dtr")
    # a reshard pins what was computed from the unsharded parameters (NOTE [ Resharded parameters ] 2), so
    # this MLP's floor is near its peak: the budget is 1.05x the larger rank's single-op floor
    budget = int(1.05 * max(r["floor"] for r in free))
    assert budget < min(r["peak"] for r in free), "the budget must be below the peak for this test to mean much"
    ours = _run("dtr", budget)
    for a, b in zip(plain, ours, strict=True):
        assert "error" not in b, b["error"]
        assert a["losses"] == b["losses"] and a["digest"] == b["digest"], (a, b)
        assert b["peak"] <= budget and b["evictions"] > 0, b
