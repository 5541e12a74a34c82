"""An op's scratch memory under a budget on a device (NOTE [ Scratch memory ] in native/front.cpp): the bytes a
kernel holds besides its outputs while it runs (a 1x1 convolution on the CPU copies its input and weight into
another layout) are measured on the
simulated allocator per call signature and reserved with the outputs from the next call on, by the op and by its
recomputations. Each test runs plain first, then at the budget its name says (a share of plain's peak)."""

from __future__ import annotations

import gc

import pytest
import torch

import torch_dtr
from torch_dtr import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here")

BATCH, CHANNELS, SIDE, DEPTH, STEPS = 8, 64, 16, 12, 3


@pytest.fixture(autouse=True)
def _off():
    yield
    native.disable()
    gc.collect()


def _chain(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    h = x
    for w in weights:
        h = torch.tanh(torch.nn.functional.conv2d(h, w))
    return h.sum()


def _run(share: float | None, peak: int = 0) -> tuple[list[torch.Tensor], int, dict]:
    """One warm-up step (where every signature is first seen), then STEPS measured ones."""
    with torch_dtr.SimulatedDevice(expandable=True) as dev:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(BATCH, CHANNELS, SIDE, SIDE, generator=g)
        weights = [(torch.randn(CHANNELS, CHANNELS, 1, 1, generator=g) / CHANNELS**0.5).requires_grad_()
                   for _ in range(DEPTH)]
        budget = None if share is None else int(share * peak)
        if budget is not None:
            native.enable(budget=budget, device=dev)
        grads = []
        try:
            _chain(x, weights).backward()
            dev.reset_peak()
            for _ in range(STEPS):
                for w in weights:
                    w.grad = None
                _chain(x, weights).backward()
                grads += [w.grad.detach().clone() for w in weights]
            st = native.stats() if budget is not None else {}
        finally:
            native.disable()
        return grads, dev.max_allocated(), {"budget": budget, **({} if not st else {
            "evictions": st["evictions"], "remats": st["rematerializations"]})}


def test_scratch_memory_is_reserved_by_ops_and_recomputations_at_45_percent():
    plain_grads, plain_peak, _ = _run(None)
    before = native.load().counters()["scratch_cache"]
    grads, peak, st = _run(0.45, plain_peak)
    assert native.load().counters()["scratch_cache"] > before, "the convolutions' scratch memory was not measured"
    assert st["evictions"] > 0 and st["remats"] > 0, st
    assert peak <= st["budget"], f"the allocator held {peak - st['budget']} B more than the budget"
    for a, b in zip(grads, plain_grads, strict=True):
        assert torch.equal(a, b)
