"""The Python half of the compiled front end: the core runtime and the calls the C++ kernel makes into it.

Every decision is the core's (``torch_dtr.core.Runtime``, the one the simulator drives): this module only
translates. The kernel (front.cpp) calls ``before`` ahead of an op when the op needs the core first (an
evicted input, a budget to reserve against, handle deaths to drop, new constants, a managed input it writes),
and ``ran`` after it. NOTE [ Native front end ] in ``__init__.py``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..core import Memory, Op, Runtime, Storage, Tier
from ..core.policies import Policy
from ..eager.costs import model_cost
from ..eager.device import OutOfMemory

# Recipes that read a constant die with their outputs; the lists of readers are pruned now and then.
_PRUNE = 64


class NativeMemory(Memory):
    """The core's byte count, which also frees a storage's data when the core stops counting it (evicted or
    released): the handles keep the StorageImpl, without data (NOTE [ Native front end ] 2)."""

    __slots__ = ()

    def free(self, s: Storage) -> None:
        super().free(s)
        p = s.payload
        if p is not None:
            p.drop()


class Session:
    """One native session: the core runtime and the C++ kernel's calls into it."""

    def __init__(self, ext: Any, budget: int | None, policy: str | Policy, banish_depth: int,
                 tier: Tier | None = None, device: Any = None) -> None:
        self.ext = ext
        self.active = False  # managing this thread's ops (enable() to disable()); only then the kernel queues
        self.froze = False  # enable() froze the garbage collector's older objects (thawed by disable())
        self.dev = device  # its allocator's count is what the budget bounds (NOTE [ Native front end ] 8)
        self.rt = Runtime(budget, policy, memory=NativeMemory(), banish_depth=banish_depth, lazy_tracking=True,
                          tier=tier, device_usage=None if device is None else device.usage)
        self.readers: dict[int, list[Op]] = {}  # a constant's StorageImpl address -> recipes that read it
        self.consts: dict[int, int] = {}  # a constant's StorageImpl address -> bytes counted
        self.funcs: dict[str, Any] = {}  # "aten.mul.Tensor" -> the OpOverload (cost model misses)
        # leaves given the plain-gradient hook (by id, checked by identity), with the hook's handle: disable()
        # removes them (``unhook``), or every session would leave a hook (and itself) on every parameter
        self.hooked: dict[int, tuple[weakref.ref, Any]] = {}
        # out of memory (the kernel retries only with a device): a window of adjacent blocks first where the device
        # knows its layout (NOTE [ Device memory ] 4)
        self.evictor = None if device is None else OutOfMemory(self.rt, device, lambda v: v.data_ptr)

    # ------------------------------------------------------------------ called by the kernel
    def before(self, ins: list[Storage], need: int, name: str, dead: list[Storage], consts: list[tuple],
               writes: list[Storage], plain: int = 0, views: list | None = None) -> Any:
        """Ahead of an op: drop the handles that died, count new constants, make the inputs resident and lock
        them, decide how the op's in-place write is kept (NOTE [ Native front end ] 5), and reserve ``need``
        bytes. ``plain``: bytes plain ops made on the device since the last call (NOTE [ Device memory ] 2);
        ``views``: the ops the kernel queued since (``queued``). Returns the locked storages, and with ``writes``
        the way the write is kept."""
        rt = self.rt
        if views:
            self.queued(views)
        if plain:
            rt.add_outside(plain)
        for s in dead:
            rt.drop_ref(s)
        for t, key, nbytes in consts:
            self._see(t, key, nbytes, name)
        held = rt.acquire(ins) if ins else []
        mode = ""
        try:
            if len(writes) == 1:  # as eager/front.py: a new version, or a copy when the old value cannot be
                s = writes[0]     # recomputed but recipes read it (NOTE [ In-place mutation ] 1-3)
                mode = "version" if s.recomputable else "copy" if s.deps else "plain"
                if mode == "copy":
                    need += s.nbytes
            elif writes:
                mode = "pin"
                for s in writes:
                    self._overwritten(s, name)
            if rt.budget is not None:
                rt.reserve(need, name)
        except BaseException:
            rt.release(held)
            raise
        return (held, mode) if writes else held

    def ran(self, name: str, cost: float, ins: list[Storage], nbytes: list[int], values: list[Any], recipe: Any,
            held: list[Storage] | None, read: list[int], wrote: tuple | None, dead: list[Storage], plain: int = 0,
            views: list | None = None) -> tuple[list[Storage], int]:
        """After an op: advance the clock, record the recipe, count the new storages (one handle group each);
        ``wrote``: (the storage written in place, how it is kept, the new value's payload). The new version,
        if any, comes last. ``dead``: handle groups that died since the last call (dropped first, as if before
        the op); ``plain`` and ``views`` as for ``before``."""
        rt = self.rt
        if views:
            self.queued(views)
        if plain:
            rt.add_outside(plain)
        for s in dead:
            rt.drop_ref(s)
        try:
            mode = wrote[1] if wrote is not None else ""
            if mode == "plain" and wrote[0].host is not None:  # type: ignore[index]
                rt.overwritten(wrote[0])  # type: ignore[index]  # its copy in the host tier is stale now
            if not nbytes and mode not in ("version", "copy"):  # views, plain writes: no clock advance
                rt.ran(ins, 0.0, None, name)
                return [], self._room()
            old = wrote[0] if wrote is not None else None
            op = rt.ran(ins, cost, recipe, name, (old,) if mode == "version" else ())
            outs = []
            output = rt.output
            for n, v in zip(nbytes, values, strict=True):
                s = output(op, n, v)
                s.refs = 1
                outs.append(s)
            if mode == "version":  # the new value takes over the buffer (and the handles); the old one is evicted
                new = rt.new_version(old, op)
                new.payload = wrote[2]
                outs.append(new)
            elif mode == "copy":  # the old value stays resident in its copy
                outs.append(rt.new_version(old, op, wrote[2]))
            if op is not None and read:
                readers = self.readers
                for key in read:
                    lst = readers.get(key)
                    if lst is None:
                        readers[key] = [op]
                    else:
                        lst.append(op)
                        if len(lst) > _PRUNE and len(lst) & (len(lst) - 1) == 0:  # at powers of two
                            lst[:] = [o for o in lst if o.compute is not None]
        finally:
            if held:
                rt.release(held)
        budget = rt.budget
        if budget is not None and rt.memory.tracked + rt.memory.outside > budget:  # a prediction fell short
            rt.reserve(0, name)
        if rt.listeners:
            rt.emit("op", None)
        return outs, -1 if budget is None else self._room()

    def queued(self, views: list[tuple[list[Storage], str]]) -> None:
        """Ops that made no memory, queued by the kernel at no budget (front.cpp, rule 7), told in their order:
        each touches its inputs and counts, as ``ran`` would have at the time."""
        rt = self.rt
        for ins, name in views:
            rt.ran(ins, 0.0, None, name)
            if rt.listeners:
                rt.emit("op", None)

    def flush(self) -> None:
        """Tell the core what the kernel queued: first thing in every entry into the core but ``before`` and
        ``ran`` (which are handed the queue). The queue is the running session's (an earlier one has none)."""
        if self.active:
            views = self.ext.take_views()
            if views:
                self.queued(views)

    def _room(self) -> int:
        """Bytes free under the budget (-1: no budget): the kernel skips ``before`` for an op that fits. With a
        device, none once the core's next query of its allocator is due, so that ``before`` makes it."""
        rt = self.rt
        if rt.budget is None:
            return -1
        if self.dev is not None and rt.sync_due:
            return 0
        mem = rt.memory
        return rt.budget - rt.headroom - mem.tracked - mem.outside

    def oom(self, message: str, need: int, ins: list[Storage]) -> bool:
        """An op ran out of the device's memory (NOTE [ Native front end ] 8): evict at least what the allocator
        was asked for (and 1 MiB), a window of adjacent blocks first where the device knows its layout, never
        the op's inputs ``ins``; False when nothing was left to evict (the kernel re-raises)."""
        self.flush()
        self.ext.forget_room()
        rt = self.rt
        held = rt.acquire(ins) if ins else []
        try:
            return self.evictor.evict(RuntimeError(message), need)  # type: ignore[union-attr]
        finally:
            rt.release(held)

    def stepped(self) -> None:
        """An optimizer's step ended: its plain updates may have allocated (its state, on the first step)."""
        self.flush()
        self.ext.set_stepping(False)
        if self.dev is not None and self.rt.budget is not None:
            self.rt.sync()
            self.ext.forget_room()

    def release(self, held: list[Storage]) -> None:
        self.rt.release(held)

    def dropped(self, dead: tuple[Storage, ...]) -> None:
        """Handles of this (earlier) session died while another one runs."""
        for s in dead:
            self.rt.drop_ref(s)

    def cost(self, name: str, args: list[Any], outs: list[Any]) -> float:
        """The modelled cost of an op (NOTE [ Modelled costs ]); the kernel caches it per call signature."""
        func = self.funcs.get(name)
        if func is None:
            ns, packet, overload = name.split(".")
            func = self.funcs[name] = getattr(getattr(getattr(torch.ops, ns), packet), overload)
        schema = func._schema.arguments
        pos = [a for a, s in zip(args, schema, strict=False) if not s.kwarg_only]
        kw = {s.name: a for a, s in zip(args, schema, strict=False) if s.kwarg_only}
        flat = []
        for o in outs:
            flat.extend(o if isinstance(o, (list, tuple)) else [o])
        # the rates of the device the op ran on (NOTE [ Modelled costs ] 3), as eager/front.py chooses them
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in (*flat, *pos))
        with torch.utils._python_dispatch._disable_current_modes():
            return model_cost(func, tuple(pos), kw, flat, "cuda" if cuda else "cpu")

    def written(self, keys: list[int], name: str) -> None:
        """A constant that recipes read is about to be written (NOTE [ Changed constants ] 2)."""
        self.flush()
        rt = self.rt
        ops = [op for k in keys for op in self.readers.pop(k, ()) if op.compute is not None]
        if ops:
            self.ext.forget_room()  # bringing values back takes room
            rt.rescue(ops)
            rt.invalidate(ops, f"{name} wrote a constant it was computed from (an optimizer step, a write through "
                               f".data), so recomputing it would give another value")

    def constants_died(self, gone: list[tuple[int, int]]) -> None:
        self.flush()
        for key, nbytes in gone:
            if self.consts.pop(key, None) is not None:
                self.rt.remove_constant(nbytes)
            self.readers.pop(key, None)

    # ------------------------------------------------------------------ helpers
    def _see(self, t: torch.Tensor, key: int, nbytes: int, where: str) -> None:
        if key not in self.consts:
            self.rt.add_constant(nbytes, where)
            self.consts[key] = nbytes
        seen = self.hooked.get(id(t))
        if t.requires_grad and t.is_leaf and (seen is None or seen[0]() is not t):  # (an id is reused after a death)
            # gradients accumulated into a plain leaf come back plain (NOTE [ Managed vs constant ] 4)
            self.hooked[id(t)] = (weakref.ref(t), t.register_post_accumulate_grad_hook(self._plain_grad))

    def unhook(self) -> None:
        """Remove the plain-gradient hooks this session put on leaves (disable()); a gradient accumulated after
        that stays as the kernel made it, as under the Python front end."""
        for wr, handle in self.hooked.values():
            if wr() is not None:
                handle.remove()
        self.hooked.clear()

    def _plain_grad(self, p: torch.Tensor) -> None:
        g = p.grad
        if g is not None and self.ext.is_managed(g):
            # the session whose core keeps the gradient (one of an earlier session, read by this one's step)
            p.grad = self.ext.session_of(g).unwrap(g)

    def unwrap(self, t: torch.Tensor) -> torch.Tensor:
        """A plain tensor sharing ``t``'s memory; its storage is pinned (never evicted again)."""
        self.flush()
        s = self.ext.storage_of(t)
        if s is None:
            return t
        self.ext.forget_room()
        rt = self.rt
        if not s.resident:
            rt.rematerialize(s)
        rt.pin(s)
        return self.ext.plain(t)

    def _overwritten(self, s: Storage, name: str) -> None:
        """``s`` is about to be written in place: its readers' recipes and its own can no longer run."""
        rt = self.rt
        ops = [op for op in s.children if op.compute is not None]
        if ops:
            rt.rescue(ops)
            rt.invalidate(ops, f"{name} wrote in place a value it was computed from")
        rt.pin(s)
