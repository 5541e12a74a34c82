"""How many bytes an op's fresh outputs will take, known before it runs (the budget is kept by reserving them).

# NOTE [ Size prediction ]
#
# 1. Shapes come from the op's own shape rules: the op runs on meta tensors (no data, no compute), once per
#    distinct call signature (cached).
# 2. A meta kernel that rejects a dtype the real kernel accepts (``_grouped_mm`` with float32 on CPU, used
#    by mixture-of-experts models) runs again with its floating inputs as bfloat16; the bytes of floating
#    outputs are then counted at the widest floating input's size.
# 3. Ops whose output size depends on the data (``bincount``, ``nonzero``, ``masked_select``, ``unique``...)
#    have a rule here that reads the inputs (resident and locked when it runs): the exact size, or a bound
#    that is never below it.
# 4. What neither 1, 2 nor 3 can size is reserved as 0 bytes: the op runs, and the runtime evicts right after
#    it to fit its output (the budget may be exceeded by that output while the op returns). Such ops are
#    counted in ``unsized`` (``Front.sizes.unsized``) and warned about once each. Found by the zoo test:
#    ``_ctc_loss`` (wav2vec2), now a rule of 3.
# 5. A meta kernel that runs but is wrong is worse than none: ``mkldnn_rnn_layer`` (``nn.LSTM`` on CPU) says
#    its workspace is empty, and the zoo's LSTM went 277 KiB over a 942 KiB budget. It has a rule (3): an
#    upper bound, 1.6x a fit of measured workspaces (the fit alone was up to 1.53x short on some shapes).
# 6. Such an upper bound costs memory near the floor (the zoo's nn.LSTM could not run at 1.25x its floor,
#    the bound being 1.7x the real workspace). So an op whose rule is a bound (``FuncInfo.learns_size``)
#    has its real output bytes learned after every call, budget or not (``learn``), keyed by its inputs'
#    shapes, strides, dtypes and other arguments: from the second call per shape on, it is predicted exactly.
# 7. A ``device`` keyword runs as ``meta``: ``_to_copy(x, dtype=..., device=cpu)`` (autocast's casts, ``.to``)
#    on a meta input otherwise asks for a copy out of meta and fails, and went unsized (found by
#    tests/eager/test_programs.py's autocast program).
# 8. CPU loss kernels that reduce in place: ``mse_loss``, ``smooth_l1_loss``, ``binary_cross_entropy`` and
#    ``soft_margin_loss`` with a mean or sum return a 0-dim tensor whose storage is the whole elementwise
#    buffer; their meta kernels say 4 bytes, so a budget was exceeded by that buffer (found by the VAE of
#    tests/eager/test_programs.py: peak 277,340 B over a 268,346 B budget). They have a rule (3): the
#    elementwise size, an upper bound learned exactly from the second call per shape on (6).
# 9. Any other op whose outputs outgrow the prediction while the budget is exceeded (found by
#    tests/eager/test_size_conformance.py over op_db: ``col2im``, ``im2col``, ``_embedding_bag``) has its real
#    size stored under its call signature in the cache, so only its first call per signature can exceed the
#    budget, and is warned about once (``Sizes.short``). The runtime evicts right after such an op either way.
# 10. Rule 4's "nothing could size it" is remembered per call signature, not per op: ``index.Tensor`` with a
#    boolean mask has no meta size, with integer indices it has one; marking the op once for all (as before)
#    left every later integer indexing unsized, which the zoo's whisper model hit at 50% of its peak after
#    tests/eager/test_size_conformance.py had run a masked sample in the same process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .funcinfo import FuncInfo, info
from .recipe import flat_outputs

_CACHE: dict[Any, int] = {}  # shared by every session: enabling again does not pay meta inference again
_LEARNED: dict[Any, int] = {}  # NOTE 6: the real bytes of ops whose rule is a bound, per call key
_CACHE_MAX = 20_000
_LOW = torch.bfloat16
_META = torch.device("meta")
_UNSIZED = -1  # cached for a call signature that nothing could size (rule 4)


def _key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        try:
            return (x.shape, x.stride(), x.dtype, x.device)
        except RuntimeError:  # sparse layouts have no strides (ops on them are sized on a device too)
            return (x.shape, x.layout, x.dtype, x.device, _nnz(x))
    t = type(x)
    if t is list or t is tuple:
        return tuple([y if type(y) is int else _key(y) for y in x])
    return x


def _nnz(x: torch.Tensor) -> int | None:
    try:
        return x._nnz()
    except RuntimeError:
        return None


def _call_key(fi: FuncInfo, args: tuple, kwargs: dict) -> Any:
    # ``fi`` stands for its operator: one per OpOverload for good (``funcinfo.info``), hashed by identity in C
    # where the OpOverload's own ``__hash__`` is Python code
    return (fi, _key(args), tuple((k, _key(v)) for k, v in kwargs.items())) if kwargs else (fi, _key(args))


def _to_meta(x: Any, low: bool = False) -> Any:
    if isinstance(x, torch.Tensor):
        dtype = _LOW if low and x.dtype.is_floating_point else x.dtype
        return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device="meta")
    if type(x) is list or type(x) is tuple:
        return type(x)(_to_meta(y, low) for y in x)
    return x


def _floats(x: Any) -> list[int]:
    if isinstance(x, torch.Tensor):
        return [x.element_size()] if x.dtype.is_floating_point else []
    if type(x) is list or type(x) is tuple:
        return [n for y in x for n in _floats(y)]
    return []


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    return args[pos] if pos < len(args) else kwargs.get(name, default)


def _bincount(args: tuple, kwargs: dict) -> int:
    x, weights, minlength = args[0], _arg(args, kwargs, 1, "weights"), _arg(args, kwargs, 2, "minlength", 0)
    n = max(int(x.max()) + 1 if x.numel() else 0, minlength)
    return n * (weights.element_size() if weights is not None and weights.dtype.is_floating_point else 8)


def _nonzero(args: tuple, kwargs: dict) -> int:
    x = args[0]
    return int(torch.count_nonzero(x)) * max(x.dim(), 1) * 8


def _masked_select(args: tuple, kwargs: dict) -> int:
    x, mask = args[0], args[1]
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    return int(torch.count_nonzero(mask.expand(shape))) * x.element_size()


def _repeat_interleave(args: tuple, kwargs: dict) -> int:
    return int(args[0].sum()) * 8 if args[0].numel() else 0


def _unique(args: tuple, kwargs: dict) -> int:  # values, inverse indices, counts: at most this much
    x = args[0]
    return x.numel() * (x.element_size() + 16)


def _ctc_loss(args: tuple, kwargs: dict) -> int:
    """(negative log likelihood (N,), log_alpha (N, T, 2 * longest target + 1)) on CPU."""
    log_probs, target_lengths = args[0], args[3]
    longest = int(max(target_lengths)) if len(target_lengths) else 0
    t, n = (log_probs.shape[0], log_probs.shape[1]) if log_probs.dim() == 3 else (log_probs.shape[0], 1)
    return (n + n * t * (2 * longest + 1)) * log_probs.element_size()


def _ctc_loss_backward(args: tuple, kwargs: dict) -> int:
    return args[1].nelement() * args[1].element_size()  # a gradient shaped like log_probs


def _mkldnn_rnn_layer(args: tuple, kwargs: dict) -> int:
    """The CPU LSTM's layer: output, hy, cy, and (training) a oneDNN workspace that its meta kernel sizes as
    empty. The workspace bound is 1.6x a least-squares fit (in floats) of torch 2.13's workspaces over
    sequence 1-50, batch 1-64, hidden 16-512, input 8-1024: the real size is 0.41-0.95x of it there (the
    fit alone was up to 1.53x short); NOTE [ Size prediction ] 5."""
    x, hidden, train = args[0], args[10], args[15]
    t, b = x.shape[0], x.shape[1]  # (sequence, batch, features) whatever its batch_first says
    item = x.element_size()
    nbytes = t * b * hidden * item + sum(h.nbytes for h in (args[5], args[6]) if h is not None)
    if train:
        width = max(x.shape[-1], hidden)
        floats = 1.35 * t * b * 4 * hidden + 6.1 * (t + 1) * b * width + 3.9 * (t + 1) * b * hidden + 4300
        nbytes += int(1.6 * floats) * max(item, 4)
    return nbytes


def _pointwise_loss(args: tuple, kwargs: dict) -> int:
    """``mse_loss``, ``smooth_l1_loss``, ``binary_cross_entropy``, ``soft_margin_loss``: on CPU a reduced loss
    is a 0-dim view of the elementwise buffer the kernel computed (16 KiB for a 128 x 32 mean, where the meta
    kernel says 4 bytes: NOTE [ Size prediction ] 8). The elementwise size bounds it; learned per call."""
    a, b = args[0], args[1]
    return torch.broadcast_shapes(a.shape, b.shape).numel() * a.element_size()


def _like_self(args: tuple, kwargs: dict) -> int:
    """Backward kernels without a meta kernel whose one output is a gradient shaped like ``self`` (args[1])."""
    return args[1].numel() * args[1].element_size()


def _geqrf(args: tuple, kwargs: dict) -> int:
    """``geqrf`` (no meta kernel): ``a`` shaped like the input, ``tau`` of min(m, n) per matrix."""
    x = args[0]
    return (x.numel() + x.numel() // max(1, x.shape[-2] * x.shape[-1]) * min(x.shape[-2:])) * x.element_size()


_RULES: dict[str, Callable[[tuple, dict], int]] = {
    "multi_margin_loss_backward": _like_self, "multilabel_margin_loss_backward": _like_self,
    "fractional_max_pool3d_backward": _like_self, "geqrf": _geqrf,
    "mse_loss": _pointwise_loss, "smooth_l1_loss": _pointwise_loss, "binary_cross_entropy": _pointwise_loss,
    "soft_margin_loss": _pointwise_loss,
    "mkldnn_rnn_layer": _mkldnn_rnn_layer,
    "_ctc_loss": _ctc_loss, "_ctc_loss_backward": _ctc_loss_backward,
    "bincount": _bincount, "nonzero": _nonzero, "argwhere": _nonzero, "masked_select": _masked_select,
    "repeat_interleave": _repeat_interleave, "_unique": _unique, "_unique2": _unique, "unique_dim": _unique,
    "unique_consecutive": _unique, "unique_dim_consecutive": _unique,
}


# the rules above that read only shapes (they run on meta tensors too); the others read the data
_SHAPE_ONLY = frozenset({"multi_margin_loss_backward", "multilabel_margin_loss_backward",
                         "fractional_max_pool3d_backward", "geqrf", "mse_loss", "smooth_l1_loss",
                         "binary_cross_entropy", "soft_margin_loss", "mkldnn_rnn_layer", "_ctc_loss_backward"})


def rule_kind(packet: str) -> int:
    """For the compiled front end (front.cpp, ``Facts.size_rule``): 0 no rule for this aten op, 1 a rule that reads
    only shapes, 2 a rule that reads the data."""
    return 0 if packet not in _RULES else 1 if packet in _SHAPE_ONLY else 2


def rule_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """The fresh output bytes of aten op ``name`` ("aten.mse_loss.default") by its rule: a shape rule
    (``rule_kind`` 1) takes its arguments as meta tensors, a data rule (2) the inputs themselves."""
    return int(_RULES[name.split(".")[1]](args, kwargs))



def low_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """For the compiled front end: the fresh output bytes of aten op ``name`` by its meta kernel with floating inputs
    as bfloat16 (rule 2), its arguments as meta tensors; 0 where that fails too."""
    _, packet, overload = name.split(".")
    func = getattr(getattr(torch.ops.aten, packet), overload)
    nbytes = Sizes._meta(info(func), args, kwargs, True)
    return 0 if nbytes is None else nbytes


_NONE: Any = object()
_RULE_OF: dict[Any, Any] = {}  # FuncInfo (one per OpOverload) -> its rule or None


class Sizes:
    """Predicts the fresh output bytes of an op (NOTE [ Size prediction ])."""

    def __init__(self) -> None:
        self.cache = _CACHE
        self.unsized: dict[str, int] = {}  # ops that nothing could size (rule 4): name -> calls
        self.warned: set[str] = set()  # of those, the ones warned about (once each, under a budget)
        self.short: dict[str, int] = {}  # ops whose outputs outgrew the prediction (rule 9): name -> calls

    def predict(self, fi: FuncInfo, args: tuple, kwargs: dict, warn: bool = True) -> int:
        """Bytes of the fresh outputs of ``fi.func(*args, **kwargs)``; ``args`` hold the real (resident) inputs."""
        func = fi.func
        rule = _RULE_OF.get(fi, _NONE)
        if rule is _NONE:
            rule = _RULE_OF[fi] = _RULES.get(func._overloadpacket.__name__) if func.namespace == "aten" else None
        if rule is not None:
            if fi.learns_size:
                hit = _LEARNED.get(_call_key(fi, args, kwargs))
                if hit is not None:
                    return hit
            return rule(args, kwargs)
        try:
            key = _call_key(fi, args, kwargs)
            hit = self.cache.get(key)
        except TypeError:  # an unhashable argument
            key, hit = None, None
        if hit is not None:
            if hit == _UNSIZED:
                self._unsized(fi.name, warn)
                return 0
            return hit
        nbytes = self._meta(fi, args, kwargs, False)
        if nbytes is None:
            nbytes = self._meta(fi, args, kwargs, True)
        if nbytes is None:  # per call signature: index.Tensor with a boolean mask, not with integer indices
            nbytes = _UNSIZED
            self._unsized(fi.name, warn)
        if key is not None:
            if len(self.cache) >= _CACHE_MAX:  # bounded: a changing scalar makes a new key each time
                self.cache.clear()
            self.cache[key] = nbytes
        return max(nbytes, 0)

    @staticmethod
    def learn(fi: FuncInfo, args: tuple, kwargs: dict, nbytes: int) -> None:
        """The op (whose rule is an upper bound) just made ``nbytes`` of fresh outputs (NOTE 6)."""
        if len(_LEARNED) >= _CACHE_MAX:
            _LEARNED.clear()
        _LEARNED[_call_key(fi, args, kwargs)] = nbytes

    def fell_short(self, fi: FuncInfo, args: tuple, kwargs: dict, predicted: int, made: int) -> None:
        """The op made ``made`` bytes of fresh outputs where ``predicted`` were reserved and the budget was
        exceeded: say so once per op and, if its meta kernel sized it, remember the real size for this call
        signature (NOTE 9; an op with a rule that is a bound learns after every call already, rule 6)."""
        if made <= predicted:
            return
        if _RULE_OF.get(fi) is None:
            try:
                key = _call_key(fi, args, kwargs)
            except TypeError:  # an unhashable argument: nothing to key it by
                key = None
            if key is not None and self.cache.get(key) != _UNSIZED:  # unsized (rule 4): the data decides
                self.cache[key] = made
        n = self.short.get(fi.name, 0)
        self.short[fi.name] = n + 1
        if n == 0:
            warnings.warn(f"torch_dtr: {fi.name} made {made} B of outputs where its shape rule said {predicted} B, "
                          f"so the budget was exceeded by up to the difference while it returned; from now on the real "
                          f"size is reserved for the same argument shapes. Please report the op.", RuntimeWarning,
                          stacklevel=2)

    def _unsized(self, name: str, warn: bool = True) -> None:
        """``warn=False``: sized only for an out-of-memory retry (no budget), where nothing can be exceeded."""
        self.unsized[name] = self.unsized.get(name, 0) + 1
        if warn and name not in self.warned:
            self.warned.add(name)
            warnings.warn(f"torch_dtr: cannot predict the output size of {name} before it runs (no shape rule "
                          f"works for it); the budget may be exceeded by its output until the runtime evicts "
                          f"right after it. Please report the op.", RuntimeWarning, stacklevel=2)

    @staticmethod
    def _meta(fi: FuncInfo, args: tuple, kwargs: dict, low: bool) -> int | None:
        if low and not _floats(args):
            return None
        try:
            # a device argument (autocast's casts name the real one) would ask for a copy out of meta
            mk = {k: _META if k == "device" else _to_meta(v, low) for k, v in kwargs.items() if k != "generator"}
            out = flat_outputs(fi.func(*_to_meta(args, low), **mk))
        except Exception:
            return None
        wide = max(_floats(args) + _floats(list(kwargs.values()))) if low else 0
        rets = fi.returns
        nbytes = 0
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor) and rets[min(i, len(rets) - 1)] is None:
                if o.layout != torch.strided:  # sparse outputs are not managed, not counted (Budget accounting 5)
                    continue
                if low and o.dtype.is_floating_point:
                    nbytes += o.untyped_storage().nbytes() // o.element_size() * wide
                else:
                    nbytes += o.untyped_storage().nbytes()
        return nbytes


def trim() -> None:
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
