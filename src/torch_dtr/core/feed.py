"""The core's per-op entry for a front end whose mechanism is compiled code (``torch_dtr.native``).

# NOTE [ Feed ]
#
# 1. What: the translation from a compiled kernel's per-op calls (``before`` ahead of an op, ``ran`` after it,
#    ``queued`` for the ops it held back) into the runtime's verbs, in the order the Python front end makes
#    them, so that both front ends decide alike. It holds no rule of its own: every decision is the runtime's.
# 2. Why here and not in the front end's package: it runs once or twice per managed op, and with the compiled
#    core (NOTE [ Compiled core ]) mypyc compiles it with the runtime, so the hot path has no interpreted frame
#    between the kernel and the runtime. It is torch-free: payloads, recipes and constants are opaque objects
#    and integer keys; what needs torch (counting a new constant, the plain-gradient hook) is the front end's
#    ``see`` callback.
# 3. ``DroppingMemory``: the runtime's byte count, which also tells a storage's payload to drop its data when
#    the runtime stops counting it (evicted or released): the native front end's handles keep the storage
#    object, without data (NOTE [ Native front end ] 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .memory import Memory
from .records import Op, Storage
from .runtime import Runtime

# Recipes that read a constant die with their outputs; the lists of readers are pruned now and then.
_PRUNE = 64


class DroppingMemory(Memory):
    """Counts bytes as ``Memory`` does; a payload freed from the count drops its data (rule 3)."""

    __slots__ = ()

    def free(self, s: Storage) -> None:
        super().free(s)
        p = s.payload
        if p is not None:
            p.drop()


def _ignore(t: Any, key: int, nbytes: int, where: str) -> None:
    raise AssertionError("Feed.see was not set")  # pragma: no cover


class Feed:
    """The runtime's per-op entry for the native front end (rule 1). ``device``: a device allocator is
    followed, so the room the kernel may use is none once the runtime's next query of it is due."""

    def __init__(self, rt: Runtime, device: bool) -> None:
        self.rt = rt
        self.device = device
        self.readers: dict[int, list[Op]] = {}  # a constant's key (its StorageImpl's address) -> recipes reading it
        # a new constant an op reads: (tensor, key, bytes, op name); the front end counts it (and hooks a leaf)
        self.see: Callable[[Any, int, int, str], None] = _ignore

    def before(self, ins: list[Storage], need: int, name: str, dead: list[Storage], consts: list[tuple[Any, int, int]],
               writes: list[Storage], plain: int = 0,
               views: list[tuple[list[Storage], str]] | None = None) -> Any:
        """Ahead of an op: drop the handles that died, count new constants, make the inputs resident and lock
        them, decide how the op's in-place write is kept (NOTE [ Native front end ] 5), and reserve ``need``
        bytes. ``plain``: bytes plain ops made on the device since the last call (NOTE [ Device memory ] 2);
        ``views``: the ops the kernel queued since (``queued``). Returns the locked storages, and with ``writes``
        the way the write is kept."""
        rt = self.rt
        self._catch_up(views, plain, dead)
        for t, key, nbytes in consts:
            self.see(t, key, nbytes, name)
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
                    self.overwritten(s, name)
            if rt.budget is not None:
                rt.reserve(need, name)
        except BaseException:
            rt.release(held)
            raise
        if writes:
            return (held, mode)
        return held

    def ran(self, name: str, cost: float, ins: list[Storage], nbytes: list[int], values: list[Any], recipe: Any,
            held: list[Storage] | None, read: list[int], wrote: tuple[Storage, str, Any] | None,
            dead: list[Storage], plain: int = 0,
            views: list[tuple[list[Storage], str]] | None = None) -> tuple[list[Storage], int]:
        """After an op: advance the clock, record the recipe, count the new storages (one handle group each);
        ``wrote``: (the storage written in place, how it is kept, the new value's payload). The new version,
        if any, comes last. ``dead``: handle groups that died since the last call (dropped first, as if before
        the op); ``plain`` and ``views`` as for ``before``. Returns the new storages and the room left under the
        budget (``room``)."""
        rt = self.rt
        self._catch_up(views, plain, dead)
        outs: list[Storage] = []
        old: Storage | None = None
        mode = ""
        payload: Any = None
        if wrote is not None:
            old, mode, payload = wrote
        if len(values) != len(nbytes):
            raise ValueError(f"Feed.ran: {len(nbytes)} sizes for {len(values)} values")
        try:
            if mode == "plain" and old is not None and old.host is not None:
                rt.overwritten(old)  # its copy in the host tier is stale now
            if not nbytes and mode != "version" and mode != "copy":  # views, plain writes: no clock advance
                rt.ran(ins, 0.0, None, name)
                return outs, self.room()
            op = rt.ran(ins, cost, recipe, name, (old,) if mode == "version" and old is not None else ())
            for i in range(len(nbytes)):
                s = rt.output(op, nbytes[i], values[i])
                s.refs = 1
                outs.append(s)
            if old is not None:
                if mode == "version":  # the new value takes over the buffer (and the handles); the old one is evicted
                    new = rt.new_version(old, op)
                    new.payload = payload
                    outs.append(new)
                elif mode == "copy":  # the old value stays resident in its copy
                    outs.append(rt.new_version(old, op, payload))
            if op is not None and read:
                readers = self.readers
                for key in read:
                    lst = readers.get(key)
                    if lst is None:
                        readers[key] = [op]
                    else:
                        lst.append(op)
                        n = len(lst)
                        if n > _PRUNE and n & (n - 1) == 0:  # at powers of two
                            lst[:] = [o for o in lst if o.compute is not None]
        finally:
            if held:
                rt.release(held)
        budget = rt.budget
        if budget is not None:
            if rt.memory.tracked + rt.memory.outside > budget:  # a prediction fell short
                rt.reserve(0, name)
            rt.ahead()
        if rt.listeners:
            rt.emit("op", None)
        if budget is None:
            return outs, -1
        return outs, self.room()

    def _catch_up(self, views: list[tuple[list[Storage], str]] | None, plain: int, dead: list[Storage]) -> None:
        """What happened since the kernel's last call, in its order: the queued ops, plain ops' device bytes,
        the handles that died."""
        if views:
            self.queued(views)
        if plain:
            self.rt.add_outside(plain)
        for s in dead:
            self.rt.drop_ref(s)

    def queued(self, views: list[tuple[list[Storage], str]]) -> None:
        """Ops that made no memory, queued by the kernel at no budget (NOTE [ Native front end ] 10), told in
        their order: each touches its inputs and counts, as ``ran`` would have at the time."""
        rt = self.rt
        for ins, name in views:
            rt.ran(ins, 0.0, None, name)
            if rt.listeners:
                rt.emit("op", None)

    def plain(self, need: int, name: str, plain: int) -> int:
        """Ahead of a plain op whose ``need`` bytes of outputs land on the device (an optimizer's state, a factory):
        count what plain ops made there since the last call, ``plain``, and evict for ``need`` (or raise a
        ``BudgetError`` before the op allocates). Returns the room left (``room``), the op's outputs not counted."""
        rt = self.rt
        if plain:
            rt.add_outside(plain)
        rt.reserve(need, f"{name} (a plain op)")
        return self.room()

    def room(self) -> int:
        """Bytes free under the budget (-1: no budget): the kernel skips ``before`` for an op that fits. With a
        device, none once the runtime's next query of its allocator is due, so that ``before`` makes it."""
        rt = self.rt
        budget = rt.budget
        if budget is None:
            return -1
        if self.device and rt.sync_due:
            return 0
        mem = rt.memory
        return budget - rt.headroom - mem.tracked - mem.outside

    def overwritten(self, s: Storage, name: str) -> None:
        """``s`` is about to be written in place: its readers' recipes and its own can no longer run."""
        rt = self.rt
        ops = [op for op in s.children if op.compute is not None]
        if ops:
            rt.rescue(ops)
            rt.invalidate(ops, f"{name} wrote in place a value it was computed from")
        rt.pin(s)

    def written(self, keys: list[int], name: str) -> bool:
        """A constant that recipes read is about to be written (NOTE [ Changed constants ] 2): rescue and drop
        the live recipes that read it; whether there were any (values may have been brought back)."""
        readers = self.readers
        ops = [op for k in keys for op in readers.pop(k, ()) if op.compute is not None]
        if not ops:
            return False
        rt = self.rt
        rt.rescue(ops)
        rt.invalidate(ops, f"{name} wrote a constant it was computed from (an optimizer step, a write through "
                           f".data), so recomputing it would give another value")
        return True
