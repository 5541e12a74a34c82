"""Rematerialization: the plan that brings evicted values back (recomputing recipes, copying swapped values
back) and running it within the budget. Free functions of the runtime's state (``rt``), called by its verbs
``rematerialize``, ``plan``, ``bring`` and ``acquire``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import BudgetError, ConstantChangedError, fmt_bytes, internal_assert, suggest
from .eviction import evict_storage
from .lifetimes import add_candidate, add_movable, unresident
from .records import Op, Storage, UnheldPlan, step_of
from .swap import swap_in

if TYPE_CHECKING:
    from .runtime import Runtime

# NOTE [ Planned rematerialization ]
#
# 1. ``plan(roots)`` lists the evicted ancestors to recompute, one step per recipe, each after its evicted
#    inputs (post-order), visiting of several evicted inputs the one with the longest evicted chain below
#    it first (ties: the oldest), so that each value waits as briefly as possible for its reader: in a
#    recurrence whose side inputs are older than its chain, recomputing the oldest input first would hold
#    one side input per step; the plan holds O(1) (tests/core/test_planned_remat.py).
# 2. A recomputed value without handles (``refs == 0``: an old version of an in-place write, a value whose
#    tensors died but whose readers live) was brought back only to feed the recipes above it: it is dropped
#    as soon as its last reader in the plan has run, if every reader's outputs are resident (as NOTE
#    [ Lifetimes ] 3; one with a reader still evicted stays, to the policy). The end of an evicted chain
#    comes back with two links resident at a time.
# 3. ``bring(roots)`` runs the plan so that every root is resident at the end. First holding (``hold=True``):
#    each recomputed value stays locked until its last planned reader has run; a resident input evicted
#    meanwhile makes its step find it missing and plan it again (locked this time, so this ends).
# 4. If that cannot keep the budget, the caller (``acquire``, ``rematerialize``) drops every lock, its own
#    op's resident inputs included, and runs the plan without holding: the policy may evict any planned
#    value, even one the next step reads; a step that finds an input missing plans it again, and from its
#    second try locks its other resident inputs until it runs (each try locks more, so it ends). While
#    it runs, the policy first chooses among candidates that no pending step reads (``Runtime.unheld``); when none
#    fits, the runtime evicts the planned value whose next read is furthest ahead in the plan (Belady's
#    rule; the larger on a tie), not the policy's choice among all: staleness says nothing about a plan's
#    order, and the policy's picks were read again a few steps later (the tests' MLP: smallest feasible
#    budget 33% -> 28% of its peak, tree RNN 23% -> 21%; docs/decisions.md). A plan that runs more than
#    4 x (its first length + 8) recomputations gives up with ``BudgetError`` (``raise_undone``) instead
#    of thrashing.
# 5. Why held first: unheld, the policy may evict a stale input of the op in flight to recompute another,
#    and then recompute it; held, nothing is computed twice. Unheld only runs where held fails.
# 6. Lending: a recipe that writes an input in place (an in-place op's old version, ``Op.writes``) copies it
#    first, so that the old value survives for its other readers. When it has none (no handle, this recipe
#    its only dependent, not pinned, not a root of the plan), ``recompute`` lends it: the reservation
#    counts its bytes as the output's, ``compute(lend)`` writes into it as the first run did, and it is
#    dropped (not handed to ``Drop``: its buffer now holds the output). An in-place chain (LSTMCell's
#    gates written by four in-place activations per step, dropout's ``bernoulli_``) comes back in one
#    buffer instead of two (tests/core/test_lending.py); the tests' LSTM loop's smallest feasible budget
#    went from 54% to 50% of its peak.


def raise_undone(rt: Runtime, roots: Sequence[Storage], ran: int, planned: int) -> None:
    """An unheld plan kept being undone (NOTE [ Planned rematerialization ] 4): give up with ``BudgetError``."""
    need = sum(r.nbytes for r in roots)
    n, fix = suggest(max(rt.budget or 0, rt.floor) * 1.15, rt.fix, rt.advise)
    raise BudgetError(
        f"torch_dtr: budget {fmt_bytes(rt.budget or 0)} ({rt.budget} B) cannot be kept while bringing back "
        f"{len(roots)} evicted value(s) of {fmt_bytes(need)}: their plan of {planned} recomputations needs more "
        f"than the budget while it holds its values, and without holding them the policy evicted them again "
        f"before their readers ran ({ran} recomputations, then it gave up; constants "
        f"{fmt_bytes(rt.memory.constants)}, single-op floor so far {fmt_bytes(rt.floor)}). {fix}", budget=n)


def rematerialize(rt: Runtime, target: Storage) -> None:
    """Make ``target`` resident again, recomputing its evicted ancestors first, by a plan (no recursion;
    NOTE [ Planned rematerialization ])."""
    if target.resident:
        return
    try:
        bring(rt, [target])
    except BudgetError:
        bring(rt, [target], hold=False)


def runnable_recipe(rt: Runtime, s: Storage) -> Op:
    """``s``'s recipe, which must be able to run (else ``ConstantChangedError`` or ``InternalError``)."""
    op = s.op
    if op is not None and op.why is not None and not s.released:
        raise ConstantChangedError(
            f"torch_dtr: cannot recompute the output of {op.name or 'an op'} ({s}): it was "
            f"evicted, and then {op.why}. Read values before such a change, or keep them with "
            f"torch_dtr.unwrap(t).")
    if op is None or op.compute is None or s.released:
        internal_assert(False, f"cannot rematerialize {s}: it has no recipe")
    return op  # type: ignore[return-value]


def plan_steps(rt: Runtime, roots: Sequence[Storage]) -> list[Storage]:
    """The evicted storages to recompute, in order, to make ``roots`` resident: one per recipe (each
    recipe recomputes all its missing outputs), every one after the evicted inputs of its recipe, and
    of several evicted inputs the one with the longest evicted chain below it first, so that each
    value waits as briefly as possible for its reader (NOTE [ Planned rematerialization ] 2)."""
    # 1. the evicted ancestors (one storage per recipe; a swapped storage is a step of its own, with no
    # inputs: NOTE [ Swapping ] 3)
    first: dict[Any, Storage] = {}
    work = [s for s in roots if not s.resident]
    while work:
        s = work.pop()
        if s.host is not None:
            first[s] = s
            continue
        op = runnable_recipe(rt, s)
        if op in first:
            continue
        first[op] = s
        work.extend(i for i in op.inputs if not i.resident)
    # 2. depth: the longest chain of evicted recipes below each; inputs are older than outputs, so
    # ascending storage ids is a topological order
    depth: dict[Any, int] = {}
    for k in sorted(first, key=lambda o: first[o].sid):
        depth[k] = 1 if type(k) is Storage else 1 + max(
            (depth[step_of(i)] for i in k.inputs if not i.resident), default=0)

    def order(s: Storage) -> list[Storage]:  # evicted inputs; the next to visit (deepest, then oldest) last
        if s.host is not None:
            return []
        ins = [i for i in s.op.inputs if not i.resident]  # type: ignore[union-attr]
        ins.sort(key=lambda i: (depth[step_of(i)], -i.sid))
        return ins

    # 3. post-order from the roots, deepest input first
    out: list[Storage] = []
    done: set[Any] = set()
    for root in roots:
        if root.resident or step_of(root) in done:
            continue
        stack: list[tuple[Storage, list[Storage]]] = [(root, order(root))]
        while stack:
            s, ins = stack[-1]
            while ins and step_of(ins[-1]) in done:
                ins.pop()
            if ins:
                i = ins.pop()
                stack.append((i, order(i)))
                continue
            stack.pop()
            k = step_of(s)
            if k not in done:
                done.add(k)
                out.append(s)
    return out


def bring(rt: Runtime, roots: Sequence[Storage], *, hold: bool = True) -> None:
    """Make every storage of ``roots`` resident at once, locking nothing on return (the caller locks
    them before anything else runs): NOTE [ Planned rematerialization ].

    ``hold=True``: each recomputed value stays locked until the last step of the plan that reads it
    has run (no value is computed twice, but the plan's live values cannot make room). ``hold=False``:
    nothing is locked between steps, so the policy may evict a planned value again; a step that finds
    an input missing a second time locks the others it has, and a plan that keeps being undone gives up
    with ``BudgetError`` (rule 4)."""
    missing = [r for r in roots if not r.resident]
    if not missing:
        return
    if len(missing) == 1 and (hold or len(roots) == 1) and missing[0].host is not None:
        keep: Any = [r for r in roots if r.resident]
        rt.lock(keep)
        try:
            swap_in(rt, missing[0])
        finally:
            rt.unlock(keep)
        return
    if len(missing) == 1 and (hold or len(roots) == 1):
        op: Any = runnable_recipe(rt, missing[0])
        if all(i.resident for i in op.inputs):  # the common case: one recipe, its inputs resident
            keep = [*op.inputs, *(r for r in roots if r.resident)] if len(roots) > 1 else op.inputs
            rt.lock(keep)
            try:
                recompute(rt, op, roots)
            finally:
                rt.unlock(keep)
            return
    # a step is a storage to recompute, or None: the caller's op, which reads ``roots``
    steps: list[Storage | None] = [None]
    pending: dict[Storage, int] = dict.fromkeys(roots, 1)  # storage -> pending steps that read it
    leaves: set[Storage] = set()  # steps planned as copies back (NOTE [ Swapping ] 3)
    limit = 4 * (push(rt, steps, pending, missing, leaves) + 8)  # steps run before giving up (hold=False)
    tries: dict[Storage | None, int] = {}
    held: dict[Storage | None, list[Storage]] = {}  # locks a retried step keeps until it runs
    kept: set[Storage] = set()  # hold=True: recomputed values locked until their last planned reader
    brought: dict[Storage, None] = {}  # recomputed on the way, the roots excepted
    rootset = set(roots)
    ran = 0
    outer = rt.unheld
    u = None if hold else UnheldPlan(pending, steps, roots)  # what the eviction search keeps last (rule 4)
    if u is not None:
        rt.unheld = u
    try:
        while steps:
            s = steps[-1]
            if s is None or not s.resident:
                swapped = s is not None and s.host is not None  # a copy back: no inputs (Swapping 3)
                op = None if s is None or swapped else runnable_recipe(rt, s)
                ins = roots if s is None else () if swapped else op.inputs  # type: ignore[union-attr]
                missing = [i for i in ins if not i.resident]
                if missing:  # evicted since it was planned, or since it was recomputed
                    n = tries[s] = tries.get(s, 0) + 1
                    if n > 1:
                        keep = held.setdefault(s, [])
                        for i in ins:
                            if i.resident and i not in keep:
                                i.locks += 1
                                keep.append(i)
                    push(rt, steps, pending, missing, leaves)
                    if u is not None:
                        u.rev += 1
                    continue
                if s is not None:
                    ran += 1
                    if not hold and ran > limit:
                        raise_undone(rt, roots, ran, limit // 4 - 8)
                    if swapped:
                        swap_in(rt, s)
                    else:
                        rt.lock(ins)
                        try:
                            recompute(rt, op, rootset)  # type: ignore[arg-type]
                        finally:
                            rt.unlock(ins)
                    for o in (s,) if swapped else op.outputs:  # type: ignore[union-attr]
                        if o.resident and o not in rootset:
                            brought[o] = None
                            if hold and o not in kept and pending.get(o, 0) > 0:
                                o.locks += 1
                                kept.add(o)
            steps.pop()
            if u is not None:
                u.rev += 1
            rt.unlock(held.pop(s, ()))
            if s not in leaves:  # (a step planned as a recipe and swapped since still read its recipe's inputs)
                done_reads(rt, roots if s is None else s.op.inputs if s.op is not None else (),
                           pending, kept, brought)
    finally:
        rt.unheld = outer
        for keep in held.values():
            rt.unlock(keep)
        rt.unlock(list(kept))
        for s in brought:  # rule 2
            drop_brought(rt, s)


def done_reads(rt: Runtime, ins: Sequence[Storage], pending: dict[Storage, int], kept: set[Storage],
               brought: dict[Storage, None]) -> None:
    """A plan's step that read ``ins`` ran: unlock and drop what no pending step reads now."""
    for i in ins:
        left = pending[i] = pending.get(i, 1) - 1
        if left == 0:
            if i in kept:
                kept.discard(i)
                i.locks -= 1
            if i in brought:
                drop_brought(rt, i)


def push(rt: Runtime, steps: list[Storage | None], pending: dict[Storage, int], missing: list[Storage],
         leaves: set[Storage]) -> int:
    """Plan ``missing`` and put its steps on ``steps`` (the next one last), counting their reads in ``pending``;
    a copy back is a leaf (``leaves``). Returns the number of steps planned."""
    plan = plan_steps(rt, missing)
    for m in plan:
        if m.host is not None:
            leaves.add(m)
            continue
        leaves.discard(m)
        for i in m.op.inputs:  # type: ignore[union-attr]
            pending[i] = pending.get(i, 0) + 1
    steps.extend(reversed(plan))
    return len(plan)


def drop_brought(rt: Runtime, s: Storage) -> None:
    """Evict ``s`` if nothing holds it and every reader's outputs are resident (NOTE [ Planned
    rematerialization ] 2)."""
    if (s.refs == 0 and s.resident and not s.locks and not s.pinned and not s.released
            and all(o.resident or o.released for c in s.children for o in c.outputs)):
        evict_storage(rt, s, "drop")


def recompute(rt: Runtime, op: Op, keep: Any = ()) -> None:
    """Run ``op``'s recipe again for its missing outputs. ``keep``: storages that must stay resident
    (the roots a plan brings back), never lent (NOTE [ Planned rematerialization ] 6)."""
    siblings = [o for o in op.outputs if o.resident]
    # inputs the recipe may write in place instead of copying: nothing but this recipe reads them
    lend = [s for s in op.writes if s.resident and s.refs == 0 and s.deps == 1 and not s.pinned
            and s not in keep] if op.writes else None
    rt.lock(siblings)  # reserve() must not evict an output that compute() is about to bring back
    rt.recomputing = True
    try:
        need = sum(o.nbytes for o in op.outputs if not o.resident and not o.released) + op.scratch
        rt.reserve(max(0, need - sum(s.nbytes for s in lend)) if lend else need,
                   f"recomputing {op.name or 'an op'}")
    finally:
        rt.recomputing = False
        rt.unlock(siblings)
    t0 = time.perf_counter()
    payloads = op.compute(lend) if lend else op.compute()  # type: ignore[misc]
    rt.remat_seconds += time.perf_counter() - t0
    for s in lend or ():  # its buffer now holds an output: its bytes move there (freed before counted)
        s.payload = None
        unresident(rt, s)
        if rt.tracking and s.host is None:  # with a copy it is swapped (NOTE [ Swapping ] 4)
            rt.tracker.evicted(s)
        rt.drops += 1
        if rt.listeners:
            rt.emit("drop", s)
    rt.remat_cost += op.cost
    rt.rematerializations += 1
    rt.clock += op.cost
    now = rt.clock
    for i in op.inputs:
        i.last_access = now
    for o, p in zip(op.outputs, payloads, strict=True):
        if o.resident or o.released:
            continue
        o.payload = p
        o.resident = True
        o.last_access = now
        rt.memory.alloc(o)
        if not o.pinned:
            add_candidate(rt, o)
        elif o.moves:
            add_movable(rt, o)
        if o.host is not None:  # swapped, recomputed with a sibling: its copy is a spare
            rt.tier.keep(o)  # type: ignore[union-attr]
        elif rt.tracking:
            rt.tracker.restored(o)
        if rt.listeners:
            rt.emit("remat", o)


AHEAD = 4  # ops the plan is read ahead by (NOTE [ Iteration plans ] 7)


def ahead(rt: Runtime) -> None:
    """After an op, while the iteration follows its plan: bring back now the evicted values that the plan's next
    ``AHEAD`` ops read, in their order, while they, their recomputations and what those ops make fit in the bytes
    free under the budget, so that nothing is evicted for them (NOTE [ Iteration plans ] 7)."""
    it = rt.iterations
    plan = it.plan
    budget = rt.budget
    if plan is None or budget is None:
        return
    if not plan.reads:
        plan.index()
    pos = it.pos
    reads, made, firsts, stores = plan.reads, plan.made, plan.firsts, it.stores
    end = min(pos + AHEAD, len(reads))
    mem = rt.memory
    tier = rt.tier
    limit = budget - rt.headroom
    for p in range(pos, end):
        for i in reads[p]:
            if i >= len(stores):
                return
            s = stores[i]
            if s.resident or s.released:
                continue
            free = limit - mem.tracked - mem.outside - (tier.pending if tier is not None else 0)
            coming = made[firsts[p + 1]] - made[firsts[pos]]  # what the ops up to its reader make
            if s.nbytes + coming > free:
                return  # the op reading it brings it back when it runs, evicting if it must
            try:
                steps = plan_steps(rt, [s])
            except ConstantChangedError:
                return  # the op reading it raises it, where the program reads it
            chain, kept = _plan_bytes(steps, s)
            if chain > free or kept + coming > free:
                return
            evicted = rt.evictions
            try:
                bring(rt, [s])
            except BudgetError:  # the device's count grew (a sync): leave it to the op that reads it
                return
            rt.aheads += 1
            if rt.evictions != evicted:  # the estimate fell short: no more ahead of need in this call
                return


def _plan_bytes(steps: Sequence[Storage], root: Storage) -> tuple[int, int]:
    """The most bytes ``bring`` holds at once while it runs ``steps`` (``plan_steps``) for ``root``, and what stays
    when it is done: every step's outputs come back; a value without handles is dropped once the last step that reads
    it has run (NOTE [ Planned rematerialization ] 2)."""
    reads: dict[Storage, int] = {}
    for st in steps:
        if st.host is None:
            for i in st.op.inputs:  # type: ignore[union-attr]
                reads[i] = reads.get(i, 0) + 1
    live = peak = 0
    for st in steps:
        if st.host is not None:
            live += st.nbytes
        else:
            op: Any = st.op
            live += sum(o.nbytes for o in op.outputs if not o.resident and not o.released)
            peak = max(peak, live + op.scratch)
            for i in op.inputs:
                left = reads[i] = reads[i] - 1
                if left == 0 and i.refs == 0 and i is not root and not i.resident:  # brought back, then dropped
                    live -= i.nbytes
        peak = max(peak, live)
    return peak, live
