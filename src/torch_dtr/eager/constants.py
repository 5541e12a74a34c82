"""Constants: the plain tensors managed ops read (parameters, buffers, inputs, gradients). They are counted
against the budget, and the recipes that read them are listed, so that a write to one invalidates them."""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..core import Op, Runtime
from .tensor import DTRTensor

# NOTE [ Changed constants ]
#
# 1. Each constant is known by its storage, ``(data pointer, bytes)``: views of a parameter (``w.t()``) and
#    ``p.data`` name the same one. Every recipe that reads a constant is listed under that key (``readers``),
#    except copies private to the recipe (NOTE [ In-place mutation ] 4 and 6).
# 2. A write to a constant is seen *before* it happens:
#    - an aten op that writes an argument in place, managed (``Front._run``) or plain (the dispatch mode's
#      plain path): optimizer steps (``_foreach_add_``, ``addcdiv_``, fused Adam), ``p.data.clamp_()``,
#      ``p.data -= g``, ``copy_``, batch norm's running statistics in training mode;
#    - ``t.data = v``, which is not an op: ``torch.Tensor.data`` is wrapped while enabled (``api``).
#    The key's readers are then invalidated (NOTE [ Changed inputs ] in the core): values the program holds
#    are recomputed first, with the old value, and pinned; recipes are dropped, and with them whatever
#    they kept alive.
# 3. Not seen: writes on a thread without the dispatch mode (NOTE [ Threads ]), through numpy or DLPack
#    views of the memory, or with dispatch modes disabled. A direct in-place write there still bumps the
#    tensor's version, which a replay checks (NOTE [ In-place mutation ] 5: ConstantChangedError, never a
#    wrong value); a write through ``.data`` there is not caught.
# 4. ``p.data = v`` on a plain ``p`` with a managed ``v`` gives ``p`` v's value as a plain tensor (v's storage
#    is pinned: the memory is shared). ``t.data = v`` on a managed ``t`` points ``t`` at v's value (a plain
#    ``v`` becomes a pinned storage). Either way, readers of the old value are invalidated first.

_STRIDED = torch.strided
_TENSOR = torch.Tensor
Key = tuple[int, int]


def key_of(t: torch.Tensor) -> Key | None:
    if t.device.type == "meta" or t.layout != _STRIDED:
        return None
    if type(t) is not _TENSOR and isinstance(t, FakeTensor):  # DTensor's sharding propagation: no memory
        return None
    try:
        st = t.untyped_storage()
        n = st.nbytes()
        return (st.data_ptr(), n) if n else None  # an empty storage (a freed FSDP2 parameter) holds nothing
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage of its own (DTensor)
        return None


class Constants:
    """The constants a front end has seen, their byte counts in the runtime, and their readers."""

    def __init__(self, rt: Runtime, pending: deque, drain_if_idle: Any) -> None:
        self.rt = rt
        self.pending = pending  # the front end's queue of handle drops (NOTE [ Threads ] 2)
        self.drain_if_idle = drain_if_idle
        self.ids: dict[int, tuple[weakref.ref, Key]] = {}
        self.keys: dict[Key, int] = {}  # storage -> tensors seen on it
        self.hooks: dict[int, tuple[weakref.ref, Any]] = {}
        self.readers: dict[Key, list[Op]] = {}  # rule 1
        self.prune_at: dict[Key, int] = {}
        # entries given up by ``forget``, by id (dead weak references cannot be hashed; kept alive here, so
        # the id is not reused): their death counts nothing
        self.retired: dict[int, weakref.ref] = {}

    # ------------------------------------------------------------------ seeing and forgetting
    def see(self, c: torch.Tensor, where: str = "") -> None:
        """Count ``c``'s storage against the budget (once per storage) until the last tensor seen on it dies."""
        entry = self.ids.get(id(c))
        if entry is not None and entry[0]() is c:
            if c.requires_grad and id(c) not in self.hooks and c.is_leaf:  # requires_grad_() after first use
                self._hook(c)
            return
        key = key_of(c)
        if key is None:  # meta and sparse constants are not counted (no storage)
            return
        ident = id(c)
        pending, drain_if_idle = self.pending, self.drain_if_idle

        def died(wr: weakref.ref, ident: int = ident, key: Key = key) -> None:
            pending.append((ident, wr, key))
            drain_if_idle()

        n = self.keys.get(key, 0)
        if n == 0:
            self.rt.add_constant(key[1], where)  # may raise BudgetError: register nothing before it
        self.keys[key] = n + 1
        wr = weakref.ref(c, died)
        self.ids[ident] = (wr, key)
        stale = self.hooks.get(ident)
        if stale is not None and stale[0]() is not c:  # a dead tensor's id, reused before its drop drained
            del self.hooks[ident]
        if c.requires_grad and c.is_leaf and ident not in self.hooks:
            self._hook(c)

    def _hook(self, c: torch.Tensor) -> None:
        """Gradients accumulated into ``c.grad`` come back plain (NOTE [ Managed vs constant ] 4)."""
        self.hooks[id(c)] = (weakref.ref(c), c.register_post_accumulate_grad_hook(plain_grad))

    def died(self, ident: int, wr: weakref.ref, key: Key) -> None:
        """A constant tensor died (drained from the queue under the front end's lock)."""
        if self.retired and self.retired.pop(id(wr), None) is wr:
            return
        entry = self.ids.get(ident)
        if entry is not None and entry[0] is wr:
            del self.ids[ident]
            self.hooks.pop(ident, None)  # its hook died with it; the id may be reused
        self._uncount(key)

    def _uncount(self, key: Key) -> None:
        n = self.keys[key] - 1
        if n:
            self.keys[key] = n
        else:
            del self.keys[key]
            self.readers.pop(key, None)  # recipes hold their constants: none of them is live
            self.prune_at.pop(key, None)
            self.rt.remove_constant(key[1])

    def forget(self, c: torch.Tensor) -> None:
        """``c`` is about to get another storage (``c.data = v``): stop counting the old one for it; the next
        managed op that reads ``c`` counts the new one."""
        entry = self.ids.pop(id(c), None)
        if entry is not None and entry[0]() is c:
            self.retired[id(entry[0])] = entry[0]
            self._uncount(entry[1])

    def release(self, tensors: Iterable[torch.Tensor]) -> None:
        """The storages of ``tensors`` are about to be freed in place (FSDP2's reshard, NOTE [ Resharded
        parameters ] 3): stop counting them for every tensor seen on them; a later read counts them again."""
        keys = {k for k in (key_of(t) for t in tensors) if k is not None}
        if not keys:
            return
        for ident, (wr, key) in list(self.ids.items()):
            if key in keys:
                del self.ids[ident]
                self.retired[id(wr)] = wr
                self._uncount(key)

    # ------------------------------------------------------------------ readers (NOTE [ Changed constants ])
    def read_by(self, op: Op, consts: Iterable[torch.Tensor]) -> None:
        ids, readers = self.ids, self.readers
        for c in consts:
            entry = ids.get(id(c))
            if entry is None:  # a copy private to the recipe, or not countable
                continue
            key = entry[1]
            lst = readers.get(key)
            if lst is None:
                readers[key] = [op]
                continue
            lst.append(op)
            if len(lst) > self.prune_at.get(key, 64):  # ops die with their outputs: drop them now and then
                lst[:] = [o for o in lst if o.compute is not None]
                self.prune_at[key] = max(64, 2 * len(lst))

    def written(self, tensors: Iterable[Any]) -> list[Op]:
        """The live recipes that read any of ``tensors`` (tensors or lists of them), forgotten as readers."""
        ops: list[Op] = []
        readers = self.readers
        for t in tensors:
            if type(t) is list or type(t) is tuple:
                ops += self.written(t)
                continue
            if not isinstance(t, torch.Tensor) or type(t) is DTRTensor:
                continue
            key = key_of(t)
            lst = readers.pop(key, None) if key is not None else None
            if lst:
                self.prune_at.pop(key, None)
                ops += [o for o in lst if o.compute is not None]
        return ops

    def close(self) -> None:
        for wr, handle in self.hooks.values():
            if wr() is not None:
                handle.remove()
        self.hooks.clear()


def plain_grad(p: torch.Tensor) -> None:
    g = p.grad
    if type(g) is DTRTensor:
        p.grad = g._cell.front.unwrap(g._cell)
