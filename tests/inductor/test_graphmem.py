"""graphmem (NOTE [ Compiled regions under a budget ] 2): the bytes a compiled region's graphs hold, as inductor runs
them, on graphs traced with fake tensors (the meta values the partitioner's graphs carry)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_dtr.inductor.graphmem import graph_bytes

MiB = 1 << 20


def _graph(f, *shapes):
    return make_fx(f, tracing_mode="fake")(*(torch.empty(s) for s in shapes))


def test_a_pointwise_kernel_writes_in_place_of_a_same_sized_input_that_dies_there():
    # mm -> sin: the product dies at sin, which inductor computes into its buffer (4 MiB each): 4 MiB at once
    g = _graph(lambda x, w: (x @ w).sin(), (1024, 1024), (1024, 1024))
    assert graph_bytes(g).peak == 4 * MiB
    # the product read again later (by the output) does not die at sin: both at once
    g = _graph(lambda x, w: ((x @ w).sin(), x @ w), (1024, 1024), (1024, 1024))
    assert graph_bytes(g).peak >= 8 * MiB
    # an output of another size cannot take the input's buffer: the sum (4 MiB) and the product (16 MiB, 2048
    # columns) at once
    g = _graph(lambda x, w: (x @ w).sum(1, keepdim=True).expand(1024, 2048) + 0, (1024, 1024), (1024, 2048))
    assert graph_bytes(g).peak >= 8 * MiB + 4 * 1024


def test_a_given_input_that_dies_at_a_pointwise_kernel_lends_it_its_buffer():
    # a backward's saved value, handed over (``given``) and dying at the kernel that reads it last
    g = _graph(lambda a: a * 2, (1024, 1024))
    a = next(iter(g.graph.find_nodes(op="placeholder")))
    key = a.meta["val"].untyped_storage()._cdata
    assert graph_bytes(g, {key: 4 * MiB}).peak == 4 * MiB  # a * 2 in a's place
    assert graph_bytes(g).peak == 4 * MiB  # (not given: the caller's, never counted)
