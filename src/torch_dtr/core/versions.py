"""In-place writes (new versions of a storage) and inputs of recipes that change (constants): free functions
of the runtime's state, called by its verbs ``new_version``, ``overwritten``, ``stranded``, ``rescue``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import internal_assert
from .lifetimes import drop_candidate, drop_movable, orphaned, pin, release, unawait, unbanish
from .records import Op, Storage
from .swap import swaps

if TYPE_CHECKING:
    from .runtime import Runtime

# NOTE [ Changed inputs ]
#
# 1. A recipe is valid only while what it reads keeps its value. Managed storages never change (an
#    in-place write makes a new version), but constants do: an optimizer step, a write through ``.data``,
#    ``p.data = ...``. The front end sees such a write before it happens and hands the ops whose recipes
#    read the constant to ``invalidate``.
# 2. First (``rescue``): evicted storages that would be left without a recipe and that something holds
#    (``refs > 0``, found by ``stranded``) are rematerialized and pinned, while their inputs still have the
#    values they read; the program keeps the values it computed. That may need memory: a ``BudgetError``
#    then names the write. Bringing one back may evict a value the search went through, so ``rescue`` looks
#    again until nothing is stranded (each round pins at least one value for good).
# 3. ``invalidate`` (lifetimes.py: banishing uses it too) drops the recipes: their resident outputs are pinned
#    (nothing can recompute them, so they are never evicted: a ``BudgetError`` cannot destroy a value the
#    program holds), evicted ones are lost, and so is, recursively, what was computed from a lost one. Inputs
#    lose a dependent and are released when nothing else needs them: a loss kept for logging no longer keeps
#    its step's whole forward (and input batch) alive through recipes (simrd's banishing).
# 4. Reading a lost storage raises ``ConstantChangedError``. Only a write the front end did not see in
#    advance can lose a held value (see its NOTE [ Changed constants ]).


def _sid(s: Storage) -> int:
    return s.sid


def new_version(rt: Runtime, old: Storage, op: Op | None, payload: Any = None) -> Storage:
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
    if payload is None and old.deps > 0 and not old.recomputable:
        internal_assert(False, f"in-place write to {old}, which recipes read and nothing can recompute: "
                               f"the write must go to a copy")
    if payload is not None:
        new = rt.output(op, old.nbytes, payload)
    else:  # the bytes move from old to new: tracked does not change
        new = rt._storage(op, old.nbytes, old.payload)
        old.payload = None
        old.resident = False
        if old.awaits:
            unawait(rt, old)
        drop_candidate(rt, old)
        if old.moves:
            drop_movable(rt, old)
        unbanish(rt, old)
        if old.host is not None:  # its copy keeps the old value: swapped (NOTE [ Swapping ] 4)
            rt.tier.unspare(old)  # type: ignore[union-attr]
        elif rt.tracking:
            rt.tracker.superseded(old)
    old.forward = new
    new.refs += old.refs
    old.refs = 0
    if old.deps == 0:
        release(rt, old)
        return new
    if payload is None and old.host is not None and not swaps(rt, old):  # NOTE [ Swapping ] 4
        rt.tier.drop(old)  # type: ignore[union-attr]
        if rt.tracking:
            rt.tracker.superseded(old)
    if rt.banish_depth and payload is None:
        orphaned(rt, old)
    return new


def overwritten(rt: Runtime, s: Storage) -> None:
    """The driver wrote the pinned ``s`` in place without a new version (nothing reads it): a copy of it in
    the tier holds the old value and goes (NOTE [ Swapping ] 9)."""
    if s.host is not None:
        internal_assert(s.resident, f"in-place write to the swapped {s}")
        rt.tier.drop(s)  # type: ignore[union-attr]


def stranded(rt: Runtime, ops: Sequence[Op]) -> list[Storage]:
    """The evicted storages with handles that ``invalidate(ops)`` would lose, oldest first
    (NOTE [ Changed inputs ] 2)."""
    found: dict[Storage, None] = {}
    seen: set[Op] = set()
    work = list(ops)
    while work:
        op = work.pop()
        if op in seen or op.compute is None:
            continue
        seen.add(op)
        for o in op.outputs:
            if o.resident or o.released or o.host is not None or o in found:
                continue
            if o.refs > 0:
                found[o] = None
            work.extend(o.children)
    return sorted(found, key=_sid)


def rescue(rt: Runtime, ops: Sequence[Op]) -> None:
    """Bring back and pin what ``invalidate(ops)`` would lose that something holds (NOTE [ Changed inputs ]
    2), until nothing is left: bringing one back may evict another value that the walk passed through.
    The pins are movable: only the runtime holds these values (NOTE [ Swapping ] 9)."""
    while True:
        lost = stranded(rt, ops)
        if not lost:
            return
        for s in lost:
            if not s.resident:  # (an earlier one's plan may have brought it back)
                rt.rematerialize(s)
            pin(rt, s, movable=True)
