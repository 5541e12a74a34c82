"""What an op costs to recompute, from a model instead of a timer (``enable(costs="model")``).

# NOTE [ Modelled costs ]
#
# 1. Timers around each call make eviction choices vary from run to run (the clock and the scores both
#    come from them), so an outcome near the smallest budget can differ between two runs of one program.
#    A modelled cost depends only on the op and its shapes: the same program at the same budget evicts and
#    recomputes the same storages in every run.
# 2. cost = FLOPs / rate + bytes moved / bandwidth. FLOPs come from PyTorch's own formulas
#    (``torch.utils.flop_counter``: matmuls, convolutions, attention); bytes moved are the bytes of the
#    op's tensor arguments and outputs. Only the ratio of the two rates matters to the policy: the clock
#    advances by the same costs, so scaling them all scales cost and staleness alike.
# 3. The rates are per device type, fixed (``RATES``), not measured, so that two machines of one kind, and
#    two runs on one machine, agree. They are in the right order of magnitude for a 2-core CPU and an H100.
# 4. The native front end computes the same model in C++ for the ops whose FLOPs need no formula of PyTorch's
#    (``cost_kind``: none, or one of the matmuls of ``_FAST``), from the rates read here, and asks
#    ``model_cost`` for the rest: a program whose shapes change every step (variable sequence lengths) then
#    makes no Python call per new signature for most of its ops. Both give the same float (the test
#    ``test_the_kernels_cost_model_equals_the_python_one`` compares them on every miss of real programs).
# 5. On the CPU, rule 2 ranks ops wrongly where their time is not their FLOPs and bytes: drawing random numbers
#    (dropout's ``bernoulli_``) takes 26-30x what its bytes say, normalizations and transcendental functions 3-9x,
#    relative to the matmuls. The policy then recomputed dropout masks as if they were cheap. So each operator
#    has a fixed weight on the CPU (``WEIGHTS``), its measured time over its modelled time relative to the
#    matmuls', fitted on the bench's three workloads by ``benchmarks/costs.py`` (docs/costs.md). Fixed, so that
#    rule 1 holds; unlisted operators weigh 1. On CUDA no weights are fitted (no device to fit them on).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

# (FLOP/s, bytes/s) per device type: rule 3
RATES = {"cpu": (2e10, 5e9), "cuda": (3e14, 2e12)}
_Tensor = torch.Tensor
_NONE: Any = object()
_FORMULA: dict[Any, Any] = {}  # OpOverload -> its FLOP formula or None
# rule 5: per device type, operator (overload packet) -> its weight; docs/costs.md
WEIGHTS: dict[str, dict[str, float]] = {
    "cpu": {  # fitted 2026-12-02 on 2 x86_64 cores, torch 2.13; the last four by analogy with a fitted sibling
        "_log_softmax": 6.7, "_log_softmax_backward_data": 4.0, "_softmax": 2.8, "abs": 7.5, "bernoulli_": 30.0,
        "cat": 2.6, "clone": 2.0, "max_pool2d_with_indices": 18.0, "mean": 17.0, "mul": 1.8, "native_batch_norm": 4.1,
        "native_batch_norm_backward": 1.6, "native_layer_norm_backward": 2.2, "nll_loss_backward": 4.2, "pow": 1.9,
        "sigmoid_": 4.0, "sum": 4.5, "tanh": 8.5, "tanh_": 15.0,
        "sigmoid": 4.0, "bernoulli": 30.0, "native_dropout": 30.0, "uniform_": 30.0,
    },
    "cuda": {},
}


def _bytes(xs: Any) -> int:
    n = 0
    for x in xs:
        if isinstance(x, _Tensor):
            try:
                n += x.nbytes
            except RuntimeError:  # sparse layouts define no nbytes: count their values
                n += x._nnz() * x.element_size() if x.is_sparse else 0
        elif type(x) is list or type(x) is tuple:
            n += _bytes(x)
    return n


def _mm(args: tuple) -> int:
    (m, k), n = args[0].shape, args[1].shape[-1]
    return 2 * m * k * n


def _bmm(args: tuple) -> int:
    (b, m, k), n = args[0].shape, args[1].shape[-1]
    return 2 * b * m * k * n


# the matmuls of every model, without the registry's generic wrapper (~35 us a call): 2 x m x k x n
_FAST = {"mm": _mm, "bmm": _bmm, "addmm": lambda a: _mm(a[1:]), "baddbmm": lambda a: _bmm(a[1:])}
_CACHE: dict[Any, int] = {}  # (op, input shapes) -> FLOPs, for the other ops with a formula
_CACHE_MAX = 20_000


def _remember(func: Any, f: Any) -> None:
    """``func``'s formula, on the OpOverload (read without its Python ``__hash__``) and in ``_FORMULA``."""
    _FORMULA[func] = f
    try:
        func._dtr_flops = f
    except (AttributeError, TypeError):
        pass


def flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of ``func(*args, **kwargs) -> out`` by PyTorch's formulas; 0 for ops without one."""
    f = getattr(func, "_dtr_flops", _NONE)  # kept on the OpOverload: its __hash__ is Python code
    if f is _NONE:
        f = _FORMULA.get(func, _NONE)
    if f is _NONE:
        packet = func._overloadpacket
        fast = _FAST.get(packet.__name__) if func.namespace == "aten" else None
        if fast is not None:
            f = (fast, None)
        else:
            f = (None, flop_registry[packet]) if packet in flop_registry else None
        _remember(func, f)
    if f is None:
        return 0
    fast, slow = f
    if fast is not None:
        return fast(args)
    try:
        key = (func, tuple(a.shape if isinstance(a, _Tensor) else tuple(a) if type(a) is list else a for a in args))
        hit = _CACHE.get(key)
    except TypeError:  # an unhashable argument
        key, hit = None, None
    if hit is not None:
        return hit
    try:  # the registered formulas take the tensors themselves (they read the shapes)
        n = int(slow(*args, out_val=out, **kwargs))
    except Exception:  # a formula that does not take this overload's arguments: count bytes only
        _remember(func, None)
        return 0
    if key is not None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = n
    return n


COST_KINDS = ("none", "mm", "bmm", "addmm", "baddbmm")  # kind 5: PyTorch's formula, in Python


def cost_kind(name: str) -> int:
    """How the op named ``name`` ("aten.mm.default") counts FLOPs (rule 4): its index in ``COST_KINDS``, or 5
    where only ``flops`` in Python knows (PyTorch's formula registry)."""
    try:
        ns, packet, overload = name.split(".")
        func = getattr(getattr(getattr(torch.ops, ns), packet), overload)
    except (ValueError, AttributeError, RuntimeError):  # not an operator torch.ops can name: Python decides
        return 5
    if func.namespace == "aten" and packet in _FAST:
        return COST_KINDS.index(packet)
    return 5 if func._overloadpacket in flop_registry else 0


def weights(name: str) -> tuple[float, float]:
    """The CPU and CUDA weights (rule 5) of the op named ``name`` ("aten.bernoulli_.float")."""
    parts = name.split(".")
    return _weights(parts[1] if len(parts) == 3 and parts[0] == "aten" else "")


def _weights(packet: str) -> tuple[float, float]:  # an aten operator's, by its packet's name ("" for any other)
    return WEIGHTS["cpu"].get(packet, 1.0), WEIGHTS["cuda"].get(packet, 1.0)


def model_cost(func: Any, args: tuple, kwargs: dict, flat_out: list[Any], device: str) -> float:
    """Seconds the op is modelled to take (rules 2 and 5)."""
    rate, bandwidth = RATES.get(device, RATES["cuda"])
    moved = _bytes(args) + _bytes(flat_out)
    if kwargs:
        moved += _bytes(kwargs.values())
    out = flat_out[0] if len(flat_out) == 1 else tuple(flat_out)
    w = getattr(func, "_dtr_weights", None)  # kept on the OpOverload, as its FLOP formula
    if w is None:
        w = _weights(func._overloadpacket.__name__ if func.namespace == "aten" else "")
        try:
            func._dtr_weights = w
        except (AttributeError, TypeError):
            pass
    return (flops(func, args, kwargs, out) / rate + moved / bandwidth) * w[device != "cpu"]
