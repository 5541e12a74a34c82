"""The Python half of the compiled front end: the core runtime and the calls the C++ kernel makes into it.

Every decision is the core's (``torch_dtr.core.Runtime``, the one the simulator drives): this module only
translates. The kernel (front.cpp) calls ``before`` ahead of an op when the op needs the core first (an
evicted input, a budget to reserve against, handle deaths to drop, new constants, a managed input it writes),
and ``ran`` after it: both are the core's ``Feed`` (NOTE [ Feed ] in core/feed.py); the rest of the kernel's calls
are here. NOTE [ Native front end ] in ``__init__.py``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..core import Op, Runtime, Storage, Tier
from ..core.feed import DroppingMemory, Feed
from ..core.policies import Policy
from ..eager.costs import model_cost
from ..eager.device import OutOfMemory
from ..eager.front import EVICT_MINIMUM

# NOTE [ Learned budgets ]
#
# 1. What: a session without a device traces its own calls into the core (NOTE [ Traces ] in sim/trace.py), in
#    memory, from enable() to the end of the ``LEARN_STEPS``-th optimizer step; then it stops tracing, and the
#    kernel's per-op path is the one of an untraced session again (``ext.rebind``, ``set_trace(False)``). Where
#    fewer steps end before ``LEARN_ROWS`` rows or before the session ends, it learns from the stretch up to the
#    last step's end, or from all it traced where no step ended (a program without an optimizer: inference, one
#    backward): what it ran, or its first ``LEARN_ROWS`` rows; not where a BudgetError cut the run short.
# 2. ``learned_budget()`` (``stats().learned_budget``): from the stretch traced up to the end of the last step
#    traced, the smallest budget at which its replay trains within ``THRASH_AT`` x one pass, plus 5% where the
#    replay trains there too (sim/trace.py, ``learned_budget``; NOTE [ Traces ] 5: for the steps after them). By
#    NOTE [ Traces ] 2 a session enabled with it where this one was enabled makes the replay's decisions, so it
#    trains that stretch: one retry is enough where the program repeats itself.
# 3. A BudgetError quotes one budget (``BudgetError.budget``; core ``Runtime.advise``): that one where it is above
#    the budget that failed; before any traced step ended, the one learned (rule 2) from the trace so far (the op
#    that failed included) replays, or 10% above that op's need where more, and it says that the rest of the
#    step may need more. Where the traced steps trained at the failing budget, the program left them (other
#    shapes, another branch): the op's own need, as without a trace.
# 4. Not learned: with a device (its allocator is not replayed: rule 4 there), in tenants (their calls are
#    theirs). The first steps run slower while traced (the kernel calls the core ahead of every op and the writer
#    keeps a row): 5-13 us per managed op on a 2-core CPU (2026-11-29, ``python benchmarks/learn_cost.py``: two
#    steps of an LSTM-cell loop 1.54x, of a small MLP 1.28x; nothing measurable where ops take milliseconds);
#    ``learn=False`` where that matters.
# 5. After the traced steps a program may hold more (a second model loaded from a checkpoint, longer sequences):
#    without a budget, what its peak rose by since learning stopped is added to the learned budget, read when
#    asked (``stats()``, a BudgetError). So the budget covers what the traced steps need plus that rise (the
#    hostile programs' state-dict round trip: docs/learned-budgets.md); not where the later steps need more room
#    than their peak rose by.

LEARN_STEPS = 2
LEARN_ROWS = 100_000


@contextlib.contextmanager
def _locked(ext: Any) -> Iterator[None]:
    """The kernel's lock (torch_dtr.native._core_locked)."""
    ext.lock_core()
    try:
        yield
    finally:
        ext.unlock_core()


class Session:
    """One native session: the core runtime and the C++ kernel's calls into it. A tenant (NOTE [ Tenants ]) is a
    session too, made by the running one's ``spawn``."""

    def __init__(self, ext: Any, budget: int | None, policy: str | Policy, banish_depth: int,
                 tier: Tier | None = None, device: Any = None, make_tier: Any = None) -> None:
        self.ext = ext
        self.epoch = -1  # its number in the kernel (``ext.start``, ``ext.start_tenant``)
        self.active = False  # managing this thread's ops (enable() to disable()); only then the kernel queues
        # NOTE [ Tenants ]: the session's total budget, its tenants and their shares (eager/tenants.py); a tenant's
        # ``session`` is the session it belongs to
        self.total = budget
        self.tenants: dict[str, Session] = {}
        self.shares: dict[str, float] = {"": 1.0}
        self.session: Session | None = None
        self._options = (policy, banish_depth, make_tier)
        self.trace: Any = None  # a sim.trace.Writer while the session's calls into the core are traced
        # NOTE [ Learned budgets ]: the writer keeping its rows, the row count at each step's end, the stretch
        # traced once LEARN_STEPS steps ended, and the last smallest budget computed (row count, bytes)
        self.learner: Any = None
        self.marks: list[int] = []
        self.learned: Any = None
        self._smallest: tuple[int, int] | None = None
        self._peak_learned: int | None = None  # the peak when learning stopped, without a budget (rule 5)
        self._failed = False  # a BudgetError was raised (what was traced then is not a whole run: rule 1)
        self._traced_calls: Any = None
        self.froze = False  # enable() froze the garbage collector's older objects (thawed by disable())
        self.dev = device  # its allocator's count is what the budget bounds (NOTE [ Native front end ] 8)
        self.rt = Runtime(budget, policy, memory=DroppingMemory(), banish_depth=banish_depth, lazy_tracking=True,
                          tier=tier, device_usage=None if device is None else device.usage,
                          evict_minimum=EVICT_MINIMUM)
        self.rt.fix = "torch_dtr.native.enable(budget={n}), or torch_dtr.native.set_budget({n}) while it runs"
        self.feed = feed = Feed(self.rt, device is not None)
        feed.see = self._see
        self.before, self.ran, self.queued = feed.before, feed.ran, feed.queued  # the kernel's per-op calls
        self.readers: dict[int, list[Op]] = feed.readers  # a constant's StorageImpl address -> recipes that read it
        self.consts: dict[int, int] = {}  # a constant's StorageImpl address -> bytes counted
        self.foreign: dict[int, int] = {}  # of those, not the CPU allocator's blocks (NOTE [ The CPU as a device ])
        self.funcs: dict[str, Any] = {}  # "aten.mul.Tensor" -> the OpOverload (cost model misses)
        # leaves given the plain-gradient hook (by id, checked by identity), with the hook's handle: disable()
        # removes them (``unhook``), or every session would leave a hook (and itself) on every parameter
        self.hooked: dict[int, tuple[weakref.ref, Any]] = {}
        # a compiled region ran eagerly on the CPU without a device: what lives outside is measured again as its
        # backward makes each gradient (NOTE [ Compiled regions under a budget ] 5)
        self.remeasure: Callable[[int], None] | None = None
        self.warned: set[str] = set()  # NOTE [ Unmanaged regions ]: what was said, once each
        self.unwatch: Any = lambda: None  # enable() watches for them (regions.watch)
        self.unwrap_fsdp: Any = lambda: None  # enable() wraps FSDP2's reshard (NOTE [ Resharded parameters ])
        # out of memory (the kernel retries only with a device): a window of adjacent blocks first where the device
        # knows its layout (NOTE [ Device memory ] 4)
        self.evictor = None if device is None else OutOfMemory(self.rt, device, lambda v: device.locate(v.data_ptr))
        if device is not None and device.cheap_layout:  # NOTE [ Layout-aware eviction ]
            self.rt.layout = self.evictor.victims  # type: ignore[union-attr]
        if tier is not None:
            tier.oom = self.evictor  # a copy back that runs out of the device's memory evicts and retries
            tier.device = device  # its host_copies() around the copies out

    # ------------------------------------------------------------------ called by the kernel
    # ``before``, ``ran`` and ``queued`` are the core's Feed (NOTE [ Feed ]): bound in __init__, so that the kernel
    # calls it directly (compiled with the compiled core)

    def flush(self) -> None:
        """Tell the core what the kernel queued and which handles died since its last call, as ``before`` and
        ``ran`` are told: first thing in every other entry into the core (``stats()`` then counts what a failed
        step left behind as gone). The queue is the running session's (an earlier one has none)."""
        if self.active:
            views = self.ext.take_views(self.epoch)
            if views:
                self.queued(views)
            dead = self.ext.take_dead(self.epoch)
            if dead and self.trace is not None:
                self.trace.dropped(dead)
            for s in dead:
                self.rt.drop_ref(s)

    def settle(self) -> None:
        """``flush`` under the kernel's lock, from Python outside any op (a compiled region's call): the values that
        died since the core last heard are freed before plain work allocates."""
        with _locked(self.ext):
            self.flush()

    def sweep(self) -> None:
        """Uncount the constants whose last tensor died now (the kernel finds them lazily: NOTE [ Native front end ]
        4); for ``stats()``. The caller holds the kernel's lock."""
        if self.active:
            gone = self.ext.sweep_constants(self.epoch)
            if gone:
                self.constants_died(gone)

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

    def plain(self, need: int, name: str, plain: int) -> int:
        """A plain op with ``need`` bytes of outputs on the device did not fit the room (front.cpp's reserve_plain):
        the core makes room for them; returns the room left."""
        self.flush()
        return self.feed.plain(need, name, plain)

    def stepped(self) -> None:
        """An optimizer's step ended: its plain updates may have allocated (its state, on the first step). Called
        from the step's hook, outside the kernel: it takes the kernel's lock, as a worker thread's managed op may
        be in flight (front.cpp, rule 4)."""
        with _locked(self.ext):
            self.flush()
            self.ext.set_stepping(0)
            self.rt.boundary()  # NOTE [ Iteration plans ] (core/plan.py)
            if self.trace is not None:
                self.trace.boundary()
            if self.dev is not None:
                self.dev.stepped()
            if self.dev is not None and self.rt.budget is not None:
                self.rt.sync()
                self.ext.forget_room()
            if self.learner is not None and self.learned is None:
                self._step_traced()

    # ------------------------------------------------------------------ NOTE [ Learned budgets ]
    def learn(self, writer: Any) -> None:
        """Trace this session's calls into ``writer`` (one that keeps its rows; before ``ext.start``) to learn the
        program's smallest budget (rule 1)."""
        self.learner = writer
        writer.rows_kept = self._learn_what_was_traced  # it kept all the rows it may (rule 1)
        self.rt.advise = self._advise
        self.trace_to(writer)

    def _step_traced(self) -> None:
        rows = self.learner.rows
        if rows is None:
            return
        self.marks.append(len(rows))
        if len(self.marks) >= LEARN_STEPS:
            self.learned = self.learner.trace(self.marks[-1])
            self._stop_learning()

    def _learn_what_was_traced(self) -> None:
        """Learning ends before ``LEARN_STEPS`` steps ended (the rows kept ran out, or the session ended): the
        stretch to learn from is up to the last step's end, or all of it where no step ended (rule 1)."""
        if self.learned is None and self.learner.rows is not None and (self.marks or not self._failed):
            self.learned = self.learner.trace(self.marks[-1] if self.marks else None)  # (not a run cut short)
        self._stop_learning()

    def _stop_learning(self) -> None:
        w = self.learner
        w.rows = None
        if self.rt.budget is None and self._peak_learned is None:
            self._peak_learned = self.rt.memory.peak  # rule 5
        if self.trace is w and w.file is None:  # tracing only to learn: the untraced per-op path again
            feed = self.feed
            self.trace = None
            self._traced_calls = (self.before, self.ran)  # (alive while the kernel may still be inside one)
            self.before, self.ran, self.queued = feed.before, feed.ran, feed.queued
            if self.active:
                self.ext.rebind(self.epoch)
                self.ext.set_trace(False)

    def traced_steps(self) -> int:
        return len(self.marks)

    def learned_budget(self, so_far: bool = False) -> int | None:
        """Rule 2: the smallest budget at which the stretch traced up to the last step's end replays (``so_far``:
        all the rows traced, a step or not); None before a step ended, or where nothing was learned."""
        from ..sim.trace import learned_budget

        if self.learned is not None:
            tr = self.learned
        elif self.learner is not None and (so_far or self.marks):
            tr = self.learner.trace(None if so_far else self.marks[-1])
        else:
            tr = None
        if tr is None or not tr.rows:
            return None
        if self._smallest is None or self._smallest[0] != len(tr.rows):
            self._smallest = (len(tr.rows), learned_budget(tr))
        n = self._smallest[1]
        if n is not None and not so_far and self._peak_learned is not None and self.rt.budget is None:
            n += max(0, self.rt.memory.peak - self._peak_learned)  # rule 5: the peak rose after the traced steps
        return n

    def _advise(self, n: int) -> tuple[int, str] | None:
        """The budget a BudgetError quotes (rule 3; the core's ``Runtime.advise``), given the core's own ``n``."""
        self._failed = True
        try:
            steps = len(self.marks)
            whole = self.learned_budget()
            if whole is not None:
                if self.rt.budget is not None and whole <= self.rt.budget:
                    return None
                from ..sim import trace

                what = f"the {steps} step(s) this session traced" if steps else "the ops this session traced first"
                return whole, (f"the budget learned from {what} (the smallest at which their replay trains, and "
                               f"{trace.MARGIN:.0%}): torch_dtr.stats().learned_budget")
            so_far = self.learned_budget(so_far=True)
        except Exception:  # (never hide the BudgetError behind a failed replay)
            return None
        if so_far is None:
            return None
        return max(so_far, n), ("what the program up to here needs, by the replay of this session's trace of it; the "
                                "rest of the step may need more: after one step without a budget, "
                                "torch_dtr.stats().learned_budget holds for the whole step")

    def pin(self, storages: list[Storage]) -> None:
        """An op returned a tensor without a strided storage (sparse, nested) that may hold these inside it, where
        no op on it can see them: never evict them (front.cpp, ``escaped``)."""
        rt = self.rt
        self.ext.forget_room()
        if self.trace is not None:
            self.trace.pinned(storages)
        for s in storages:
            if not s.resident:  # (evicted since the op ran, by a reservation its outputs' sizes made)
                rt.rematerialize(s)
            rt.pin(s)

    def release(self, held: list[Storage]) -> None:
        if self.trace is not None:
            self.trace.released(held)
        self.rt.release(held)

    def dropped(self, dead: tuple[Storage, ...]) -> None:
        """Handles of this session died while another one runs (an earlier session, another tenant); a tenant
        that runs takes the ops queued for it first (the core sees them in order)."""
        if self.active:
            views = self.ext.take_views(self.epoch)
            if views:
                self.queued(views)
        if self.trace is not None:
            self.trace.dropped(dead)
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
        if self.trace is not None:
            self.trace.written(keys, name)
        if self.feed.written(keys, name):
            self.ext.forget_room()  # values brought back took room

    def rebinding(self, t: torch.Tensor) -> None:
        """``t.data = v`` is about to rebind the constant ``t`` (NOTE [ Native exports ] 6): the recipes that read
        its storage are told as for a write to it (in every tenant whose recipes read it)."""
        key = t.untyped_storage()._cdata
        for s in (self, *self.tenants.values()):
            if key in s.readers:
                s.written([key], "t.data = ...")

    def resharding(self, tensors: list[torch.Tensor]) -> None:
        """FSDP2 is about to free these unsharded parameters' storages (NOTE [ Resharded parameters ]): the
        recipes that read them are invalidated (what they computed that is still needed is brought back and
        pinned), and the constants leave the count until an op reads them again."""
        keys = [t.untyped_storage()._cdata for t in tensors]
        self.written(keys, "FSDP's reshard")
        self.ext.forget_constants(self.epoch, keys)
        self.constants_died([(k, self.consts[k]) for k in keys if k in self.consts])

    def constants_died(self, gone: list[tuple[int, int]]) -> None:
        self.flush()
        if self.trace is not None:
            self.trace.constants_died(gone)
        for key, nbytes in gone:
            if self.consts.pop(key, None) is not None:
                self.rt.remove_constant(nbytes)
                if self.foreign and key in self.foreign:
                    self.dev.constant_gone(self.foreign.pop(key))  # type: ignore[union-attr]
            self.readers.pop(key, None)

    # ------------------------------------------------------------------ budgets and tenants (NOTE [ Tenants ])
    def set_budget(self, nbytes: int | None) -> None:
        """This session's own budget (a tenant's share of the total, or the whole); evicts to fit it now."""
        with _locked(self.ext):
            self.flush()
            self.rt.set_budget(nbytes)
            self.ext.set_budget(self.epoch, -1 if nbytes is None else nbytes)
            if self.dev is not None and self.session is None:
                self.dev.budget_set(nbytes)

    def spawn(self) -> Session:
        """A tenant of this session, running: its options, its own core; its host tier shares this session's host
        budget (NOTE [ Host copies ] 8)."""
        policy, banish_depth, make_tier = self._options
        tier = None if make_tier is None else make_tier()
        if tier is not None:
            tier.pool = self.rt.tier.pool  # type: ignore[union-attr]
        t = Session(self.ext, None, policy, banish_depth, tier, self.dev, make_tier)
        t.rt.fix = self.rt.fix
        t.session = self
        with _locked(self.ext):
            t.epoch = self.ext.start_tenant(t, -1)
        t.active = True
        return t

    def stop(self) -> None:
        """``disable()``: this session and its tenants take what the kernel queued, stop, and lift their budgets (so
        that values held later come back without one)."""
        family = [self, *self.tenants.values()]
        for s in family:
            s.flush()
        if self.learner is not None and self.learned is None:
            self._learn_what_was_traced()
        for s in family:
            s.active = False
        self.ext.stop()
        for s in family:
            s.unhook()
            s.rt.set_budget(None)
        if self.dev is not None:
            self.dev.budget_set(None)

    def trace_to(self, writer: Any) -> None:
        """Write every call this session makes into the core to ``writer`` (NOTE [ Traces ] in sim/trace.py); before
        ``ext.start``, which binds the kernel's per-op calls."""
        feed = self.feed
        self.trace = writer

        def before(ins: list[Storage], need: int, name: str, dead: list[Storage], consts: list[Any],
                   writes: list[Storage], plain: int = 0, views: Any = None) -> Any:
            writer.before(ins, need, name, dead, consts, writes, plain, views)
            return feed.before(ins, need, name, dead, consts, writes, plain, views)

        def ran(name: str, cost: float, ins: list[Storage], nbytes: list[int], values: list[Any], recipe: Any,
                held: Any, read: list[int], wrote: Any, dead: list[Storage], plain: int = 0,
                views: Any = None) -> tuple[list[Storage], int]:
            out = feed.ran(name, cost, ins, nbytes, values, recipe, held, read, wrote, dead, plain, views)
            writer.ran(name, cost, ins, nbytes, recipe is not None, read, wrote, dead, plain, views, out[0])
            return out

        def queued(views: Any) -> None:
            writer.queued(views)
            feed.queued(views)

        self.before, self.ran, self.queued = before, ran, queued

    # ------------------------------------------------------------------ helpers
    def _see(self, t: torch.Tensor, key: int, nbytes: int, where: str) -> None:
        if key not in self.consts:
            self.rt.add_constant(nbytes, where)  # (room made first: then the device's count takes it)
            self.consts[key] = nbytes
            beside = self.dev.constant_seen(t, nbytes) if self.dev is not None else 0
            if beside:  # NOTE [ The CPU as a device ] 2
                self.foreign[key] = beside
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
            if self.remeasure is not None:
                self.remeasure(p.grad.untyped_storage().nbytes())

    def unwrap(self, t: torch.Tensor) -> torch.Tensor:
        """A plain tensor sharing ``t``'s memory; its storage is pinned (never evicted again)."""
        self.flush()
        s = self.ext.storage_of(t)
        if s is None:
            return t
        self.ext.forget_room()
        rt = self.rt
        if self.trace is not None:
            self.trace.pinned([s])
        if not s.resident:
            rt.rematerialize(s)
        rt.pin(s)
        return self.ext.plain(t)
