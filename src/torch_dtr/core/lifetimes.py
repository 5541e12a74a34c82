"""How long the runtime keeps a storage: handles and dependents, drops, releases, pins, banishing, and the
candidate sets that follow residency. Free functions of the runtime's state (``rt``), called by its verbs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .records import Op, Storage

if TYPE_CHECKING:
    from .runtime import Runtime

# NOTE [ Lifetimes ]
#
# 1. A storage is kept while it has handles (``refs``: front-end tensors or log names) or live
#    dependents (``deps``: live recipes that read it).
# 2. When its last handle dies and no live recipe reads it, it is released: freed for good, its record
#    dropped, and its own recipe's inputs lose a dependent (which may release them in turn, iteratively).
# 3. When its last handle dies but a live recipe still reads it, it is evicted at once ("drop instead of
#    delete", as MegEngine does) and its recipe kept only as long as those dependents live. Pinned
#    storages (not recomputable) stay resident instead. These drops are counted as ``drops``, not as
#    evictions chosen by the policy. Except a value that a reader's evicted output *with a handle* waits
#    for (``awaited``): the program may read that output again, and bringing it back without this value
#    would recompute the value's own evicted chain too (in a backward pass: every gradient back to the
#    loss). Such a value stays resident, an ordinary candidate (``Storage.awaits``). The drop it was
#    spared comes due once nothing waits for it: when the waiting output's last handle dies (every
#    handle-less input of that output's recipe that nothing else waits for is dropped then), or when the
#    output has been brought back (the next eviction takes it before asking the policy: ``eviction.due_drop``).
#    Replaying 26 recorded and shared logs at 0.2-0.9 of their peaks: 35 cells better, 2 worse (by
#    under 1%); the simulator's recorded MLP at 0.7 from 1.855 to 1.265 (the ILP's optimum: 1.201).
#    docs/decisions.md, Handle-less inputs of awaited values.
# 4. So nothing accumulates across iterations: when an iteration's tensors die, every storage they
#    produced is released and tracked bytes return to the constants.
# 5. A recipe whose every live output is pinned (a value the program unwrapped, a value kept when a constant
#    changed) never runs again, so it is dropped when the last of them is pinned or the last other output is
#    released, and its inputs lose a dependent. Before, a loss the program held and read as a float kept the
#    32 MiB log-softmax its recipe reads resident through the next step (the bench's GPT-2 failed at 30%).


# NOTE [ Banishing ]
#
# 1. A value without handles that recipes still read (a running sum's previous total, an old version of
#    an in-place write, a consumed gradient) is evicted at once (NOTE [ Lifetimes ] 3) and its recipe
#    kept. Summing T values one at a time (``acc = acc + g_t``: autograd's gradient accumulation over a
#    recurrence's steps, a residual stream's gradient, a user's loop) leaves a chain of T such values: the
#    newest total can only be recomputed from all of them, and evicting it costs O(T) recomputations
#    (each ``g_t`` with its own ancestors), so the run thrashes at budgets where the total is evicted.
# 2. ``chain`` measures it when a storage loses its last handle: the number of links on the longest path
#    of handle-less values ending there, where a link is an op that reads two or more handle-less values
#    (a sum of things nobody else holds; an in-place unary op on a view adds none). A pinned storage
#    counts as the limit: it stays resident for its readers and cannot be recomputed anyway.
# 3. At ``banish_depth`` links, the readers of the value whose outputs are all resident (or released) and
#    no larger than it lose their recipes: their outputs are pinned (``invalidate``), the value and,
#    recursively, the chain behind it are released. So the running total is pinned while it is held and
#    the chain costs nothing; the next total is banished at once (its input is pinned, rule 2), so a sum
#    over T steps keeps one total resident, as plain PyTorch's in-place accumulation does. A pinned value
#    (banished or not) that loses its last handle hands the pin to its resident readers whatever their
#    size: it is freed and nothing is added (they are resident already). With the size rule there too, such
#    values stayed resident for as long as any reader's recipe lived (the bench's LSTM loop failed at 60%
#    with 9.7 MiB of them at depth 1; a recorded CNN log at 0.9 of its peak).
# 4. The price: a banished output is never evicted while it has handles. The size rule means banishing an
#    evicted value never adds resident bytes when it happens (the value it frees is at least as large).
# 5. Pinned by choice, not because no schedule could do otherwise: the single-op floor leaves banished
#    bytes out (``banished_bytes``; in a ``BudgetError``, those the op in flight does not read), so it stays
#    a lower bound for any schedule.
# 6. Live, the default depth is 2 (``eager.front.DEFAULT_BANISH_DEPTH``, since 2026-11-25, 08:00 UTC): measured
#    (docs/floors.md, ``floors.py --banish``) on the tests' models' smallest feasible budgets it is lower on five
#    of eight and higher on one (the MLP: 23% -> 28% of its peak; 2026-11-30), and the
#    bench's LSTM loop trains at 50% of its peak, where it fails without. ``Runtime``'s own default, which
#    the replay of operator logs uses, stays 0: in those logs every weight gradient is an output whose
#    recipe lives to the end of the step (live they are plain ``p.grad`` constants), so a banished value
#    read by one stays resident, and the shared ResNet-32 log fails at 0.2 of its peak with banishing.
# 7. A pinned value that loses its last handle while a reader's outputs are evicted stays resident for that
#    reader's recipe, and so for every value computed from it that something still holds: in beam search
#    (HF ``generate(num_beams=3)``) each step's reordered KV cache is banished, its attention output evicted,
#    and the running beam scores and sequences, held to the end, kept every cache version alive (the BART of
#    tests/eager/test_inference.py: no-budget peak 8.6/30.2/71.5 MB at 6/24/48 tokens). So the reader's recipe
#    is dropped instead (``cut``: ``invalidate``, as for a changed constant): the evicted values computed
#    through it are lost, the resident ones pinned (as banished), where those are at most a quarter of the bytes
#    the value frees
#    and none of the lost ones is held. At up to all of them, a program with reentrant checkpointing lost its
#    budget at 1.3x its floor (68 cuts in a step, each pinning as much as it freed, values that outlived it);
#    the BART's peak: 4.7/5.7/7.2 MB at 6/24/48 tokens with the quarter, 4.4/4.4/5.1 with all. A held lost
#    one would have to be brought back first, and a handle can die inside another op (the Python front end
#    drains deaths when an op starts, nested ones too), where bringing a value back could pass the budget.


def all_pinned(op: Op) -> bool:
    """Whether every live output of ``op`` is pinned, resident or swapped: its recipe never runs again."""
    return all(o.released or (o.pinned and (o.resident or o.host is not None)) for o in op.outputs)


def awaited(s: Storage) -> bool:
    """Whether a reader of ``s`` has an evicted output with a handle (NOTE [ Lifetimes ] 3)."""
    for c in s.children:  # (loops, not a generator: this runs for every value whose last handle dies)
        for o in c.outputs:
            if o.refs and not o.resident and o.host is None:
                return True
    return False


def drop_recipe(op: Op) -> list[Storage]:
    """Drop the recipe of ``op``, whose live outputs are all pinned (NOTE [ Lifetimes ] 5); returns its inputs
    that nothing needs now, for the caller to release (iteratively: a chain of such recipes is as long as the
    program)."""
    op.compute = None
    op.why = "its outputs are pinned, so it never runs again"
    inputs, op.inputs = op.inputs, ()
    free = []
    for i in inputs:
        i.deps -= 1
        i.children.remove(op)
        if i.deps == 0 and i.refs == 0:
            free.append(i)
    return free


def orphaned(rt: Runtime, s: Storage) -> None:
    """``s`` lost its last handle but recipes still read it: measure its chain, banish at the limit
    (NOTE [ Banishing ])."""
    if s.pinned:
        s.chain = rt.banish_depth
    else:
        op = s.op
        if op is None:
            s.chain = 0
        else:  # a link is an op that sums up two or more values without handles (an accumulation)
            free = longest = 0
            for i in op.inputs:
                if i.refs == 0 and not i.pinned:
                    free += 1
                    if i.chain > longest:
                        longest = i.chain
            s.chain = (free > 1) + longest
    if s.chain < rt.banish_depth:
        return
    for op in list(s.children):
        outs = op.outputs
        if op.compute is None:
            continue
        if not all(o.resident or o.released for o in outs):
            if s.pinned:  # rule 7: kept resident only for evicted values' recipes
                cut(rt, s, op)
            continue
        if not s.pinned and sum(o.nbytes for o in outs if not o.released) > s.nbytes:
            continue
        rt.banished += 1
        fresh = [o for o in outs if not o.pinned and not o.released]
        invalidate(rt, [op], "banished: it read the end of a long chain of values without handles")
        for o in fresh:  # pinned by choice, not by necessity: the floor leaves them out (rule 5)
            o.banished = True
            rt.banished_bytes += o.nbytes


def cut(rt: Runtime, s: Storage, op: Op) -> None:
    """NOTE [ Banishing ] 7: the pinned ``s`` lost its last handle, and ``op`` reads it for outputs that are
    evicted: drop ``op``'s recipe (and those computed from its evicted outputs) where it loses no held value
    and what it pins is at most a quarter of ``s``'s bytes, which it frees."""
    cost = 0
    seen: set[Op] = set()
    work = [op]
    while work:  # what ``invalidate`` would pin or lose: its walk
        o_op = work.pop()
        if o_op in seen or o_op.compute is None:
            continue
        seen.add(o_op)
        for o in o_op.outputs:
            if o.released or o.pinned:
                continue
            if not o.resident and o.host is None and o.refs > 0:
                return  # held and evicted: see rule 7 (bringing it back here could pass the budget)
            if o.resident or o.host is not None:
                cost += o.nbytes
                if cost * 4 > s.nbytes:
                    return
            if not o.resident and o.host is None:
                work.extend(o.children)
    was = {o for o_op in seen for o in o_op.outputs if not o.pinned and not o.released}
    rt.banished += 1
    invalidate(rt, [op], "banished: it read a pinned value only evicted values still needed")
    for o in was:  # pinned by choice (rule 5), as banished outputs are
        if o.pinned and o.resident and not o.released and not o.banished:
            o.banished = True
            rt.banished_bytes += o.nbytes


def release(rt: Runtime, s: Storage) -> None:
    work = [s]
    while work:
        s = work.pop()
        if s.released:
            continue
        s.released = True
        if s.resident:
            unresident(rt, s)
            if s.pinned and rt.device_usage is not None and rt.budget is not None:
                # its memory may live on in a plain tensor (an unwrapped p.grad): outside until the next sync, a
                # guess, as a plain op's outputs are (the next reserve that must evict learns the truth first)
                rt.add_outside(s.nbytes)
        if rt.tracking:
            rt.tracker.restored(s)
        if s.host is not None:
            rt.tier.drop(s)  # type: ignore[union-attr]
        s.payload = None
        live = rt.live
        if s in live:  # (not dict.pop with a default: compiled, that is a call by the method's name)
            del live[s]
        if rt.listeners:
            rt.emit("release", s)
        op = s.op
        if op is None:
            continue
        op.live -= 1
        if op.live and op.compute is not None and all_pinned(op):  # NOTE [ Lifetimes ] 5
            work.extend(drop_recipe(op))
        elif op.live == 0:
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


def unbanish(rt: Runtime, s: Storage) -> None:
    """``s`` stops being resident: its bytes leave ``banished_bytes`` (NOTE [ Banishing ] 5)."""
    if s.banished:
        s.banished = False
        rt.banished_bytes -= s.nbytes


def unawait(rt: Runtime, s: Storage) -> None:
    """``s`` leaves the kept set (NOTE [ Lifetimes ] 3): no longer resident, or held or pinned again."""
    s.awaits = False
    del rt.awaiting[s]


def add_candidate(rt: Runtime, s: Storage) -> None:
    rt.candidates[s] = None
    rt.candidate_bytes += s.nbytes


def drop_candidate(rt: Runtime, s: Storage) -> None:
    candidates = rt.candidates
    if s in candidates:
        del candidates[s]
        rt.candidate_bytes -= s.nbytes


def add_movable(rt: Runtime, s: Storage) -> None:
    if rt.tier is not None:
        rt.movable[s] = None
        rt.movable_bytes += s.nbytes


def drop_movable(rt: Runtime, s: Storage) -> None:
    if rt.movable.pop(s, 0) is None:
        rt.movable_bytes -= s.nbytes


def unresident(rt: Runtime, s: Storage) -> None:
    s.resident = False
    if s.moves:
        drop_movable(rt, s)
    if s.host is not None:  # its spare copy is its only one now (NOTE [ Swapping ] 4)
        rt.tier.unspare(s)  # type: ignore[union-attr]
    if s.awaits:
        unawait(rt, s)
    if s.banished:
        unbanish(rt, s)
    rt.memory.free(s)
    candidates = rt.candidates
    if s in candidates:  # (drop_candidate, inlined: this runs for every dropped value)
        del candidates[s]
        rt.candidate_bytes -= s.nbytes


def pin(rt: Runtime, s: Storage, movable: bool = False) -> None:
    """Never drop ``s`` from now on: its memory is shared with something the runtime cannot see, or
    (``movable``) its recipe can no longer run, and then a tier may still copy it out (NOTE [ Swapping ] 9).

    A recipe whose every live output is pinned (and resident) will never run again: it is dropped
    (NOTE [ Lifetimes ] 5), so what only it read is released."""
    if s.pinned:
        if s.moves and not movable:  # its memory is shared now: it stays where it is
            s.moves = False
            drop_movable(rt, s)
            if s.host is not None and s.resident:
                rt.tier.drop(s)  # type: ignore[union-attr]
        return
    s.pinned = True
    s.moves = movable
    drop_candidate(rt, s)
    if s.host is not None and s.resident and not movable:  # never evicted now: its copy is of no use
        rt.tier.drop(s)  # type: ignore[union-attr]
    if movable and s.resident:
        add_movable(rt, s)
    op = s.op
    if op is not None and op.compute is not None and all_pinned(op):
        for i in drop_recipe(op):
            release(rt, i)


def invalidate(rt: Runtime, ops: Sequence[Op], why: str) -> None:
    """The recipes of ``ops`` can no longer run (``why``): pin their resident outputs, lose the evicted
    ones and what was computed from them, release what nothing needs now (NOTE [ Changed inputs ] 3)."""
    work = list(ops)
    while work:
        op = work.pop()
        if op.compute is None:  # released or invalidated already
            continue
        op.compute = None
        op.why = why
        for o in op.outputs:
            if o.released:
                continue
            if o.resident or o.host is not None:  # a swapped value keeps its copy (NOTE [ Swapping ] 9)
                pin(rt, o, movable=True)
            else:
                work.extend(o.children)
        inputs, op.inputs = op.inputs, ()
        for i in inputs:
            i.deps -= 1
            i.children.remove(op)
            if i.deps == 0 and i.refs == 0:
                release(rt, i)
