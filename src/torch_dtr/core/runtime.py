"""The DTR runtime: records recipes, keeps tracked bytes within a budget, evicts, rematerializes.

It imports no torch. A front end (``torch_dtr.eager`` live, ``torch_dtr.sim`` for logs) drives it:

    rt.reserve(nbytes_of_outputs)          # evicts until the outputs fit
    ... run the op ...
    op = rt.record(inputs, cost, compute)  # the recipe
    s = rt.output(op, nbytes, payload)     # one storage per distinct output storage

and calls ``rt.rematerialize(s)`` when it needs the payload of an evicted storage.

# NOTE [ Lifetimes ]
#
# 1. A storage is kept while it has handles (``refs``: front-end tensors or log names) or live
#    dependents (``deps``: live recipes that read it).
# 2. When its last handle dies and no live recipe reads it, it is released: freed for good, its record
#    dropped, and its own recipe's inputs lose a dependent (which may release them in turn, iteratively).
# 3. When its last handle dies but a live recipe still reads it, it is evicted at once ("drop instead of
#    delete", as MegEngine does) and its recipe kept only as long as those dependents live. Pinned
#    storages (not recomputable) stay resident instead. These drops are counted as ``drops``, not as
#    evictions chosen by the policy.
# 4. So nothing accumulates across iterations: when an iteration's tensors die, every storage they
#    produced is released and tracked bytes return to the constants.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .memory import Drop, Memory
from .policies import DEFAULT_POLICY, Chain, Policy, get_policy
from .records import Op, Storage, UFNode


def _sid(s: Storage) -> int:
    return s.sid


class BudgetError(RuntimeError):
    """The budget cannot be kept: everything that could be evicted has been, and the op still does not fit."""


class InternalError(AssertionError):
    """A bug in torch_dtr (never the user's mistake). Please report it with the message."""


def internal_assert(cond: bool, msg: str) -> None:
    if not cond:
        raise InternalError(f"torch_dtr internal error: {msg}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


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
    ops: int  # ops recorded (managed ops run by the program)
    live_storages: int  # records held (resident or evicted)


class Runtime:
    def __init__(
        self,
        budget: int | None,
        policy: str | Policy = DEFAULT_POLICY,
        *,
        sample_sqrt: bool = False,
        min_evict_bytes: int | None = None,
        memory: Memory | None = None,
        victim: Drop | None = None,
        extra_usage: Callable[[], int] | None = None,
        seed: int = 0,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self.policy = get_policy(policy)
        self.sample_sqrt = sample_sqrt
        self.min_evict_bytes = min_evict_bytes
        self.memory = memory or Memory()
        self.victim = victim or Drop()
        self.extra_usage = extra_usage
        self.rng = random.Random(seed)
        self.candidates: dict[Storage, None] = {}  # resident, evictable storages (insertion-ordered set)
        self.candidate_bytes = 0
        self.live: dict[Storage, None] = {}  # every storage not yet released
        self.clock = 0.0
        self.next_sid = 0
        self.evictions = self.drops = self.rematerializations = self.ops = 0
        self.remat_seconds = self.search_seconds = 0.0
        self.remat_cost = 0.0  # summed recipe cost of rematerializations (the simulator's overhead)
        self.scored = 0  # candidates scored by the eviction search (policy metadata accesses)
        self.on_event: Callable[[str, Storage], None] | None = None  # "evict", "remat", "drop", "release"
        self.where = ""  # what the front end is running (for error messages)

    # ------------------------------------------------------------------ records
    def record(self, inputs: Sequence[Storage], cost: float, compute: Callable[[], Sequence[Any]] | None,
               name: str = "") -> Op:
        """Record a recipe that just ran: touches its inputs and advances the clock by its cost.

        Every recorded op must get at least one output (``output`` or ``new_version``), or its inputs
        would keep a dependent forever.
        """
        op = Op(inputs, cost, compute, name)
        self.clock += cost
        now = self.clock
        for s in op.inputs:
            s.deps += 1
            s.children.append(op)
            s.last_access = now
        return op

    def output(self, op: Op | None, nbytes: int, payload: Any) -> Storage:
        """A new resident storage produced by ``op``; with ``op=None`` it is pinned (never recomputed)."""
        s = Storage(self.next_sid, nbytes, payload, op, op is None)
        self.next_sid += 1
        s.last_access = self.clock
        if op is not None:
            op.outputs.append(s)
            op.live += 1
        self.memory.alloc(s)
        self.live[s] = None
        if not s.pinned:
            self.candidates[s] = None
            self.candidate_bytes += nbytes
        return s

    def touch(self, s: Storage) -> None:
        s.last_access = self.clock

    # ------------------------------------------------------------------ handles and lifetimes
    def add_ref(self, s: Storage) -> None:
        s.refs += 1

    def drop_ref(self, s: Storage) -> None:
        """One handle on ``s`` died. Handles on an old version count on its newest (``new_version``)."""
        while s.forward is not None:
            s = s.forward
        s.refs -= 1
        if s.refs < 0:
            internal_assert(False, f"negative handle count on {s}")
        if s.refs == 0:
            if s.deps == 0:
                self._release(s)
            elif s.resident and not s.pinned and s.locks == 0:
                self._evict(s)
                self.drops += 1
                if self.on_event:
                    self.on_event("drop", s)

    def _release(self, s: Storage) -> None:
        work = [s]
        while work:
            s = work.pop()
            if s.released:
                continue
            s.released = True
            if s.resident:
                self._unresident(s)
            self._leave_component(s)
            s.payload = None
            self.live.pop(s, None)
            if self.on_event:
                self.on_event("release", s)
            op = s.op
            if op is None:
                continue
            op.live -= 1
            if op.live == 0:
                op.compute = None
                for i in op.inputs:
                    i.deps -= 1
                    i.children.remove(op)
                    if i.deps == 0 and i.refs == 0:
                        work.append(i)
                # break the storage <-> op reference cycles, so that records die by reference counting
                # instead of waiting for (and slowing down) the cyclic garbage collector
                for o in op.outputs:
                    o.op = None
                op.outputs = []
                op.inputs = ()

    def _unresident(self, s: Storage) -> None:
        s.resident = False
        self.memory.free(s)
        if self.candidates.pop(s, 0) is None:
            self.candidate_bytes -= s.nbytes

    # ------------------------------------------------------------------ constants
    def add_constant(self, nbytes: int) -> None:
        """Count a constant storage (already in memory) against the budget, evicting to make room."""
        self.reserve(nbytes)
        self.memory.add_constant(nbytes)

    def remove_constant(self, nbytes: int) -> None:
        self.memory.remove_constant(nbytes)

    # ------------------------------------------------------------------ in-place writes
    def new_version(self, old: Storage, op: Op | None, payload: Any = None) -> Storage:
        """``op`` wrote ``old``'s value in place: the written value becomes a new storage.

        Without ``payload`` the write went to ``old``'s own buffer: the new storage takes over the buffer
        and its bytes, and ``old`` keeps its recipe but is no longer resident, so recipes that read it
        still recompute the value it had. With ``payload`` the write went to a copy (``old`` cannot be
        recomputed but is still read): ``old`` stays resident and the copy is counted as new bytes.
        ``op=None``: the write cannot be replayed, so the new storage is pinned. Handles naming ``old``
        now name the new version: they move with ``old.forward`` (``drop_ref`` follows it), so the newest
        version lives as long as any of them, and ``old`` only as long as recipes read it.
        """
        if not old.resident or old.released:
            internal_assert(False, f"in-place write to non-resident {old}")
        if payload is not None:
            new = self.output(op, old.nbytes, payload)
            self._move_refs(old, new)
            return new
        new = Storage(self.next_sid, old.nbytes, old.payload, op, op is None)
        self.next_sid += 1
        new.last_access = self.clock
        if op is not None:
            op.outputs.append(new)
            op.live += 1
        self.live[new] = None
        # the bytes move from old to new: tracked does not change
        old.payload = None
        old.resident = False
        if self.candidates.pop(old, 0) is None:
            self.candidate_bytes -= old.nbytes
        if not new.pinned:
            self.candidates[new] = None
            self.candidate_bytes += new.nbytes
        self._move_refs(old, new)
        return new

    def _move_refs(self, old: Storage, new: Storage) -> None:
        old.forward = new
        new.refs += old.refs
        old.refs = 0
        if old.deps == 0:
            self._release(old)

    def pin(self, s: Storage) -> None:
        """Never evict ``s`` from now on (its memory is shared with something the runtime cannot see)."""
        if not s.pinned:
            s.pinned = True
            if self.candidates.pop(s, 0) is None:
                self.candidate_bytes -= s.nbytes

    # ------------------------------------------------------------------ budget and eviction
    def reserve(self, nbytes: int) -> None:
        """Evict until ``nbytes`` more fit within the budget; raise ``BudgetError`` when they cannot."""
        if self.budget is None:
            return
        while self._used() + nbytes > self.budget:
            victim = self._choose()
            if victim is None:
                self._raise_budget(nbytes)
            self._evict(victim)
            self.evictions += 1
            if self.on_event:
                self.on_event("evict", victim)

    def evict_some(self, nbytes: int) -> int:
        """Evict by the policy until ``nbytes`` were freed or nothing is left to evict; return the bytes freed.

        For a front end whose allocator ran out of memory although the budget was kept (fragmentation,
        memory the runtime does not track): it evicts and retries the op before giving up.
        """
        freed = 0
        while freed < nbytes:
            victim = self._choose()
            if victim is None:
                break
            self._evict(victim)
            self.evictions += 1
            freed += victim.nbytes
            if self.on_event:
                self.on_event("evict", victim)
        return freed

    def _used(self) -> int:
        if self.extra_usage is None:
            return self.memory.tracked
        return max(self.memory.tracked, self.extra_usage())

    def _raise_budget(self, nbytes: int) -> None:
        held = self.memory.tracked
        locked = sum(s.nbytes for s in self.candidates if s.locks)
        need = held + nbytes
        raise BudgetError(
            f"torch_dtr: budget {fmt_bytes(self.budget or 0)} ({self.budget} B) cannot be kept: "
            f"{fmt_bytes(held)} cannot be evicted (constants {fmt_bytes(self.memory.constants)}, "
            f"locked by the op in flight and recomputations {fmt_bytes(locked)}, pinned or kept "
            f"{fmt_bytes(held - self.memory.constants - locked)}) and {self.where or 'the op'} needs "
            f"{fmt_bytes(nbytes)} more; "
            f"a budget of at least {fmt_bytes(need)} ({need} B) is needed here, e.g. "
            f"torch_dtr.enable(budget={math.ceil(need * 1.1)})"
        )

    def _choose(self) -> Storage | None:
        t0 = time.perf_counter()
        cands = self.candidates
        n = len(cands)
        if n == 0:
            self.search_seconds += time.perf_counter() - t0
            return None
        pool: Any = cands
        if self.sample_sqrt and n > 16:
            pool = self.rng.sample(list(cands), max(16, math.isqrt(n)))
        floor = self.min_evict_bytes
        if floor is None:
            floor = 0.01 * self.candidate_bytes / n
        best = self._best(pool, floor)
        if best is None and floor > 0:
            best = self._best(pool, 0)
        if best is None and pool is not cands:
            best = self._best(cands, 0)
        self.search_seconds += time.perf_counter() - t0
        return best

    def _best(self, pool: Any, floor: float) -> Storage | None:
        score, extra_kind = self.policy.score, self.policy.extra
        now = self.clock
        best, best_score = None, math.inf
        self.scored += len(pool)
        for s in pool:
            if s.locks or s.nbytes < floor or s.nbytes == 0:
                continue
            staleness = now - s.last_access + 1e-9
            extra = self._extra(s, extra_kind) if extra_kind else 0.0
            v = score(s.cost, s.nbytes, staleness, extra)
            if v < best_score:
                best, best_score = s, v
        return best

    def _extra(self, s: Storage, kind: str) -> float:
        if kind == "uf":
            roots = {n.uf.find() for n in s.neighbours() if n.uf is not None and not n.resident and not n.released}
            return sum(r.cost for r in roots)
        if kind == "exact":
            return sum(n.cost for n in self._evicted_component(s.neighbours()))
        if kind == "ancestors":
            return sum(n.cost for n in self._evicted_component(s.op.inputs if s.op else (), up_only=True))
        if kind == "chain":
            return self._chain(s)
        raise InternalError(f"torch_dtr internal error: unknown extra kind {kind!r}")

    @staticmethod
    def _evicted_component(start: Sequence[Storage], up_only: bool = False) -> set[Storage]:
        seen: set[Storage] = set()
        work = [n for n in start if not n.resident and not n.released]
        while work:
            n = work.pop()
            if n in seen:
                continue
            seen.add(n)
            nxt = (n.op.inputs if n.op else ()) if up_only else n.neighbours()
            work.extend(m for m in nxt if not m.resident and not m.released and m not in seen)
        return seen

    def evict(self, s: Storage) -> None:
        """Evict ``s`` now (it must be resident, unpinned and unlocked)."""
        if not s.resident or s.pinned or s.locks:
            internal_assert(False, f"cannot evict {s}")
        self._evict(s)
        self.evictions += 1

    def _evict(self, s: Storage) -> None:
        self._unresident(s)
        self.victim.evict(s)
        kind = self.policy.extra
        if kind == "uf" or kind == "chain":
            node = s.uf = UFNode(s.cost)
            for n in s.neighbours():
                if n.uf is not None and not n.resident and not n.released:
                    node.union(n.uf)
            if kind == "chain":
                self._note_chain(s)

    # NOTE [ Evicted chains ]
    #
    # The "chain" extra kind keeps, on each evicted storage, three estimates about the evicted paths through
    # it (paths along recipe edges whose storages are all evicted):
    #   chain_up:   storages on the longest such path ending at it (its recipe's evicted inputs, theirs, ...);
    #   chain_down: storages on the longest such path starting at it (evicted users' outputs, theirs, ...);
    #   path_cost:  summed recipe cost along the costliest path up (what recomputing it runs at least).
    # 1. They are set when the storage is evicted, from its evicted neighbours' values, and pushed one step
    #    to those neighbours (an evicted user's output now has this one above it, an evicted input this one
    #    below it). So an eviction and a candidate's score both cost O(neighbours), never O(graph).
    # 2. The price: they are estimates. A value further than one step from a later eviction is not updated
    #    (lengths and costs can be low), and a rematerialization updates nothing (they can be high until the
    #    storage is evicted again). A resident storage's values are never read (only evicted neighbours'
    #    are); one made non-resident by an in-place write (``new_version``) keeps the values it had.
    # 3. The policy uses them to see (a) what bringing a candidate back costs beyond its own recipe, which the
    #    union-find neighbourhood blurs once components grow (on the LSTM log nearly every dropped storage is
    #    in one component), and (b) how long a chain of evicted storages the eviction would make: a long
    #    chain is recomputed by a deep cascade that holds locks at every level (NOTE [ Locks during
    #    rematerialization ]) and can run out of budget halfway.
    @staticmethod
    def _note_chain(s: Storage) -> None:
        up = down = 0
        path = 0.0
        op = s.op
        ins = [i for i in op.inputs if not i.resident and not i.released] if op is not None else []
        outs = [o for c in s.children for o in c.outputs if not o.resident and not o.released]
        for i in ins:
            up = max(up, i.chain_up)
            path = max(path, i.path_cost)
        for o in outs:
            down = max(down, o.chain_down)
        s.chain_up, s.chain_down = up + 1, down + 1
        s.path_cost = s.cost + path
        for o in outs:
            o.chain_up = max(o.chain_up, up + 2)
            o.path_cost = max(o.path_cost, o.cost + s.path_cost)
        for i in ins:
            i.chain_down = max(i.chain_down, down + 2)

    @staticmethod
    def _chain(s: Storage) -> Chain:
        """The "chain" extra of a resident candidate (NOTE [ Evicted chains ]), in one pass over its neighbours."""
        roots: set[UFNode] = set()
        up = down = 0
        path = 0.0
        op = s.op
        if op is not None:
            for i in op.inputs:
                if not i.resident and not i.released:
                    up = max(up, i.chain_up)
                    path = max(path, i.path_cost)
                    if i.uf is not None:
                        roots.add(i.uf.find())
        for c in s.children:
            for o in c.outputs:
                if not o.resident and not o.released:
                    down = max(down, o.chain_down)
                    if o.uf is not None:
                        roots.add(o.uf.find())
        return Chain(sum(r.cost for r in roots), path, up + down + 1)

    # ------------------------------------------------------------------ rematerialization
    def lock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks += 1

    def unlock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks -= 1

    def rematerialize(self, target: Storage) -> None:
        """Make ``target`` resident again, recomputing evicted inputs first (an explicit stack, no recursion).

        # NOTE [ Locks during rematerialization ]
        #
        # 1. A frame whose recipe has evicted inputs pushes a frame for each and waits; it locks nothing
        #    while it waits, so the memory held by a deep chain of pending frames stays small (locking every
        #    resident input on the way down held 1.5 GiB of a 1.7 GiB budget on the LSTM log and failed).
        # 2. A frame that brought its storage back hands it, locked, to the frame that asked for it, so the
        #    inputs a frame has collected cannot be evicted again.
        # 3. When no input is missing, the frame locks all of them, runs the recipe and drops its locks.
        #    Inputs evicted while the frame waited are simply missing the next time it looks: since the
        #    collected inputs stay locked (2), each look finds fewer missing and the loop ends.
        # 4. Recipes form a DAG (inputs are older than outputs), so the stack empties.
        # 5. Of several missing inputs, the oldest is recomputed first. In a recurrence (an LSTM's cell
        #    state) the oldest input is the one with the long chain behind it; doing it first means no frame
        #    on that chain holds a locked sibling while the chain is recomputed below it (siblings done
        #    first held one locked gate per time step: 458 storages, 1.5 GiB, on the LSTM log).
        # 6. Intermediates without handles (``refs == 0``: old versions of in-place writes, values whose
        #    tensors died but whose readers live) were brought back only to feed the recipes above them.
        #    When the whole rematerialization is done, those whose every reader's outputs are resident
        #    again are evicted at once (as NOTE [ Lifetimes ] 3 evicts such a storage when its last handle
        #    dies) and counted as drops. Kept, they were the freshest storages in memory, so the policy
        #    evicted everything else first: on a live LSTM step (an in-place write per gate, so five
        #    versions per time step) that turned a 70% budget into 116,000 recomputations in one step; on
        #    the tests' tree RNN at 30-40% of its peak every run thrashed without this rule; with it half
        #    train at 30% and all at 40% (docs/design.md, Known limits). One with a reader still evicted stays (to the
        #    policy): it is likely needed again soon, and dropping it too made a recorded MLP log
        #    infeasible at 0.9 of its peak (the readers' next rematerialization had to recompute it again
        #    with more locked at once). Making them merely stale again (the policy's first pick, evicted
        #    only when room is needed) was tried too: the tree RNN then thrashed at 25-40% in every run.
        """
        if target.resident:
            return
        # frame: [storage, locks held for its recipe, index of the frame that asked for it]
        frames: list[tuple[Storage, list[Storage], int]] = [(target, [], -1)]
        brought: list[Storage] = []  # storages recomputed on the way to the target (rule 6)
        try:
            while frames:
                s, held, parent = frames[-1]
                if not s.resident:
                    op = s.op
                    if op is None or op.compute is None or s.released:
                        internal_assert(False, f"cannot rematerialize {s}: it has no recipe")
                    missing = [i for i in op.inputs if not i.resident]
                    if missing:  # the oldest on top of the stack: see rule 5
                        me = len(frames) - 1
                        if len(missing) > 1:
                            missing.sort(key=_sid, reverse=True)
                        frames.extend((i, [], me) for i in missing)
                        continue
                    for i in op.inputs:
                        i.locks += 1
                        held.append(i)
                    self._recompute(op)
                    if parent >= 0:
                        brought.append(s)
                frames.pop()
                self.unlock(held)
                if parent >= 0:
                    s.locks += 1
                    frames[parent][1].append(s)
        except BaseException:
            for _, held, _ in frames:
                self.unlock(held)
            raise
        finally:
            for s in brought:  # rule 6
                if (s.refs == 0 and s.resident and not s.locks and not s.pinned and not s.released
                        and all(o.resident or o.released for c in s.children for o in c.outputs)):
                    self._evict(s)
                    self.drops += 1
                    if self.on_event:
                        self.on_event("drop", s)

    def _recompute(self, op: Op) -> None:
        where, self.where = self.where, f"recomputing {op.name or 'an op'}"
        siblings = [o for o in op.outputs if o.resident]
        self.lock(siblings)  # reserve() must not evict an output that compute() is about to bring back
        try:
            self.reserve(sum(o.nbytes for o in op.outputs if not o.resident and not o.released))
        finally:
            self.unlock(siblings)
            self.where = where
        t0 = time.perf_counter()
        payloads = op.compute()  # type: ignore[misc]
        self.remat_seconds += time.perf_counter() - t0
        self.remat_cost += op.cost
        self.rematerializations += 1
        self.clock += op.cost
        now = self.clock
        for i in op.inputs:
            i.last_access = now
        for o, p in zip(op.outputs, payloads, strict=True):
            if o.resident or o.released:
                continue
            o.payload = p
            o.resident = True
            o.last_access = now
            self.memory.alloc(o)
            if not o.pinned:
                self.candidates[o] = None
                self.candidate_bytes += o.nbytes
            self._leave_component(o)
            if self.on_event:
                self.on_event("remat", o)

    @staticmethod
    def _leave_component(s: Storage) -> None:
        """``s`` is no longer evicted: its cost leaves its component (not split: the h_DTR^eq approximation)."""
        if s.uf is not None:
            s.uf.find().cost -= s.cost
            s.uf = None

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
        )

    def reset_peak(self) -> None:
        self.memory.peak = self.memory.tracked

    def check(self) -> None:
        """Assert the invariants of ``records`` (for tests; O(records))."""
        total = 0
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
        internal_assert(total + self.memory.constants == self.memory.tracked,
                        f"tracked {self.memory.tracked} != resident {total} + constants {self.memory.constants}")
        if self.budget is not None and self.extra_usage is None:
            internal_assert(self.memory.peak <= self.budget, f"peak {self.memory.peak} > budget {self.budget}")
