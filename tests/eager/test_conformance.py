"""Conformance on PyTorch's operator database, a deterministic subset: the first float32 sample of every
operator that supports float32 on CPU, in both modes (nothing evicted; everything evicted after every op),
bitwise against plain PyTorch. The full run (every sample, float32/float64/complex64) is
``python benchmarks/conformance.py``, which writes docs/conformance.md."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest")
import conformance  # noqa: E402

# deprecated operators in op_db warn when run; those warnings are PyTorch's, not the test's outcome
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Known failures, each with the reason; strict, so that a fix is noticed and the entry removed.
KNOWN: dict[str, str] = {}

OPS = conformance.ops_for(torch.float32)


@pytest.mark.parametrize("op", OPS, ids=[conformance.name(o) for o in OPS])
def test_first_sample_bitwise_in_both_modes(op):
    name = conformance.name(op)
    if name in KNOWN:
        pytest.xfail(KNOWN[name])
    bad = []
    for _, sample in conformance.samples(op, torch.float32, 1):
        for mode in conformance.MODES:
            status, detail = conformance.check(op, sample, mode)
            if status in ("differs", "raises"):
                bad.append(f"{mode}: {status}: {detail}")
    assert not bad, "; ".join(bad)
