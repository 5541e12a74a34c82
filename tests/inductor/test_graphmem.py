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


def test_a_pointwise_value_read_by_several_pointwise_ops_is_inlined_into_them_as_inductor_does():
    # x * 2, read by two reductions and nothing else: inductor computes it inside each (no buffer); only the two
    # row sums (4 KiB each) are written
    g = _graph(lambda x: (lambda a: (a + 1).sum(1) + (a * 3).sum(1))(x * 2), (1024, 1024))
    assert graph_bytes(g).peak < MiB
    # on the CPU inductor writes a value read more than once when it holds a heavy op (exp, log, tanh, sigmoid):
    # 4 MiB
    g = _graph(lambda x: (x.exp() + 1).sum(1) + (x.exp() * 3).sum(1), (1024, 1024))
    e = _graph(lambda x: (lambda a: (a + 1).sum(1) + (a * 3).sum(1))(x.exp()), (1024, 1024))
    assert graph_bytes(g).peak < MiB  # two separate exps: each read once, inlined
    assert graph_bytes(e).peak >= 4 * MiB
    # or when its expression reads more than four buffers
    five = _graph(lambda a, b, c, d, x: (lambda s: (s + 1).sum(1) + (s * 3).sum(1))(a + b + c + d + x),
                  *[(1024, 1024)] * 5)
    four = _graph(lambda a, b, c, d: (lambda s: (s + 1).sum(1) + (s * 3).sum(1))(a + b + c + d),
                  *[(1024, 1024)] * 4)
    assert graph_bytes(five).peak >= 4 * MiB
    assert graph_bytes(four).peak < MiB


def test_what_an_inlined_value_reads_lives_on_to_its_last_reader():
    # y = x @ w (4 MiB); a quarter of it times 2 is inlined into its two readers, the second after z = x @ w2
    # (4 MiB): y lives until then, so y and z are alive at once (were it written, y would die at it: 5 MiB)
    def f(x, w, w2):
        a = (x @ w)[:, :256] * 2
        s1 = a.sum(1)
        z = x @ w2
        return s1 + (a * z[:, :256]).sum(1)

    assert graph_bytes(_graph(f, (1024, 1024), (1024, 1024), (1024, 1024))).peak >= 8 * MiB
