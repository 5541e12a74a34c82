"""Baselines on a log, replayed through the same core: no eviction, and sqrt(n) checkpointing.

The exact optimum (Checkmate's ILP) lives in ``checkmate.py``.
"""

from __future__ import annotations

import math
import time

from ..core import Runtime, Storage
from .log import Call, Log, Mutate
from .replay import Outcome, Replay

# NOTE [ sqrt(n) checkpointing on a log ]
#
# Chen et al. (2016) keep every k-th activation of the forward pass, k ~ sqrt(n), free the others as
# soon as the forward pass is done with them, and recompute them from the nearest checkpoint in the
# backward pass. On a log:
#
# 1. The forward pass is everything before the BACKWARD marker (the whole log if it has none); its
#    n ops (CALL or MUTATE producing storages) are numbered in order, and the outputs of every k-th op,
#    k = ceil(sqrt(n)), are the checkpoints.
# 2. A first replay with no budget finds, for each storage, the last forward instruction that reads it.
# 3. A second replay with no budget evicts every non-checkpoint forward storage right after that
#    instruction (or right after it was produced, when no forward op reads it); the backward pass then
#    rematerializes what it needs through the recipes, recursively back to checkpoints (the core's
#    ``rematerialize``), and recomputed values live until the log releases them.
# 4. It reports the overhead (as ``simulate``) and the peak it reached: a point (peak, overhead) on the
#    plots, not a budget it keeps.


def _fresh(rp: Replay, ins: Call | Mutate) -> list[Storage]:
    """The storages the instruction just created (read back through the names it bound)."""
    if type(ins) is Call:
        return [rp.names[r.name] for r in ins.results if r.alias < 0]
    return list(dict.fromkeys(rp.names[ins.args[i]] for i in ins.mutated))


class _Checkpointing(Replay):
    """Pass 1 (``drop_at is None``): records which forward op made each storage and its last forward
    read. Pass 2: evicts non-checkpoints after their last forward read (NOTE [ sqrt(n) checkpointing ... ])."""

    def __init__(self, log: Log, rt: Runtime, end: int, drop_at: dict[int, set[int]] | None = None) -> None:
        super().__init__(log, rt, thrash_at=None)
        self.end = end
        self.drop_at = drop_at
        self.made: dict[int, int] = {}  # sid -> number of the forward op that produced it
        self.last: dict[int, int] = {}  # sid -> instruction index of its last forward read (or creation)
        self.waiting: dict[int, Storage] = {}  # pass 2: sid -> storage to evict later
        self.brought: list[Storage] = []  # pass 2: rematerialized storages that no name refers to
        if drop_at is not None:
            rt.listen(lambda kind, s: self.brought.append(s) if kind == "remat" and s.refs == 0 else None)
        self.nops = 0

    def _prepare(self, args):  # type: ignore[no-untyped-def]
        ins = super()._prepare(args)
        if self.drop_at is None and self.k < self.end:
            for s in ins:
                self.last[s.sid] = self.k
        return ins

    def _op(self, ins: Call | Mutate, run) -> None:  # type: ignore[no-untyped-def]
        run(ins)
        if self.drop_at is not None and self.brought:  # intermediates of a recomputation: free them again
            brought, self.brought = self.brought, []
            for s in brought:
                if s.refs == 0:
                    self._drop(s)
        if self.k >= self.end:
            return
        fresh = _fresh(self, ins)
        if self.drop_at is None:
            for s in fresh:
                self.made[s.sid] = self.nops
                self.last.setdefault(s.sid, self.k)
            self.nops += bool(fresh)
            return
        for s in fresh:
            self.waiting[s.sid] = s
        for sid in self.drop_at.get(self.k, ()):
            s = self.waiting.pop(sid, None)
            if s is not None:
                self._drop(s)

    def _drop(self, s: Storage) -> None:
        if s.resident and not s.pinned and not s.locks and not s.released:
            self.rt.evict(s)

    def _call(self, ins):  # type: ignore[no-untyped-def]
        self._op(ins, super()._call)

    def _mutate(self, ins):  # type: ignore[no-untyped-def]
        self._op(ins, super()._mutate)


def sqrt_checkpoint(log: Log, peak: int | None = None) -> Outcome:
    """Chen et al.'s sqrt(n) checkpointing replayed on ``log`` (NOTE [ sqrt(n) checkpointing on a log ]).
    ``ratio`` in the outcome is the peak it reached over ``peak`` (the no-eviction peak)."""
    end = log.backward if log.backward is not None else len(log.instrs)
    tr = _Checkpointing(log, Runtime(None), end)
    tr.run()
    if peak is None:
        peak = tr.rt.memory.peak
    k = max(1, math.ceil(math.sqrt(tr.nops)))
    drop_at: dict[int, set[int]] = {}
    for sid, j in tr.made.items():
        if j % k != k - 1:  # not a checkpoint
            drop_at.setdefault(tr.last[sid], set()).add(sid)
    rt = Runtime(None)
    rp = _Checkpointing(log, rt, end, drop_at)
    t0 = time.perf_counter()
    rp.run()
    wall = time.perf_counter() - t0
    base = rp.base_ns or 1
    return Outcome(
        policy=f"sqrt(n) checkpoints (one in {k} of {tr.nops} forward ops)", ratio=rt.memory.peak / peak,
        budget=None, status="ok", overhead=(base + rt.remat_cost) / base, evictions=rt.evictions, drops=rt.drops,
        rematerializations=rt.rematerializations, accesses=0, peak_bytes=rt.memory.peak, ops=rt.ops,
        wall_seconds=wall, search_seconds=0.0,
    )
