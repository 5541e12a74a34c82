"""The DTR runtime: records recipes, keeps tracked bytes within a budget, evicts, rematerializes.

It imports no torch. A driver (``torch_dtr.eager`` live, ``torch_dtr.sim`` for logs, the core's tests)
talks to it only through these verbs, and never writes a record's fields:

    held = rt.acquire(inputs)                  # rematerialize what is missing, lock every input
    try:
        rt.reserve(nbytes_of_outputs, where)   # evict until the outputs fit
        ... run the op ...
        op = rt.ran(inputs, cost, compute)     # count it, advance the clock; the recipe (None: no recipe);
                                               # writes=[...]: inputs the recipe writes in place
        s = rt.output(op, nbytes, payload)     # one storage per distinct output storage
    finally:
        rt.release(held)                       # unlock
    rt.add_ref(s) / rt.drop_ref(s)             # handles (tensors, log names) on a storage

plus ``new_version`` (in-place writes), ``add_constant``, ``pin``, ``get``/``rematerialize``/``bring``, ``evict``,
``evict_some``/``out_of_memory`` (out-of-memory retries), ``sync``/``add_outside`` (a device's allocator count),
``set_cost``, ``set_budget``, ``stranded``/``invalidate`` (an input
of recipes changed) and ``listen`` (observers of its events).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import eviction, lifetimes, remat, versions
from .errors import FIX, Advise, BudgetError, InternalError, fmt_bytes, internal_assert
from .eviction import choose, evict_storage
from .lifetimes import awaited, orphaned, release
from .memory import Drop, Memory
from .plan import Iterations
from .policies import DEFAULT_POLICY, Policy, get_policy
from .records import Op, Storage, UnheldPlan
from .swap import Tier
from .trackers import TRACKERS

__all__ = ["BudgetError", "InternalError", "Listener", "Runtime", "Stats", "fmt_bytes", "internal_assert"]

# NOTE [ The single-op floor ]
#
# 1. While an op runs, its inputs and outputs must be resident, and so must everything that cannot be
#    evicted: constants (parameters, gradients, optimizer state, inputs the program holds as plain
#    tensors) and pinned storages. The largest such sum over the ops of a program is a lower bound on any
#    schedule's memory, recomputing or not: the single-op floor.
# 2. ``ran`` starts the sum for each op (unevictable bytes now, plus its distinct unpinned inputs) and
#    ``output`` adds each new storage; ``floor`` keeps the largest so far (``Stats.floor_bytes``), and
#    ``BudgetError`` quotes it: a budget below it cannot be kept by any eviction policy.
#    An op whose own reservation fails (nothing but constants, pinned storages and its own locked inputs
#    left) sets the floor too, before the error is raised.
# 3. It is measured on the run itself (under a budget, what is pinned can differ from an unlimited run).
#    The exact smallest budget of a recorded step is the ILP's (``sim.checkmate``), where it solves.

Listener = Callable[[str, "Storage | None"], None]
"""An observer of runtime events: ``fn(kind, storage)`` with kind "evict", "drop", "remat", "release", or
"op" (a driver finished an op; storage ``None``). It may raise to stop the program (e.g. a thrash cap)."""


@dataclass(frozen=True)
class Stats:
    budget_bytes: int | None
    resident_bytes: int  # tracked bytes now (resident managed storages + constants)
    peak_bytes: int
    constant_bytes: int
    evictions: int  # storages evicted by the policy to make room
    drops: int  # storages evicted because their last handle died (NOTE [ Lifetimes ] 3)
    rematerializations: int  # recipes run again
    remat_seconds: float
    search_seconds: float
    ops: int  # ops run by the driver (managed ops of the program)
    live_storages: int  # records held (resident or evicted)
    floor_bytes: int = 0  # the single-op floor so far (NOTE [ The single-op floor ])
    floor_op: str = ""  # the op that set it
    banished: int = 0  # recipes dropped by banishing (NOTE [ Banishing ])
    # on a device with an allocator (NOTE [ Budget accounting ] 4): its bytes the runtime does not track, as
    # last learned; peak_bytes and budget_bytes then include them
    outside_bytes: int = 0
    syncs: int = 0  # allocator queries (``Runtime.sync``)
    oom_retries: int = 0  # ops and recomputations retried after the allocator ran out of memory
    oom_evicted_bytes: int = 0  # bytes evicted to make those retries fit
    # the most the device's allocator was found holding above the budget (NOTE [ Budget accounting ] 6; 0: never)
    excess_bytes: int = 0
    # the host tier (NOTE [ Swapping ]): copies out and back, the bytes it holds now and at most
    swaps_out: int = 0
    swaps_in: int = 0
    host_bytes: int = 0
    host_peak_bytes: int = 0
    # a front end that learns the program (NOTE [ Learned budgets ]): the optimizer steps it traced, and the smallest
    # budget at which their replay trains (where no step ended: what it traced; None: nothing learned yet)
    traced_steps: int = 0
    learned_budget: int | None = None
    # NOTE [ Iteration plans ]: iterations ended (optimizer steps), those that followed the plan of the one before
    # to their end, and those that left it
    iterations: int = 0
    planned: int = 0
    diverged: int = 0
    ahead: int = 0  # evicted values a plan brought back ahead of their reader (NOTE [ Iteration plans ] 7)


















class Runtime:
    def __init__(
        self,
        budget: int | None,
        policy: str | Policy = DEFAULT_POLICY,
        *,
        sample_sqrt: bool = False,
        min_evict_bytes: int | None = None,
        evict_minimum: int = 0,
        memory: Memory | None = None,
        victim: Drop | None = None,
        device_usage: Callable[[], tuple[int, int]] | None = None,
        sync_every: int = 64,
        seed: int = 0,
        banish_depth: int = 0,
        lazy_tracking: bool = False,
        tier: Tier | None = None,
        plans: bool = True,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self.fix = FIX  # the calls a BudgetError suggests (the native front end names its own)
        self.advise: Advise | None = None  # a better budget to suggest (``suggest``)
        self.banish_depth = banish_depth  # NOTE [ Banishing ]; 0 (the default): never
        self.banished = 0  # recipes dropped by banishing
        self.banished_bytes = 0  # resident bytes pinned by banishing
        self.peak_limit = budget  # the largest budget in force since the peak was last reset (check())
        self.policy = get_policy(policy)
        self.tracker = TRACKERS[self.policy.extra]()
        self.tracking = not lazy_tracking  # NOTE [ Lazy tracking ]
        self.sample_sqrt = sample_sqrt
        self.min_evict_bytes = min_evict_bytes
        self.evict_minimum = evict_minimum  # NOTE [ The smallest victim ]: smaller storages are never evicted
        self.memory = memory or Memory()
        self.victim = victim or Drop()
        self.tier = tier  # NOTE [ Swapping ]: a victim may be copied there instead of dropped
        self.swap_cost = 0.0  # modelled cost of the copies (out, unless they overlap, and back)
        # NOTE [ Budget accounting ] 4: the device allocator's bytes in use now and at their peak, queried at
        # most every ``sync_every`` ops that reserve, and before a BudgetError (never per op: 30-360 us each)
        self.device_usage = device_usage
        self.sync_every = sync_every
        self.syncs = 0
        self.headroom = 0  # bytes kept free below the budget for what the count missed between syncs (rule 6)
        self.excess = 0  # the most the allocator's peak was found above the budget (rule 6)
        self._device_peak = -1  # the allocator's peak at the last sync
        self._dirty = False  # the outside count grew by guesses since the last sync (plain outputs, freed pins)
        self._synced: tuple[int, int, int] | None = None  # (ops, tracked, outside) right after the last sync
        self._next_sync = 0 if device_usage is not None else 1 << 62  # self.ops at which reserve() syncs next
        self.oom_retries = self.oom_evicted_bytes = 0
        self.rng = random.Random(seed)
        self.candidates: dict[Storage, None] = {}  # resident, evictable storages (insertion-ordered set)
        self.candidate_bytes = 0
        self.movable: dict[Storage, None] = {}  # resident pinned storages a tier may copy out (Swapping 9)
        self.movable_bytes = 0
        self.live: dict[Storage, None] = {}  # every storage not yet released
        self.clock = 0.0
        self.next_sid = 0
        self.evictions = self.drops = self.rematerializations = self.ops = self.aheads = 0
        self.remat_seconds = self.search_seconds = 0.0
        self.remat_cost = 0.0  # summed recipe cost of rematerializations (the simulator's overhead)
        self.scored = 0  # candidates scored by the eviction search (policy metadata accesses)
        self.listeners: list[Listener] = []
        self.floor = 0  # NOTE [ The single-op floor ]
        self.floor_op = ""
        self._need = 0  # what the op being run needs resident: the unevictable bytes, its inputs, outputs
        self._need_op = ""
        self.recomputing = False  # reserve() is making room for a recomputation or a copy back
        self.unheld: UnheldPlan | None = None  # a plan running without holding its values (remat.py)
        self.awaiting: dict[Storage, None] = {}  # kept without handles for an evicted output (Lifetimes 3)
        self._score = math.inf  # the score of ``policy_victim``'s last choice
        # victims a device's layout offers for a request of so many bytes (adjacent blocks whose freeing makes one
        # block it can use), evicted before the policy's when the budget needs room (NOTE [ Layout-aware
        # eviction ] in eager/device.py)
        self.layout: Callable[[int], Sequence[Storage]] | None = None
        # NOTE [ Iteration plans ] (plan.py): recorded under a budget only; ``plans=False``: boundaries ignored
        self.iterations = Iterations(budget is not None)
        self.plans = plans

    # ------------------------------------------------------------------ observers
    def listen(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(kind, storage)`` on every event from now on; returns a function that stops it."""
        self.listeners.append(fn)

        def remove() -> None:
            if fn in self.listeners:
                self.listeners.remove(fn)

        return remove

    def emit(self, kind: str, s: Storage | None) -> None:
        for fn in self.listeners:
            fn(kind, s)

    # ------------------------------------------------------------------ the per-op verbs
    def acquire(self, storages: Sequence[Storage], *, resident_first: bool = True) -> list[Storage]:
        """Make every storage resident and lock it for the op about to run; returns the locked storages,
        to be handed to ``release`` when the op is done (also when it raised).

        The resident ones are locked first, so that rematerializing the others cannot evict them; then the
        others are rematerialized in order (bringing one back may already have brought back another). If
        that cannot keep the budget, the locks are dropped and all of them are brought back together by one
        plan whose steps may evict the resident ones (``bring``; NOTE [ Planned rematerialization ] 4).
        ``resident_first=False`` instead rematerializes and locks one storage after the other, in order, as
        the DTR authors' simulator does (``sim.replay`` follows it so that its overheads compare with theirs).
        """
        held: list[Storage] = []
        missing: list[Storage] = []
        try:
            for s in storages:
                if s.resident and resident_first:
                    s.locks += 1
                    held.append(s)
                else:
                    missing.append(s)
            for s in missing:
                if not s.resident:
                    if resident_first:
                        remat.bring(self, [s])
                    else:
                        remat.rematerialize(self, s)
                s.locks += 1
                held.append(s)
        except BudgetError:
            self.release(held)
            if not (missing and resident_first):
                raise
            remat.bring(self, storages, hold=False)  # may raise BudgetError again, with nothing locked
            held = list(storages)
            self.lock(held)
        except BaseException:
            self.release(held)
            raise
        return held

    def release(self, held: Sequence[Storage]) -> None:
        for s in held:
            s.locks -= 1

    def ran(self, inputs: Sequence[Storage], cost: float, compute: Callable[..., Sequence[Any]] | None = None,
            name: str = "", writes: Sequence[Storage] = ()) -> Op | None:
        """An op just ran on ``inputs``: count it, advance the clock by ``cost`` and touch the inputs. With a
        ``compute``, record its recipe and return it; every recipe must then get at least one output
        (``output`` or ``new_version``), or its inputs would keep a dependent forever."""
        self.ops += 1
        self.clock += cost
        now = self.clock
        op = None if compute is None else Op(inputs, cost, compute, name, writes)
        # constants and pinned storages (the floor's sum), less those pinned by banishing (NOTE [ Banishing ] 5)
        # (with a tier, pinned values it may copy out are evictable: NOTE [ Swapping ] 9)
        mem = self.memory
        tier = self.tier is not None
        need = mem.tracked + mem.outside - self.candidate_bytes - (self.movable_bytes if tier else self.banished_bytes)
        if op is not None:  # (its inputs a typed tuple: compiled, the loop indexes it without an iterator)
            for s in op.inputs:  # distinct
                s.last_access = now
                if not s.pinned or (s.moves if tier else s.banished):
                    need += s.nbytes
                s.deps += 1
                s.children.append(op)
            if self.iterations.recording:
                self.iterations.ran(op.inputs, cost, name)
        else:
            distinct: Any = inputs if len(inputs) < 2 else dict.fromkeys(inputs)
            for s in distinct:
                s.last_access = now
                if not s.pinned or (s.moves if tier else s.banished):
                    need += s.nbytes
            if self.iterations.recording:
                self.iterations.ran(list(distinct), cost, name)
        self._need, self._need_op = need, name
        if need > self.floor:
            self.floor, self.floor_op = need, name
        return op

    def output(self, op: Op | None, nbytes: int, payload: Any) -> Storage:
        """A new resident storage produced by ``op``; with ``op=None`` it is pinned (never recomputed)."""
        s = self._storage(op, nbytes, payload)
        self.memory.alloc(s)
        self._need += nbytes
        if self._need > self.floor:
            self.floor, self.floor_op = self._need, self._need_op
        return s

    def _storage(self, op: Op | None, nbytes: int, payload: Any) -> Storage:
        s = Storage(self.next_sid, nbytes, payload, op, op is None)
        self.next_sid += 1
        s.last_access = self.clock
        if op is not None:
            if self.iterations.recording:
                self.iterations.made(s)
            op.outputs.append(s)
            op.live += 1
        self.live[s] = None
        if op is not None:  # (add_candidate, inlined: this runs for every new value)
            self.candidates[s] = None
            self.candidate_bytes += nbytes
        return s

    def get(self, s: Storage) -> Any:
        """The payload of ``s``, rematerialized first when evicted."""
        if not s.resident:
            remat.rematerialize(self, s)
        return s.payload

    def boundary(self) -> None:
        """An iteration of the program ended (an optimizer step): it becomes the plan the next one follows while
        it matches (NOTE [ Iteration plans ] in plan.py)."""
        if self.plans:
            self.iterations.boundary(self.live, self.remat_cost + self.swap_cost, self.budget is not None,
                                     self.evictions)

    def ahead(self) -> None:
        """After an op's outputs were counted: while the iteration follows its plan and something was evicted in it,
        bring back ahead of need what the next ops will read, where it fits (NOTE [ Iteration plans ] 7 in plan.py)."""
        it = self.iterations
        if (it.following and self.evictions != it.evictions and self.budget is not None
                and self.remat_cost + self.swap_cost - it.spent < it.elapsed):
            remat.ahead(self)

    def set_cost(self, op: Op, cost: float) -> None:
        """Replace ``op``'s cost by a better measurement (CUDA events), unless the old one is already summed
        into the tracker's state (an output in an evicted union-find set)."""
        if op.compute is not None and not any(self.tracker.grouped(o) for o in op.outputs):
            op.cost = cost

    # ------------------------------------------------------------------ handles and lifetimes
    def add_ref(self, s: Storage) -> None:
        s.refs += 1

    def drop_ref(self, s: Storage) -> None:
        """One handle on ``s`` died. Handles on an old version count on its newest (``new_version``)."""
        while s.forward is not None:
            s = s.forward
        s.refs -= 1
        if s.refs:
            if s.refs < 0:
                internal_assert(False, f"negative handle count on {s}")
        else:
            op = s.op
            if s.deps == 0:
                release(self, s)
            else:
                if s.resident and not s.pinned and s.locks == 0:
                    if awaited(s):
                        s.awaits = True
                        self.awaiting[s] = None
                    else:
                        evict_storage(self, s, "drop")
                if self.banish_depth:
                    orphaned(self, s)
            if not s.resident and op is not None:  # inputs without handles kept for its recipe are dropped
                for i in op.inputs:
                    if i.refs == 0 and i.resident and not i.locks and not i.pinned and not awaited(i):
                        evict_storage(self, i, "drop")

    # ------------------------------------------------------------------ constants
    def add_constant(self, nbytes: int, where: str = "") -> None:
        """Count a constant storage (already in memory) against the budget, evicting to make room."""
        self.reserve(nbytes, where)
        self.memory.add_constant(nbytes)

    def remove_constant(self, nbytes: int) -> None:
        self.memory.remove_constant(nbytes)

    # ------------------------------------------------------------------ in-place writes
    def new_version(self, old: Storage, op: Op | None, payload: Any = None) -> Storage:
        """``op`` wrote ``old``'s value in place: the written value becomes a new storage."""
        return versions.new_version(self, old, op, payload)

    def overwritten(self, s: Storage) -> None:
        """The driver wrote the pinned ``s`` in place without a new version (nothing reads it): a copy of it in the tier
        holds the old value and goes (NOTE [ Swapping ] 9)."""
        versions.overwritten(self, s)

    def pin(self, s: Storage, movable: bool = False) -> None:
        """Never drop ``s`` from now on: its memory is shared with something the runtime cannot see, or (``movable``)
        its recipe can no longer run, and then a tier may still copy it out (NOTE [ Swapping ] 9)."""
        lifetimes.pin(self, s, movable)

    # ------------------------------------------------------------------ changed inputs
    def stranded(self, ops: Sequence[Op]) -> list[Storage]:
        """The evicted storages with handles that ``invalidate(ops)`` would lose, oldest first
        (NOTE [ Changed inputs ] 2)."""
        return versions.stranded(self, ops)

    def rescue(self, ops: Sequence[Op]) -> None:
        """Bring back and pin what ``invalidate(ops)`` would lose that something holds (NOTE [ Changed inputs ] 2),
        until nothing is left: bringing one back may evict another value that the walk passed through. The pins are
        movable: only the runtime holds these values (NOTE [ Swapping ] 9)."""
        versions.rescue(self, ops)

    def invalidate(self, ops: Sequence[Op], why: str) -> None:
        """The recipes of ``ops`` can no longer run (``why``): pin their resident outputs, lose the evicted ones and
        what was computed from them, release what nothing needs now (NOTE [ Changed inputs ] 3)."""
        lifetimes.invalidate(self, ops, why)

    # ------------------------------------------------------------------ budget and eviction
    def set_budget(self, budget: int | None) -> None:
        """Change the budget and evict until tracked bytes fit it; if they cannot, the old budget stays and
        ``BudgetError`` says why."""
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}")
        old, self.budget = self.budget, budget
        try:
            self.reserve(0, "the new budget")
        except BaseException:
            self.budget = old
            raise
        if budget is None:  # nothing to plan for (NOTE [ Iteration plans ] 6)
            self.iterations.stop()
        if self.peak_limit is not None:
            self.peak_limit = None if budget is None else max(self.peak_limit, budget)

    def reserve(self, nbytes: int, where: str = "") -> None:
        """Evict until ``nbytes`` more fit within the budget; raise ``BudgetError`` when they cannot.
        ``where`` names what needs the bytes, for the error message."""
        mem = self.memory
        if self.ops >= self._next_sync:  # never without a device (NOTE [ Budget accounting ] 4)
            self.sync()
        if self.budget is None:
            return
        limit = self.budget - self.headroom
        if self._dirty and mem.tracked + mem.outside + nbytes > limit:
            self.sync()  # plain ops added to the outside count since the last query: most of it may be gone
        tier = self.tier
        layout = self.layout
        while mem.tracked + mem.outside + nbytes + (tier.pending if tier is not None else 0) > limit:
            if tier is not None and tier.pending:  # copies out in flight hold device bytes (NOTE [ Swapping ] 6)
                tier.settle(False)
                if tier.pending and mem.tracked + mem.outside + nbytes + tier.pending > limit:
                    tier.settle(True)
                continue
            if layout is not None:  # NOTE [ Layout-aware eviction ]: once per call
                victims, layout = layout(nbytes) if nbytes > 0 else (), None
                cands, u = self.candidates, self.unheld
                for s in victims:  # (not what an unheld plan's next steps read: the policy keeps those last too)
                    if s in cands and s.resident and not s.locks and not (u is not None and u.reads.get(s)):
                        evict_storage(self, s, "evict")
                continue
            victim = choose(self)
            if victim is None:
                # the device's count may be stale (tensors outside died since): learn it before giving up
                if self.device_usage is not None and self._synced != (self.ops, mem.tracked, mem.outside):
                    self.sync()
                    continue
                self._raise_budget(nbytes, where)
            assert victim is not None  # (_raise_budget raised)
            evict_storage(self, victim, "evict")

    @property
    def sync_due(self) -> bool:
        """Whether the next ``reserve`` queries the device (a driver that skips ``reserve`` for ops that fit asks)."""
        return self.ops >= self._next_sync

    def sync(self) -> None:
        """Learn the device's bytes in use from its allocator: what the runtime does not track is ``outside``
        (NOTE [ Budget accounting ] 4). For drivers after the device's usage changed outside their ops (an
        out-of-memory retry, plain ops that allocated); ``reserve`` calls it every ``sync_every`` ops."""
        eviction.sync(self)

    def add_outside(self, nbytes: int) -> None:
        """The device's usage grew by ``nbytes`` that the runtime does not track (a plain op's outputs); the
        next ``sync`` corrects the count when they die."""
        self.memory.set_outside(self.memory.outside + nbytes)
        self._dirty = True

    def evict_some(self, nbytes: int) -> int:
        """Evict by the policy until ``nbytes`` were freed or nothing is left to evict; return the bytes freed."""
        return eviction.evict_some(self, nbytes)

    def out_of_memory(self, nbytes: int, first: Sequence[Storage] = ()) -> int:
        """The device's allocator could not give ``nbytes`` although the budget was kept (fragmentation, memory the
        runtime does not count): evict ``first`` (the driver's choice, e.g. a window of adjacent blocks; those no longer
        evictable are skipped), then by the policy until ``nbytes`` were freed. Returns the bytes freed (0: nothing left
        to evict, the caller gives up); counted in ``Stats``."""
        return eviction.out_of_memory(self, nbytes, first)

    def evict(self, s: Storage) -> None:
        """Evict ``s`` now, by the driver's choice (it must be resident, unpinned and unlocked)."""
        if not s.resident or s.pinned or s.locks:
            internal_assert(False, f"cannot evict {s}")
        evict_storage(self, s, "evict")

    def _raise_budget(self, nbytes: int, where: str) -> None:
        """``eviction.raise_budget``; a method so that a test on the interpreted core can spy on it."""
        eviction.raise_budget(self, nbytes, where)

    def track(self) -> None:
        """Start the policy's tracker now (NOTE [ Lazy tracking ]): tell it every evicted storage, oldest first.
        Idempotent; for drivers and tests that read the tracker's features before any choice."""
        eviction.track(self)

    # ------------------------------------------------------------------ rematerialization
    def lock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks += 1

    def unlock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks -= 1

    def rematerialize(self, target: Storage) -> None:
        """Make ``target`` resident again, recomputing its evicted ancestors first, by a plan (no recursion;
        NOTE [ Planned rematerialization ])."""
        remat.rematerialize(self, target)

    def plan(self, roots: Sequence[Storage]) -> list[Storage]:
        """The evicted storages to recompute, in order, to make ``roots`` resident: one per recipe (each recipe
        recomputes all its missing outputs), every one after the evicted inputs of its recipe, and of several evicted
        inputs the one with the longest evicted chain below it first, so that each value waits as briefly as possible
        for its reader (NOTE [ Planned rematerialization ] 2)."""
        return remat.plan_steps(self, roots)

    def bring(self, roots: Sequence[Storage], *, hold: bool = True) -> None:
        """Make every storage of ``roots`` resident at once, locking nothing on return (the caller locks them before
        anything else runs): NOTE [ Planned rematerialization ]."""
        remat.bring(self, roots, hold=hold)

    # ------------------------------------------------------------------ reporting
    def stats(self) -> Stats:
        return Stats(
            budget_bytes=self.budget,
            resident_bytes=self.memory.tracked,
            peak_bytes=self.memory.peak,
            constant_bytes=self.memory.constants,
            evictions=self.evictions,
            drops=self.drops,
            rematerializations=self.rematerializations,
            remat_seconds=self.remat_seconds,
            search_seconds=self.search_seconds,
            ops=self.ops,
            live_storages=len(self.live),
            floor_bytes=self.floor,
            floor_op=self.floor_op,
            banished=self.banished,
            outside_bytes=self.memory.outside,
            syncs=self.syncs,
            oom_retries=self.oom_retries,
            oom_evicted_bytes=self.oom_evicted_bytes,
            excess_bytes=self.excess,
            iterations=self.iterations.boundaries,
            planned=self.iterations.planned,
            diverged=self.iterations.diverged,
            ahead=self.aheads,
            **({} if self.tier is None else {
                "swaps_out": self.tier.outs, "swaps_in": self.tier.ins, "host_bytes": self.tier.used,
                "host_peak_bytes": self.tier.peak}),
        )

    def reset_peak(self) -> None:
        self.memory.peak = self.memory.tracked + self.memory.outside
        self.peak_limit = self.budget

    def check(self) -> None:
        """Assert the invariants of ``records`` (for tests; O(records))."""
        total = banished = 0
        deps: dict[Storage, int] = {s: 0 for s in self.live}
        ops = {op for s in self.live for op in s.children} | {s.op for s in self.live if s.op is not None}
        for op in ops:
            if op.live > 0:
                for i in op.inputs:
                    internal_assert(not i.released, f"live {op} reads released {i}")
                    deps[i] = deps.get(i, 0) + 1
        for s in self.live:
            internal_assert(not s.released, f"released {s} still in live set")
            internal_assert(s.deps == deps[s], f"{s} counts {s.deps} dependents, found {deps[s]}")
            if s.resident:
                internal_assert(s.payload is not None, f"resident {s} has no payload")
                total += s.nbytes
            internal_assert((s in self.candidates) == (s.resident and not s.pinned), f"candidate set wrong for {s}")
            internal_assert(not s.banished or (s.resident and s.pinned), f"banished {s} not resident and pinned")
            internal_assert(not s.moves or s.pinned, f"{s} moves but is not pinned")
            internal_assert((s in self.movable) == (self.tier is not None and s.resident and s.moves),
                            f"movable set wrong for {s}")
            internal_assert(s.awaits == (s in self.awaiting) and (not s.awaits or s.resident),
                            f"{s}: awaits={s.awaits} but {'in' if s in self.awaiting else 'not in'} the kept set")
            banished += s.nbytes if s.banished else 0
        internal_assert(all(s in self.live for s in self.awaiting), "a released value in the kept set")
        if self.tier is not None:
            tier = self.tier
            copies = [s for s in self.live if s.host is not None]
            internal_assert(sum(s.nbytes for s in copies) == tier.used, f"host tier counts {tier.used} B, holds "
                                                                       f"{sum(s.nbytes for s in copies)} B")
            internal_assert(set(tier.spare) == {s for s in copies if s.resident}, "spare copies wrong")
            internal_assert(sum(s.nbytes for s in tier.spare) == tier.spare_bytes, "spare bytes wrong")
            internal_assert(tier.budget is None or tier.used <= tier.budget,
                            f"host tier holds {tier.used} B over its budget {tier.budget} B")
            internal_assert(not any(s.pinned and not s.moves for s in tier.spare), "a pinned value keeps a copy")
            internal_assert(sum(s.nbytes for s in self.movable) == self.movable_bytes, "movable bytes wrong")
        internal_assert(banished == self.banished_bytes, f"banished bytes {self.banished_bytes} != {banished}")
        internal_assert(total + self.memory.constants == self.memory.tracked,
                        f"tracked {self.memory.tracked} != resident {total} + constants {self.memory.constants}")
        if self.peak_limit is not None and self.budget is not None and self.device_usage is None:
            limit = max(self.peak_limit, self.budget)
            internal_assert(self.memory.peak <= limit,
                            f"peak {self.memory.peak} > budget {limit} (the largest in force)")
