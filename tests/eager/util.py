"""Helpers shared by the eager tests."""

import os

import torch

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor

# DTR_TEST_SWAP=1: every test runs with the host tier on (conftest.py); evicted values may then come back by
# their copies instead of their recipes, and some budgets that fail recomputing only train
SWAPPING = os.environ.get("DTR_TEST_SWAP") == "1"


def came_back(st) -> int:
    """Evicted values brought back, by recomputation or from the host tier (``torch_dtr.Stats``)."""
    return st.rematerializations + st.swaps_in


def evict_all() -> int:
    """Evict every storage the running session's runtime may evict (either front end); return how many."""
    from torch_dtr import native

    h = native.current()
    if h is not None and h.active:
        with native._core_locked(h.ext):
            h.flush()  # what the kernel queued
            return _evict_all(h.rt)
    return _evict_all(torch_dtr.eager.runtime())


def _evict_all(rt) -> int:
    n = 0
    for s in list(rt.candidates):
        if not s.locks:
            rt.evict(s)
            n += 1
    return n


def plain(x):
    """Plain clone of a (possibly managed) tensor, or a nested structure of them (does not pin)."""
    if isinstance(x, torch.Tensor):
        return torch_dtr.eager.peek(x).detach().clone() if type(x) is DTRTensor else x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(y) for y in x)
    return x
