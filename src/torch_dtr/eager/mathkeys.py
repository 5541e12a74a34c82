"""Conjugate and negative views inside ``__torch_dispatch__`` (NOTE [ Conjugate and negative keys ]).

# NOTE [ Conjugate and negative keys ]
#
# 1. While a ``TorchDispatchMode`` handles an op, PyTorch excludes the dispatch keys above Python from
#    the thread's key set, ``Conjugate`` and ``Negative`` among them. A C++ kernel that builds a lazy
#    conjugate (or negative) view of its own and hands it to another op then has the bit ignored: the
#    view is read as if it were not conjugated. ``linalg_pinv`` does ``Vh.mH() * S``: complex ``pinv`` was
#    wrong by up to 4.9 under any mode, even one that only calls the op (``A @ pinv(A) @ A`` off by 3.2),
#    and complex ``linalg_lstsq``'s residuals (``r.mul_(r.conj())``) came out as r^2 (PyTorch 2.13;
#    upstream pytorch/pytorch#198118). Real tensors get no such views.
# 2. So an op with a complex tensor argument runs with both keys switched back on, as in plain eager
#    (``math_keys``), both when first run and when a recipe replays it; values are then bitwise plain.
#    The guard costs about 5 us, so only ops with complex arguments get it; finding them costs every op
#    0.4-0.6 us (two tensors or a tensor and a scalar; 1.7 us for a list of three, timeit, 2026-11-23).
#    Test: tests/eager/test_conformance.py.
"""

from __future__ import annotations

from typing import Any

import torch

_C = torch._C
_KEYS = (_C.DispatchKey.Conjugate, _C.DispatchKey.Negative)


def _cx(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.dtype.is_complex
    if type(x) is list or type(x) is tuple:
        return any(isinstance(y, torch.Tensor) and y.dtype.is_complex for y in x)
    return False


def complex_args(args: Any, kwargs: dict | None) -> bool:
    """Whether any tensor argument (top level or in a list) is complex."""
    for a in args:
        if _cx(a):
            return True
    return bool(kwargs) and any(_cx(v) for v in kwargs.values())  # type: ignore[union-attr]


def math_keys() -> Any:
    """A guard that switches the Conjugate and Negative keys back on for the ops run under it."""
    exclude = _C._dispatch_tls_local_exclude_set()
    for k in _KEYS:
        exclude = exclude.remove(k)
    return _C._ForceDispatchKeyGuard(_C._dispatch_tls_local_include_set(), exclude)
