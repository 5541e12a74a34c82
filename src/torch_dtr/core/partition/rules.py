"""Which placements each op can run in: its strategies, from its aten name and its tensors' shapes. No torch.

# NOTE [ Partition strategies ]
#
# 1. A strategy says what placement (NOTE [ Placements ]) each input must have, what placement each output
#    then has, and the share of the op's time each device spends (1/D when the work is split). Every op has
#    the replicated strategy first (all R, whole time): an op no rule below knows runs replicated.
# 2. Pointwise ops (a list of names) run sharded on any dimension d of their output that D divides: an
#    input with that dimension (aligned from the right, as broadcasting does) is sharded on it, one that
#    broadcasts along it is R. ``add``/``sub`` of partial sums stay partial, as do ``mul``/``div`` of one
#    partial input by replicated ones.
# 3. Views map a placement through: a reshape by grouping dimensions (sharding the outer dimension of a
#    merged group stays contiguous; a split dimension stays sharded on its outer part when D divides it), a
#    transpose or permute by matching sizes (only where the sizes say which dimension went where), an
#    expand by alignment from the right (and a replicated input expanded along a new dimension gives a
#    shard of it: each device expands to its part), a slice, select or split along one dimension keeps the others.
#    A partial tensor stays partial through any view.
# 4. Normalizations over the last dimension (softmax, layer norm, top-k) shard any other dimension; their
#    per-feature inputs (weights) are R, and outputs without the sharded dimension (weight gradients) P.
# 5. Matrix products: ``mm`` A[m,k] @ B[k,n]: (S0, R -> S0), (R, S1 -> S1), (S1, S0 -> P); ``bmm`` also
#    shards the batch; ``addmm``'s bias follows its output (a partial output takes a partial bias: the
#    bias on one device). Reductions over a sharded dimension give P (for a mean, partial means; for a
#    max, partial maxima: DTensor's Partial("avg") and Partial("max"), converted by one all-reduce just the
#    same). Embeddings shard their indices
#    (or the table's columns), convolutions and batch norms their batch (batch norm pays an all-reduce of
#    its statistics, as SyncBatchNorm does). ``ones_like`` and kin keep their input's shard.
# 6. In-place writes keep the written tensor's placement: a strategy fits an op only where it asks for
#    that placement (``Planner`` never picks another; evaluation charges a conversion both ways if it must).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .graph import P, Place, R

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Strategy:
    ins: tuple[Place, ...]
    outs: tuple[Place, ...]
    frac: float  # share of the op's time on each device
    sync: int = 0  # bytes all-reduced besides conversions (batch norm's statistics)


POINTWISE = frozenset("""
abs add addcdiv addcmul bitwise_and bitwise_not bitwise_or clamp clamp_min clamp_max clone copy cos div eq exp
fill ge gelu gelu_backward gt hardtanh hardtanh_backward le leaky_relu leaky_relu_backward lerp log log1p logical_and
logical_not lt masked_fill maximum minimum mul native_dropout native_dropout_backward ne neg pow reciprocal relu
rsqrt sigmoid sigmoid_backward sign silu silu_backward sin sqrt sub tanh tanh_backward threshold
threshold_backward where zero _to_copy lift_fresh_copy sgn rsub erf exp2 floor_divide remainder
""".split())
VIEWS = frozenset("""
view _unsafe_view reshape _reshape_alias t transpose permute expand unsqueeze squeeze detach alias select slice
split split_with_sizes chunk unbind narrow flatten unflatten view_as expand_as numpy_T as_strided diagonal
""".split())
LIKE = frozenset("ones_like zeros_like empty_like full_like new_zeros new_empty new_ones new_full".split())
CREATE = frozenset("zeros ones empty full arange scalar_tensor empty_strided rand randn randint".split())
LASTDIM = frozenset("""
_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data native_layer_norm
native_layer_norm_backward topk sort cumsum
""".split())
REDUCE = frozenset("sum mean amax amin max min".split())
LINEAR_P = frozenset("add sub".split())  # P op P -> P
SCALE_P = frozenset("mul div neg clone copy _to_copy detach alias".split())  # P scaled by R -> P


def base(name: str) -> str:
    """``addmm.default`` -> ``addmm``; ``add_.Tensor`` -> ``add``; ``_foreach_add_.List`` -> ``_foreach_add``."""
    b = name.split(".", 1)[0]
    if b.endswith("_") and not b.endswith("__"):
        b = b[:-1]
    return b


def strategies(name: str, ins: Sequence[Shape], outs: Sequence[Shape], views: Sequence[int],
               devices: int) -> list[Strategy]:
    """Every strategy of one op (NOTE [ Partition strategies ]), the replicated one first."""
    rep = Strategy((R,) * len(ins), (R,) * len(outs), 1.0)
    out: list[Strategy] = [rep]
    if devices < 2:
        return out
    b = base(name)
    rule = _RULES.get(b)
    if rule is None:
        if b.startswith("_foreach_"):
            rule = _foreach
        elif any(v >= 0 for v in views):
            rule = _view
        else:
            return out
    for s in rule(b, list(ins), list(outs), list(views), devices):
        if s != rep and s not in out:
            out.append(s)
    return out


def _split(n: int, d: int) -> bool:
    return n > 1 and n % d == 0


def _align(shape: Shape, out: Shape, d: int) -> Place:
    """The placement an input of ``shape`` needs when the output is sharded on ``d`` (broadcasting)."""
    k = d - (len(out) - len(shape))
    return k if k >= 0 and shape[k] == out[d] else R


def _pointwise(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if not outs:  # an in-place write: the written input (the first) has the shape
        if not ins:
            return []
        o = ins[0]
        res = [Strategy(tuple(_align(s, o, d) for s in ins), (), 1 / dv) for d in range(len(o)) if _split(o[d], dv)]
    else:
        o = outs[0]
        if any(len(x) != len(o) or x != o for x in outs[1:]):
            return []
        res = [Strategy(tuple(_align(s, o, d) for s in ins), (d,) * len(outs), 1 / dv)
               for d in range(len(o)) if _split(o[d], dv)]
    if b in LINEAR_P and ins:
        res.append(Strategy((P,) * len(ins), (P,) * len(outs), 1.0))
    if b in SCALE_P and ins:
        res.append(Strategy((P,) + (R,) * (len(ins) - 1), (P,) * len(outs), 1.0))
    return res


def _foreach(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    """A foreach op: every tensor of it sharded on dimension 0 where D divides it, else R."""
    pl = tuple(0 if s and _split(s[0], dv) else R for s in ins)
    if all(p == R for p in pl):
        return []
    outs_pl = tuple(0 if s and _split(s[0], dv) else R for s in outs)
    return [Strategy(pl, outs_pl, 1 / dv)]


def _like(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    """``ones_like`` and kin: each device's part has its input's shape, so a shard stays a shard; a partial
    input is whole on every device, its result replicated."""
    if len(outs) != 1 or len(ins) != 1:
        return []
    o = outs[0]
    return [Strategy((d,), (d,), 1 / dv) for d in range(len(o)) if _split(o[d], dv)] + [Strategy((P,), (R,), 1.0)]


def _create(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if ins or len(outs) != 1 or b.startswith("rand"):  # random numbers: each device would draw its own
        return []
    o = outs[0]
    return [Strategy((), (d,), 1 / dv) for d in range(len(o)) if _split(o[d], dv)]


def _groups(a: Shape, b: Shape) -> list[tuple[list[int], list[int]]] | None:
    """Pairs (dims of a, dims of b) whose products match, in order; size-1 dims left out. None if none fit."""
    ia = [i for i, s in enumerate(a) if s != 1]
    ib = [i for i, s in enumerate(b) if s != 1]
    res: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ia) or j < len(ib):
        if i >= len(ia) or j >= len(ib):
            return None
        ga, gb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= len(ia):
                    return None
                ga.append(ia[i])
                pa *= a[ia[i]]
                i += 1
            else:
                if j >= len(ib):
                    return None
                gb.append(ib[j])
                pb *= b[ib[j]]
                j += 1
        res.append((ga, gb))
    return res


def _view_map(b: str, src: Shape, dst: Shape, dv: int) -> dict[int, int]:
    """Input dimension -> output dimension for a shard that stays a shard through the view."""
    m: dict[int, int] = {}
    if b in ("t", "transpose", "permute", "numpy_T"):
        if len(src) == len(dst) and sorted(src) == sorted(dst):
            for i, s in enumerate(src):
                if src.count(s) == 1 and _split(s, dv):
                    m[i] = dst.index(s)
            if len(src) == 2 and b in ("t", "numpy_T", "transpose") and src[0] == src[1] and _split(src[0], dv):
                m = {0: 1, 1: 0}
        return m
    if b in ("expand", "expand_as"):
        k = len(dst) - len(src)
        return {i: i + k for i, s in enumerate(src) if s == dst[i + k] and _split(s, dv)}
    if b in ("select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "diagonal",
             "as_strided"):
        if b in ("as_strided", "diagonal"):
            return m
        if len(src) == len(dst):  # one dimension shortened: the others keep their shards
            changed = [i for i in range(len(src)) if src[i] != dst[i]]
            if len(changed) <= 1:
                m = {i: i for i in range(len(src)) if i not in changed and _split(src[i], dv)}
            return m
        if len(src) == len(dst) + 1:  # select / unbind: one dimension gone
            for gone in range(len(src)):
                if src[:gone] + src[gone + 1:] == dst:
                    return {i: (i if i < gone else i - 1) for i in range(len(src)) if i != gone and _split(src[i], dv)}
        return m
    g = _groups(src, dst)
    if g is None:
        return m
    for ga, gb in g:
        if _split(src[ga[0]], dv) and _split(dst[gb[0]], dv):
            m[ga[0]] = gb[0]
    return m


def _view(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    """Every output a view of input ``views[j]`` (the first, for ops that return several)."""
    if not ins or not outs or any(v < 0 for v in views):
        return []
    src = ins[views[0]]
    maps = [_view_map(b, ins[v], o, dv) for v, o in zip(views, outs, strict=True)]
    res = []
    for d in range(len(src)):
        if all(d in m for m in maps):
            pl = [R] * len(ins)
            pl[views[0]] = d
            res.append(Strategy(tuple(pl), tuple(m[d] for m in maps), 1.0))  # a view costs the same anywhere
    if b in ("expand", "expand_as") and len(outs) == 1:  # a dimension the input broadcasts along: shard the view
        o = outs[0]
        k = len(o) - len(src)
        for d in range(len(o)):
            if _split(o[d], dv) and (d < k or src[d - k] == 1):
                res.append(Strategy((R,) * len(ins), (d,), 1.0))
    pl = [R] * len(ins)
    pl[views[0]] = P
    res.append(Strategy(tuple(pl), (P,) * len(outs), 1.0))
    return res


def _lastdim(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if not ins:
        return []
    main = max(ins, key=len)
    res = []
    for d in range(len(main) - 1):
        if not _split(main[d], dv):
            continue
        pi = tuple(d if len(s) == len(main) and s[d] == main[d] else R for s in ins)
        po = tuple(d if len(s) == len(main) and s[d] == main[d] else P for s in outs)
        res.append(Strategy(pi, po, 1 / dv))
    return res


def _mm(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    bias = b in ("addmm", "baddbmm", "addbmm")
    a, w = (ins[1], ins[2]) if bias else (ins[0], ins[1]) if len(ins) >= 2 else ((), ())
    if len(outs) != 1 or len(a) not in (2, 3) or len(w) != len(a):
        return []
    o = outs[0]
    k = len(a) - 2  # 1 for bmm: dimension 0 is the batch
    cases: list[tuple[Place, Place, Place]] = []  # (a, w, out)
    if k and _split(a[0], dv):
        cases.append((0, 0, 0))
    if _split(a[k], dv):
        cases.append((k, R, k))
    if _split(w[k + 1], dv):
        cases.append((R, k + 1, k + 1))
    if _split(a[k + 1], dv):
        cases.append((k + 1, k, P))
    res = []
    for pa, pw, po in cases:
        if bias:
            bs = ins[0]
            pb = P if po == P else _align(bs, o, po) if bs else R
            res.append(Strategy((pb, pa, pw), (po,), 1 / dv))
        else:
            res.append(Strategy((pa, pw) + (R,) * (len(ins) - 2), (po,), 1 / dv))
    return res


def _reduce(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if not ins or not outs:
        return []
    s, o = ins[0], outs[0]
    keep = len(o) == len(s)
    res = []
    for d in range(len(s)):
        if not _split(s[d], dv):
            continue
        if keep:
            po: Place = d if o[d] == s[d] else P
        else:
            kept = _kept(s, o)
            po = P if kept is None or d not in kept else kept[d]
        res.append(Strategy((d,) + (R,) * (len(ins) - 1), (po,) * len(outs), 1 / dv))
    if b == "sum":
        res.append(Strategy((P,) + (R,) * (len(ins) - 1), (P,) * len(outs), 1.0))
    return res


def _kept(s: Shape, o: Shape) -> dict[int, int] | None:
    """Dimensions of ``s`` that survive in ``o`` (a reduction without keepdim), by greedy alignment."""
    m: dict[int, int] = {}
    j = 0
    for i, n in enumerate(s):
        if j < len(o) and o[j] == n and len(s) - i - 1 >= len(o) - j - 1:
            m[i] = j
            j += 1
    return m if j == len(o) else None


def _embedding(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if len(ins) < 2 or len(outs) != 1:
        return []
    w, idx, o = ins[0], ins[1], outs[0]
    res = [Strategy((R, d) + (R,) * (len(ins) - 2), (d,), 1 / dv) for d in range(len(idx)) if _split(idx[d], dv)]
    if len(w) == 2 and _split(w[1], dv):
        res.append(Strategy((1, R) + (R,) * (len(ins) - 2), (len(o) - 1,), 1 / dv))
    return res


def _embedding_bw(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    if len(ins) < 2 or len(outs) != 1:
        return []
    g, idx = ins[0], ins[1]
    res = [Strategy((d, d) + (R,) * (len(ins) - 2), (P,), 1 / dv) for d in range(len(idx)) if _split(idx[d], dv)]
    if _split(g[-1], dv):
        res.append(Strategy((len(g) - 1, R) + (R,) * (len(ins) - 2), (1,), 1 / dv))
    return res


def _batch(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    """Convolutions and batch norms: the batch (dimension 0 of the 4-D inputs) sharded; the rest R, or P
    for what sums over the batch (weight gradients); batch norm all-reduces its statistics."""
    if not ins or not outs:
        return []
    n = max(len(s) for s in ins)
    bt = next(s[0] for s in ins if len(s) == n)
    if n < 3 or not _split(bt, dv):
        return []
    pi = tuple(0 if len(s) == n and s[0] == bt else R for s in ins)
    norm = "norm" in b
    po = tuple(0 if len(s) == n and s[0] == bt else (R if norm else P) for s in outs)
    sync = sum(4 * (s[0] if s else 1) for s in outs if len(s) != n) * 2 if norm else 0
    return [Strategy(pi, po, 1 / dv, sync)]


def _nll(b: str, ins: list[Shape], outs: list[Shape], views: list[int], dv: int) -> list[Strategy]:
    """The batch sharded; the forward's loss and total weight partial, the backward's gradient sharded."""
    x = ins[0] if b == "nll_loss_forward" else ins[1] if len(ins) > 1 else ()
    if len(ins) < 2 or not x or not _split(x[0], dv):
        return []
    n = x[0]
    if b == "nll_loss_forward":
        return [Strategy(tuple(0 if s and s[0] == n else R for s in ins), (P,) * len(outs), 1 / dv)]
    pi = tuple(0 if i > 0 and s and s[0] == n else R for i, s in enumerate(ins))  # ins[0]: the loss's gradient
    return [Strategy(pi, (0,) * len(outs), 1 / dv)]


_RULES = {b: _pointwise for b in POINTWISE}
_RULES.update({b: _view for b in VIEWS})
_RULES.update({b: _like for b in LIKE})
_RULES.update({b: _create for b in CREATE})
_RULES.update({b: _lastdim for b in LASTDIM})
_RULES.update({b: _reduce for b in REDUCE})
_RULES.update({b: _mm for b in ("mm", "addmm", "bmm", "baddbmm")})
_RULES.update({"embedding": _embedding, "embedding_dense_backward": _embedding_bw})
_RULES.update({b: _batch for b in ("convolution", "convolution_backward", "native_batch_norm",
                                    "native_batch_norm_backward", "_native_batch_norm_legit",
                                    "_native_batch_norm_legit_functional", "cudnn_batch_norm",
                                    "cudnn_batch_norm_backward", "max_pool2d_with_indices",
                                    "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
                                    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward")})
_RULES.update({b: _nll for b in ("nll_loss_forward", "nll_loss_backward")})
