"""Reads that take a managed tensor's memory out of PyTorch's sight: numpy, DLPack, storage objects, addresses.

# NOTE [ Native exports ]
#
# 1. The kernel sees every aten op, but not the reads that hand a tensor's memory to someone else: ``numpy()``
#    (and ``__array__``, which calls it), ``__dlpack__`` and ``torch.utils.dlpack.to_dlpack`` (``np.from_dlpack``,
#    JAX, CuPy), ``untyped_storage()`` and ``_typed_storage()`` (``torch.save``, ``copy.deepcopy``), ``data_ptr()``
#    and ``tolist()``.
#    Such a read of an evicted value finds no data, and a value evicted after the read leaves the reader with
#    freed memory: a numpy view of an activation went silently wrong once the budget evicted it.
# 2. On a managed tensor each of them first brings the value back and pins it (``Session.unwrap``: never
#    evicted again while held, as the Python front end's ``DTRTensor.numpy`` does), then reads as PyTorch
#    would (its own errors, such as ``numpy()`` on a tensor that requires grad, unchanged); ``tolist()``, a copy,
#    only brings it back (through ``detach``, an op) and does not pin it. Installed on the
#    first ``enable()`` and kept (managed tensors outlive their session); other tensors pay one
#    ``is_managed`` check. The storage reads only while a session is enabled: the Python front end reads them
#    several times per op, and after ``disable()`` nothing is evicted any more.
# 3. Not covered: a C++ extension that takes a tensor through pybind and reads ``data_ptr<T>()`` itself (no
#    dispatcher, no Python): call ``t.data_ptr()`` on it first (which pins it), or keep such values plain.
# 4. Values that become constants (NOTE [ Managed vs constant ] 6, as the Python front end): under no_grad a new
#    tensor is managed (rule 5 there), and a module converted or built while enabled (``.double()``,
#    ``.to(memory_format=...)``, an init) makes its parameters from such values: ``p.data = v`` (no kernel sees
#    ``set_data``), ``nn.Parameter(v)``, ``register_buffer(name, v)``. The plain tensor then shared the managed
#    value's storage while the core, seeing the last handle die, freed its data: the next forward read freed
#    memory (``.double()``: a segmentation fault). While enabled, each of them takes the value's plain
#    tensor, pinned (``Session.unwrap``), instead.
# 5. Not while ``torch.compile`` traces or another dispatch mode is active (a fake tensor mode reads its example
#    inputs' storages, and the ops that bring a value back cannot run under it): the read goes through as it
#    did. A compiled region's kernels read their inputs' memory without the kernel: an inductor region brings
#    its managed inputs back and pins them before it runs (NOTE [ Unmanaged regions ] 1); with another backend,
#    keep the values that cross into it plain under a budget (said once, when such a region is compiled: the
#    tracing itself reads its inputs' addresses for either backend, so a warning here was said for inductor too).
# 6. ``t.data = v`` on a constant rebinds ``t`` to another storage without an op, and recipes that read ``t`` hold
#    ``t`` itself: recomputed, they would read ``v``, and once ``v`` was written in place (an optimizer's step)
#    they could not run at all ("a tensor it read was written in place since"). As for a write to a constant
#    (NOTE [ Changed constants ] 2), the live recipes that read its storage are told first
#    (``Session.rebinding``): what they computed that is still needed is brought back, and they are dropped.
# 7. ``t.data = v`` on a managed ``t``: ``t``'s handle lets go of its value (front.cpp rule 6), and ``t`` becomes
#    ``v``'s plain tensor, pinned (rule 4), as a constant. Taking a managed ``v`` as it was left ``t`` sharing the
#    storage of ``v``'s value with no handle of its own: once ``v`` died, the core freed it under ``t``
#    (``t.data = torch.zeros_like(t)`` read freed memory: a segmentation fault).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils.dlpack
from torch import compiler as _compiler
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode

_INSTALLED: dict[str, Any] = {}  # what was replaced: its name -> the original


def _pin(ext: Any, t: Any) -> None:
    if not isinstance(t, torch.Tensor) or not ext.is_managed(t):
        return
    # not while torch.compile traces (it reads storages of its example inputs under a fake tensor mode, where the
    # ops that bring a value back cannot run): rule 5
    if not _compiler._is_compiling_flag and _current_mode() is None:
        _plain(ext, t)


def _guarded(ext: Any, orig: Any) -> Any:
    @functools.wraps(orig)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        _pin(ext, self)
        return orig(self, *args, **kwargs)

    return read


def install(ext: Any) -> None:
    """Guard numpy, DLPack, ``data_ptr`` and ``tolist`` (rule 2); idempotent."""
    if "numpy" in _INSTALLED:
        return
    for name in ("numpy", "__dlpack__", "data_ptr"):
        orig = getattr(torch.Tensor, name)
        _INSTALLED[name] = orig
        setattr(torch.Tensor, name, _guarded(ext, orig))
    for owner in (torch, torch.utils.dlpack):  # the same C function under two names
        orig = _INSTALLED[f"{owner.__name__}.to_dlpack"] = owner.to_dlpack
        owner.to_dlpack = _guarded(ext, orig)
    tolist = _INSTALLED["tolist"] = torch.Tensor.tolist

    @functools.wraps(tolist)
    def copied(self: Any) -> Any:  # a copy: brought back by an op (``detach``) for the read, not pinned
        return tolist(self.detach() if ext.is_managed(self) else self)

    torch.Tensor.tolist = copied  # type: ignore[method-assign]


def guard_storage(ext: Any, on: bool) -> None:
    """``untyped_storage()`` and ``_typed_storage()`` (``copy.deepcopy``, ``torch.save``) guarded while a session
    is enabled (rule 2)."""
    for name in ("untyped_storage", "_typed_storage"):
        if on and name not in _INSTALLED:
            orig = _INSTALLED[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, _guarded(ext, orig))
        elif not on and name in _INSTALLED:
            setattr(torch.Tensor, name, _INSTALLED.pop(name))


_DATA = torch._C.TensorBase.__dict__["data"]  # the C getter and setter of ``Tensor.data``


def _plain(ext: Any, v: Any) -> Any:
    """A managed value that becomes a constant: its plain tensor, pinned (rule 4)."""
    if isinstance(v, torch.Tensor) and ext.is_managed(v):
        return ext.session_of(v).unwrap(v)
    return v


def guard_constants(ext: Any, on: bool, session: Any = lambda: None) -> None:
    """``t.data = v`` on a plain ``t``, ``nn.Parameter(v)`` and ``register_buffer(name, v)`` take a managed ``v``'s
    plain tensor while a session is enabled (rule 4); ``t.data = v`` on a constant that recipes read tells the
    running session (``session()``) first (rule 6)."""
    if on and "data" not in _INSTALLED:
        _INSTALLED["data"] = True
        new, register = _INSTALLED["Parameter.__new__"], _INSTALLED["register_buffer"] = (
            torch.nn.Parameter.__new__, torch.nn.Module.register_buffer)

        def set_data(t: torch.Tensor, v: torch.Tensor) -> None:
            if ext.is_managed(t):  # t's handle lets go of its value (front.cpp rule 6); t becomes v's plain tensor
                _DATA.__set__(t, _plain(ext, v))
                return
            s = session()
            if s is not None and s.active:
                s.rebinding(t)
            _DATA.__set__(t, _plain(ext, v))

        def param_new(cls: type, data: Any = None, requires_grad: bool = True) -> Any:
            return new(cls, _plain(ext, data), requires_grad)

        def register_buffer(self: torch.nn.Module, name: str, tensor: Any, persistent: bool = True) -> None:
            register(self, name, _plain(ext, tensor), persistent)

        torch.Tensor.data = property(_DATA.__get__, set_data)  # type: ignore[assignment]
        torch.nn.Parameter.__new__ = param_new  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]
    elif not on and "data" in _INSTALLED:
        del _INSTALLED["data"]
        if "data" in torch.Tensor.__dict__:
            del torch.Tensor.data
        torch.nn.Parameter.__new__ = _INSTALLED.pop("Parameter.__new__")  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = _INSTALLED.pop("register_buffer")  # type: ignore[method-assign]
