"""Every strategy the partition rules give (NOTE [ Partition strategies ]) computes what the op computes: each
of D simulated devices runs the op on its part of the inputs, and the parts put together under the
strategy's output placements equal the op run whole."""

from __future__ import annotations

import pytest
import torch

from torch_dtr.core.partition import ANY, Link, P, R, show, strategies

D = 2


def part(x: torch.Tensor, p: int, i: int) -> torch.Tensor:
    if p in (R, ANY):
        return x
    if p == P:
        return x if i == 0 else torch.zeros_like(x)
    return x.chunk(D, dim=p)[i]


def whole(parts: list[torch.Tensor], p: int, how: str) -> torch.Tensor:
    if p == R:
        for q in parts[1:]:
            torch.testing.assert_close(q, parts[0])
        return parts[0]
    if p == P:
        s = torch.stack(parts)
        return {"sum": s.sum(0), "mean": s.mean(0), "max": s.amax(0)}[how]
    return torch.cat(parts, dim=p)


CASES = {  # name -> (function, inputs, how a partial result combines, outputs alias input index or -1)
    "mm.default": (torch.mm, [(8, 4), (4, 6)], "sum", [-1]),
    "addmm.default": (torch.addmm, [(6,), (8, 4), (4, 6)], "sum", [-1]),
    "bmm.default": (torch.bmm, [(4, 6, 8), (4, 8, 2)], "sum", [-1]),
    "add.Tensor": (torch.add, [(8, 6), (6,)], "sum", [-1]),
    "mul.Tensor": (torch.mul, [(4, 1, 6), (2, 6)], "sum", [-1]),
    "relu.default": (torch.relu, [(8, 6)], "sum", [-1]),
    "sum.dim_IntList": (lambda x: x.sum(1), [(4, 6, 2)], "sum", [-1]),
    "sum.default": (lambda x: x.sum(), [(4, 6)], "sum", [-1]),
    "mean.default": (lambda x: x.mean(), [(4, 6)], "mean", [-1]),
    "amax.default": (lambda x: x.amax(-1), [(4, 6)], "max", [-1]),
    "_softmax.default": (lambda x: torch.softmax(x, -1), [(4, 2, 6)], "sum", [-1]),
    "view.default": (lambda x: x.reshape(8, 6), [(2, 4, 6)], "sum", [0]),
    "view.default ": (lambda x: x.reshape(2, 4, 3, 2), [(8, 6)], "sum", [0]),
    "t.default": (lambda x: x.t(), [(4, 6)], "sum", [0]),
    "transpose.int": (lambda x: x.transpose(1, 2), [(2, 4, 6)], "sum", [0]),
    "permute.default": (lambda x: x.permute(2, 0, 1), [(2, 4, 6)], "sum", [0]),
    "expand.default": (lambda x: x.expand(4, 2, 6), [(2, 6)], "sum", [0]),
    "expand.default ": (lambda x: x.expand(4, 6), [()], "sum", [0]),
    "select.int": (lambda x: x.select(1, 1), [(4, 6, 2)], "sum", [0]),
    "slice.Tensor": (lambda x: x[:, 1:3], [(4, 6)], "sum", [0]),
    "split.Tensor": (lambda x: x.split(2, dim=2), [(4, 2, 6)], "sum", [0, 0, 0]),
    "ones_like.default": (torch.ones_like, [(4, 6)], "sum", [-1]),
    "embedding.default": (lambda w, i: torch.nn.functional.embedding(i, w), [(10, 6), "idx"], "sum", [-1]),
    "embedding_dense_backward.default": (lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 10, -1, False),
                                         [(4, 6, 4), "idx"], "sum", [-1]),
    "native_layer_norm.default": (lambda x, w, b: torch.ops.aten.native_layer_norm(x, [6], w, b, 1e-5),
                                  [(4, 2, 6), (6,), (6,)], "sum", [-1, -1, -1]),
    "convolution.default": (lambda x, w: torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                                    [0, 0], 1), [(4, 3, 5, 5), (2, 3, 3, 3)], "sum",
                            [-1]),
    "threshold_backward.default": (lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0), [(4, 6), (4, 6)],
                                   "sum", [-1]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_strategy_computes_the_op(name: str) -> None:
    fn, shapes, how, views = CASES[name]
    g = torch.Generator().manual_seed(0)
    ins = [torch.randint(0, 10, (4, 6), generator=g) if s == "idx"
           else torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    out = fn(*ins)
    outs = list(out) if isinstance(out, tuple) else [out]
    ss = strategies(name.strip(), [tuple(x.shape) for x in ins], [tuple(o.shape) for o in outs], views, D)
    assert ss[0].ins == (R,) * len(ins) and ss[0].frac == 1.0  # the replicated strategy first
    assert len(ss) > 1, f"{name}: no strategy but the replicated one"
    for s in ss:
        f = fn
        if name.startswith(("view", "expand")):  # each device makes its part of the output's shape
            shape = [n // D if d == s.outs[0] else n for d, n in enumerate(outs[0].shape)]
            f = (lambda x, shape=shape: x.reshape(shape)) if name.startswith("view") else \
                (lambda x, shape=shape: x.expand(shape))
        res = [f(*[part(x, p, i) for x, p in zip(ins, s.ins, strict=True)]) for i in range(D)]
        res = [list(r) if isinstance(r, tuple) else [r] for r in res]
        for j, p in enumerate(s.outs):
            got = whole([r[j] for r in res], p, how)
            torch.testing.assert_close(got, outs[j], msg=lambda m, s=s: f"{name} {[show(p) for p in s.ins]} -> "
                                       f"{[show(p) for p in s.outs]}: {m}")


def test_matrix_products_have_the_megatron_strategies() -> None:
    ss = strategies("mm.default", [(8, 4), (4, 6)], [(8, 6)], [-1], D)
    assert {(s.ins, s.outs) for s in ss} == {((R, R), (R,)), ((0, R), (0,)), ((R, 1), (1,)), ((1, 0), (P,))}
    assert all(s.frac == 1 / D for s in ss[1:])
    # a dimension D does not divide is never sharded
    assert [s.outs for s in strategies("relu.default", [(3, 5)], [(3, 5)], [-1], D)] == [(R,)]


def test_collective_costs() -> None:
    link = Link(4, 1e9, alpha=1e-5)
    n = 4_000_000
    assert link.kind(0, R) == "all_gather" and link.cost(0, R, n) == pytest.approx(1e-5 + 0.75 * n / 1e9)
    assert link.kind(P, R) == "all_reduce" and link.cost(P, R, n) == pytest.approx(2 * (1e-5 + 0.75 * n / 1e9))
    assert link.kind(P, 1) == "reduce_scatter" and link.cost(P, 1, n) == pytest.approx(1e-5 + 0.75 * n / 1e9)
    assert link.kind(0, 1) == "all_to_all" and link.cost(0, 1, n) == pytest.approx(1e-5 + 0.75 * n / 4 / 1e9)
    assert link.cost(R, 0, n) == link.cost(R, P, n) == link.cost(0, ANY, n) == 0.0
    assert Link(1, 1e9).cost(0, R, n) == 0.0
    with pytest.raises(ValueError, match="at least 1 device"):
        Link(0, 1e9)
