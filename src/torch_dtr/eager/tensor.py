"""The managed tensor: a wrapper subclass whose state lives in one shared cell per tensor."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..core import Storage

# NOTE [ Storage vs view ]
#
# 1. The core evicts and counts storages. A managed tensor is a *view* of one storage: a ``Cell`` holds
#    the storage and the view's geometry (size, stride, storage offset, dtype), or ``None`` when the
#    tensor is exactly the storage's payload (the common case: the op's own output).
# 2. A view holds no memory of its own: its value is rebuilt from the storage's payload on every use
#    (``as_strided``), so evicting a storage invalidates all its views at once and bytes are counted
#    once per storage.
# 3. The wrapper object carries nothing but ``_cell``. Autograd may keep another Python object for a
#    saved tensor that shares the wrapper's ``__dict__``; both see the same cell, so state is never split.
# 4. A cell owns one handle on its storage (``Storage.refs``). When the cell dies (every wrapper that
#    names it is gone, autograd's saved copies included), it queues the handle drop and drains the queue
#    at once unless the runtime is busy (on this or another thread); then the runtime drains it at its
#    next safe point, never in the middle of its own bookkeeping.
# 5. After an in-place write, the storage a cell names may have a newer version (``Storage.forward``);
#    handles move to it at once and a cell follows the chain, so all views see the write, while recipes keep
#    naming the version they read (see NOTE [ In-place mutation ]).

# size, stride, storage offset, dtype, conjugate bit, negative bit
Geom = tuple[torch.Size, tuple[int, ...], int, torch.dtype, bool, bool] | None


def geometry(t: torch.Tensor, payload: torch.Tensor) -> Geom:
    """``None`` when ``t`` is exactly ``payload``'s view of the storage, else the geometry of ``t``."""
    if t is payload:
        return None
    size, stride, off, dtype = t.size(), t.stride(), t.storage_offset(), t.dtype
    bits = (t.is_conj(), t.is_neg())
    if (size == payload.size() and stride == payload.stride() and off == payload.storage_offset()
            and dtype == payload.dtype and bits == (payload.is_conj(), payload.is_neg())):
        return None
    return (size, stride, off, dtype, *bits)


def view_of(payload: torch.Tensor, geom: Geom) -> torch.Tensor:
    if geom is None:
        return payload
    size, stride, off, dtype, conj, neg = geom
    if dtype == payload.dtype:
        v = payload.as_strided(size, stride, off)
    else:
        v = torch.empty(0, dtype=dtype, device=payload.device).set_(payload.untyped_storage(), off, size, stride)
    if v.is_conj() != conj:  # a lazily conjugated or negated view (torch.conj, _neg_view) keeps its bit
        torch._C._set_conj(v, conj)
    if v.is_neg() != neg:
        torch._C._set_neg(v, neg)
    return v


class Cell:
    """The shared state of one managed tensor: which storage, which view of it, and the front end (the
    session of ``torch_dtr.enable``) that manages it."""

    __slots__ = ("storage", "geom", "front", "__weakref__")

    def __init__(self, front: Any, storage: Storage, geom: Geom) -> None:
        self.front = front
        self.storage = storage
        self.geom = geom
        front.rt.add_ref(storage)

    def current(self) -> Storage:
        """The newest version of this cell's storage (follows in-place writes; the handle moved already)."""
        s = self.storage
        while s.forward is not None:
            s = s.forward
        self.storage = s
        return s

    def __del__(self) -> None:
        try:
            front = self.front
            front.pending.append(self.storage)
            if not front.busy:  # else the runtime drains it at its next op (drain_if_idle would not either)
                front.drain_if_idle()
        except Exception:  # interpreter shutdown
            pass


# NOTE [ Spectra without vectors ]
#
# torch.linalg.svdvals and eigvalsh compute the vectors too where the input "may need a gradient", and PyTorch
# counts every tensor subclass as one that may: under the Python front end they took another LAPACK routine and
# returned other values than plain PyTorch (svdvals 1e-5 apart under no_grad). While the Python front end runs,
# ``torch.linalg.svdvals`` and ``torch.linalg.eigvalsh`` are wrapped (``spectra``): on a managed tensor that
# needs no gradient they run the kernel plain PyTorch runs. A wrapper, not ``DTRTensor.__torch_function__``:
# that would put a Python call in front of every method and attribute of a managed tensor (10% of a small-op
# loop). Not covered: what calls them from C++ (matrix_norm of ord 2, cond, matrix_rank) or holds the function
# from before ``enable()``. The compiled front end's tensors are not subclasses: it never had the difference.


def _no_grad_needed(a: Any) -> bool:
    return isinstance(a, DTRTensor) and not (a.requires_grad and torch.is_grad_enabled())


def _svdvals(orig: Any) -> Any:
    def svdvals(A: torch.Tensor, *, driver: str | None = None, out: Any = None) -> torch.Tensor:  # noqa: N803
        if out is None and _no_grad_needed(A):
            return torch.ops.aten._linalg_svd.default(A, False, False, driver=driver)[1]
        return orig(A, driver=driver) if out is None else orig(A, driver=driver, out=out)
    return svdvals


def _eigvalsh(orig: Any) -> Any:
    def eigvalsh(A: torch.Tensor, UPLO: str = "L", *, out: Any = None) -> torch.Tensor:  # noqa: N803
        if out is None and _no_grad_needed(A):
            return torch.ops.aten._linalg_eigh.default(A, UPLO, False)[0]
        return orig(A, UPLO) if out is None else orig(A, UPLO, out=out)
    return eigvalsh


_SPECTRA = {"svdvals": _svdvals, "eigvalsh": _eigvalsh}
_ORIGINAL: dict[str, Any] = {}


def spectra(on: bool) -> None:
    """Wrap (or restore) torch.linalg's svdvals and eigvalsh (NOTE [ Spectra without vectors ])."""
    if on and not _ORIGINAL:
        for name, wrap in _SPECTRA.items():
            _ORIGINAL[name] = getattr(torch.linalg, name)
            setattr(torch.linalg, name, functools.wraps(_ORIGINAL[name])(wrap(_ORIGINAL[name])))
    elif not on and _ORIGINAL:
        for name, orig in _ORIGINAL.items():
            setattr(torch.linalg, name, orig)
        _ORIGINAL.clear()


class DTRTensor(torch.Tensor):
    """A tensor managed by torch_dtr: its value may be evicted and is recomputed when used."""

    _cell: Cell
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, cell: Cell, like: torch.Tensor) -> DTRTensor:
        w = torch.Tensor._make_wrapper_subclass(
            cls, like.size(), strides=like.stride(), storage_offset=like.storage_offset(),
            dtype=like.dtype, device=like.device, requires_grad=False,
        )
        if like.is_conj():
            torch._C._set_conj(w, True)
        if like.is_neg():
            torch._C._set_neg(w, True)
        w._cell = cell
        return w

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        # an op on managed tensors that no dispatch mode saw (another thread, or after disable()): the
        # front end of the first managed argument runs it (NOTE [ Threads ] 3)
        kwargs = kwargs or {}
        return _first(args, kwargs)._cell.front.dispatch(func, args, kwargs)

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return _DATA.__get__(self)

    @data.setter
    def data(self, v: torch.Tensor) -> None:  # NOTE [ Changed constants ] 4 (front.set_data)
        self._cell.front.set_data(self, v)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        text = repr(self._cell.front.peek(self._cell))
        if self.grad_fn is not None:
            text = f"{text[:-1]}, grad_fn=<{type(self.grad_fn).__name__}>)"
        elif self.requires_grad:
            text = f"{text[:-1]}, requires_grad=True)"
        return text.replace("tensor(", "dtr_tensor(", 1)

    def numpy(self, *, force: bool = False) -> Any:  # type: ignore[override]
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self._cell.front.unwrap(self._cell).numpy(force=force)

    def tolist(self) -> Any:  # type: ignore[override]
        return self._cell.front.peek(self._cell).tolist()

    def data_ptr(self) -> int:  # type: ignore[override]
        # an address to read through (a custom kernel, a ctypes view): the payload's, pinned (the wrapper has none)
        return self._cell.front.unwrap(self._cell).data_ptr()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        # the payload's memory leaves PyTorch (np.from_dlpack, JAX): pinned, as for numpy() (the wrapper itself
        # has no memory: exporting it gave garbage)
        return self._cell.front.unwrap(self._cell).__dlpack__(*args, **kwargs)

    # Saving and copying work as on a plain tensor and give plain tensors back: a managed tensor's recipe
    # and runtime belong to this process's session, so only the value travels.
    def __reduce_ex__(self, proto: Any) -> Any:
        v = self._cell.front.peek(self._cell).detach()
        if self.requires_grad:
            v.requires_grad_(True)
        return v.__reduce_ex__(proto)

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        if not self.is_leaf:  # as torch.Tensor.__deepcopy__ says for any non-leaf
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment (torch_dtr: copy.deepcopy(t.detach()) copies the value)")
        v = self._cell.front.peek(self._cell).clone()
        if self.requires_grad:
            v.requires_grad_(True)
        memo[id(self)] = v
        return v


_DATA = torch._C.TensorBase.__dict__["data"]


def _first(args: tuple, kwargs: dict) -> DTRTensor:
    """The first managed tensor among the arguments (one level of lists), positional ones first."""
    for a in (*args, *kwargs.values()):
        if type(a) is DTRTensor:
            return a
        if type(a) is list or type(a) is tuple:
            for b in a:
                if type(b) is DTRTensor:
                    return b
    raise AssertionError("torch_dtr internal error: DTRTensor.__torch_dispatch__ without a managed argument")


_DLPACK: dict[str, Any] = {}


def guard_dlpack() -> None:
    """``torch.to_dlpack`` / ``torch.utils.dlpack.to_dlpack`` of a ``DTRTensor`` export its pinned payload (the
    C function reads the wrapper, which has no memory, and crashed the process); installed once, kept."""
    if _DLPACK:
        return
    import torch.utils.dlpack

    for owner in (torch, torch.utils.dlpack):
        orig = _DLPACK.setdefault(f"{owner.__name__}.to_dlpack", owner.to_dlpack)

        def to_dlpack(t: Any, *args: Any, __orig: Any = orig, **kwargs: Any) -> Any:
            if type(t) is DTRTensor:
                t = t._cell.front.unwrap(t._cell)
            return __orig(t, *args, **kwargs)

        owner.to_dlpack = to_dlpack
