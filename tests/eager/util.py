"""Helpers shared by the eager tests."""

import torch

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor


def evict_all() -> int:
    """Evict every storage the runtime may evict; return how many were evicted."""
    rt = torch_dtr.eager.runtime()
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
