"""Choosing and evicting victims: the policy's search over the candidates (with the plan of a repeated
iteration, with an unheld rematerialization's pending reads), out-of-memory retries, the device's count, and
the ``BudgetError`` when nothing is left to evict. Free functions of the runtime's state (``rt``)."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import BudgetError, fmt_bytes, suggest
from .lifetimes import awaited, unawait, unresident
from .plan import Iterations
from .records import Storage, UnheldPlan, reads
from .swap import Tier, swaps
from .trackers import Chain, Components, comp_extra

if TYPE_CHECKING:
    from .runtime import Runtime

# NOTE [ Lazy tracking ]
#
# 1. The policy's tracker (union-find sets, evicted components, chains) is only read when the policy chooses
#    a victim (``choose``). A live runtime may never choose (no budget, or a budget above the program's
#    peak), yet drops a value at almost every op (NOTE [ Lifetimes ] 3): with ``lazy_tracking=True`` (both
#    front ends') it keeps no tracker state (``tracking`` is False) until its first choice, which tells the
#    tracker every evicted storage then, oldest first (``track``). The same storages are then tracked as if
#    it had tracked all along, except for the order of floating-point cost sums and, under union-find
#    (``dtr_eq``, ``dtr_chain``), sets once joined through a value recomputed since: union-find never splits
#    them, a fresh start does not join them; ``dtr_chain``'s chain estimates also depend on the order of
#    evictions (NOTE [ Evicted chains ]), so its first choices may differ. (Tracking from the start cost a
#    budget above the peak about 2 us per op on the small-op chain of benchmarks/dispatch.py.)
# 2. A runtime created without ``lazy_tracking`` (every replay of a log, the core's tests) tracks from the
#    start: the simulator's outcomes do not change.


# NOTE [ The smallest victim ]
#
# 1. The search skips candidates under a soft floor (``min_evict_bytes``, by default 1% of the average candidate)
#    and falls back to them when nothing above it can go. ``evict_minimum`` is a hard floor below that: a storage
#    smaller is never evicted (MegEngine's evictee minimum size). Evicting a scalar frees nothing a request can
#    use, and bringing it back can cost a chain: on the bench's LSTM loop a held 4-byte loss (and the gradient's
#    seed) went by the fallback, and AdamW's first weight write rescued them by recomputing 1.7-1.9k ops (NOTE
#    [ Changed inputs ]). Live sessions use 64 B (``EVICT_MINIMUM`` in eager/front.py, both front ends; in the
#    traces' header so that replays keep it): that LSTM loop at 45% of its peak, 5 steps, recomputed 9,698
#    ops instead of 11,623 (2026-11-29, ``python benchmarks/experiments/smallest_victim.py``). The core's
#    default is 0 (logs and the core's tests count single bytes).


def sync(rt: Runtime) -> None:
    """Learn the device's bytes in use from its allocator: what the runtime does not track is ``outside``
    (NOTE [ Budget accounting ] 4). For drivers after the device's usage changed outside their ops (an
    out-of-memory retry, plain ops that allocated); ``reserve`` calls it every ``sync_every`` ops."""
    if rt.device_usage is None:
        return
    rt.syncs += 1
    rt._next_sync = rt.ops + rt.sync_every
    mem = rt.memory
    now, peak = rt.device_usage()
    mem.set_outside(max(0, now - mem.tracked - (rt.tier.pending if rt.tier is not None else 0)))
    rt._dirty = False
    rt._synced = (rt.ops, mem.tracked, mem.outside)
    # NOTE [ Budget accounting ] 6: the allocator's peak rose past the budget since the last sync: what the
    # count missed in between (an unsplit block, a kernel's scratch memory) is kept free from now on
    if rt._device_peak >= 0 and peak > rt._device_peak:  # a new peak since the last sync
        if mem.peak < peak:  # the allocator's own peak, where the count missed it
            mem.peak = peak
        if rt.budget is not None and peak > rt.budget:
            rt.headroom = min(rt.budget // 4, rt.headroom + peak - rt.budget)
            if not rt.excess:
                over = fmt_bytes(peak - rt.budget)
                warnings.warn(f"torch_dtr: the device's allocator held {over} more than the budget of "
                              f"{fmt_bytes(rt.budget)} since its last query: memory allocated where torch-dtr "
                              f"could not reserve it first (a kernel's scratch memory on its first call, a "
                              f"factory, plain code); {fmt_bytes(rt.headroom)} is kept free from now on. "
                              f"stats().excess_bytes reports the most it passed by.", RuntimeWarning, stacklevel=3)
            rt.excess = max(rt.excess, peak - rt.budget)
    rt._device_peak = peak


def evict_some(rt: Runtime, nbytes: int) -> int:
    """Evict by the policy until ``nbytes`` were freed or nothing is left to evict; return the bytes freed.

    For a front end whose allocator ran out of memory although the budget was kept (fragmentation,
    memory the runtime does not track): it evicts and retries the op before giving up.
    """
    freed = 0
    while freed < nbytes:
        victim = choose(rt)
        if victim is None:
            break
        evict_storage(rt, victim, "evict")
        freed += victim.nbytes
    return freed


def out_of_memory(rt: Runtime, nbytes: int, first: Sequence[Storage] = ()) -> int:
    """The device's allocator could not give ``nbytes`` although the budget was kept (fragmentation,
    memory the runtime does not count): evict ``first`` (the driver's choice, e.g. a window of adjacent
    blocks; those no longer evictable are skipped), then by the policy until ``nbytes`` were freed.
    Returns the bytes freed (0: nothing left to evict, the caller gives up); counted in ``Stats``."""
    freed = 0
    for s in first:
        if s.resident and not s.pinned and not s.locks and not s.released:
            evict_storage(rt, s, "evict")
            freed += s.nbytes
    if freed < nbytes:
        freed += evict_some(rt, nbytes - freed)
    if rt.tier is not None and rt.tier.pending:  # the copies out must land before the retry
        rt.tier.settle(True)
    if freed:
        rt.oom_retries += 1
        rt.oom_evicted_bytes += freed
    if rt.device_usage is not None:
        rt.sync()
    return freed


def evict_storage(rt: Runtime, s: Storage, kind: str) -> None:
    """Evict ``s``, count it as ``kind`` ("evict": to make room, "drop": NOTE [ Lifetimes ] 3), tell.
    With a tier, a policy's victim may be copied out instead, and one with a copy is swapped for free
    (NOTE [ Swapping ] 2, 4, 5)."""
    tier = rt.tier
    if tier is not None and (kind == "evict" or s.host is not None) and swaps(rt, s):
        if s.host is None:
            tier.hold(s)
            c = tier.out_cost(s.nbytes)
            rt.clock += c
            rt.swap_cost += c
        unresident(rt, s)
        s.payload = None
        if rt.listeners:
            rt.emit("swapout", s)
    else:
        if s.host is not None:  # recomputing it is cheaper now: its copy goes
            tier.drop(s)  # type: ignore[union-attr]
        unresident(rt, s)
        rt.victim.evict(s)
        if rt.tracking:
            rt.tracker.evicted(s)
    if kind == "evict":
        rt.evictions += 1
    else:
        rt.drops += 1
    if rt.listeners:
        rt.emit(kind, s)


def raise_budget(rt: Runtime, nbytes: int, where: str) -> None:
    """Nothing is left to evict and ``nbytes`` more do not fit: ``BudgetError``, saying what holds the budget."""
    mem = rt.memory
    held = mem.tracked + mem.outside
    locked = sum(s.nbytes for s in rt.candidates if s.locks)
    need = held + nbytes + rt.headroom
    # the driver's op: its inputs are what is locked; bytes pinned by banishing are a choice, not a need
    # (NOTE [ Banishing ] 5), so they stay out of the floor unless the op reads them (locked)
    if not rt.recomputing:
        chosen = sum(s.nbytes for s in rt.live if s.banished and not s.locks) if rt.banished_bytes else 0
        if need - chosen > rt.floor:
            rt.floor, rt.floor_op = need - chosen, where
    floor = ""
    if rt.floor:
        below = "below it no schedule can run" if rt.floor > rt.budget else "the budget is above it"  # type: ignore[operator]
        floor = (f" The program's single-op floor so far is {fmt_bytes(rt.floor)}"
                 f"{' (' + rt.floor_op + ')' if rt.floor_op else ''}: {below}.")
    outside = ""
    if rt.device_usage is not None:
        outside = (f", outside torch-dtr's reach {fmt_bytes(mem.outside)} (device memory it does not manage: "
                   f"parameters and buffers no managed op has read yet, optimizer state, inputs, plain "
                   f"tensors, workspaces, allocator rounding)")
        if rt.headroom:
            outside += (f", and {fmt_bytes(rt.headroom)} is kept free for what the allocator counted "
                        f"beyond torch-dtr's count between two queries")
    n, fix = suggest(max(need, rt.floor), rt.fix, rt.advise)
    raise BudgetError(
        f"torch_dtr: budget {fmt_bytes(rt.budget or 0)} ({rt.budget} B) cannot be kept: "
        f"{fmt_bytes(held)} cannot be evicted (constants {fmt_bytes(mem.constants)}, "
        f"locked by the op in flight and recomputations {fmt_bytes(locked)}, pinned or kept "
        f"{fmt_bytes(mem.tracked - mem.constants - locked)}{outside}) and {where or 'the op'} needs "
        f"{fmt_bytes(nbytes)} more; "
        f"a budget of at least {fmt_bytes(need)} ({need} B) is needed here.{floor} {fix}", budget=n)


def track(rt: Runtime) -> None:
    """Start the policy's tracker now (NOTE [ Lazy tracking ]): tell it every evicted storage, oldest first.
    Idempotent; for drivers and tests that read the tracker's features before any choice."""
    if rt.tracking:
        return
    rt.tracking = True
    tracker = rt.tracker
    for s in rt.live:
        if not s.resident:
            if s.forward is None:
                tracker.evicted(s)
            else:
                tracker.superseded(s)


def choose(rt: Runtime) -> Storage | None:
    best = policy_victim(rt)
    if rt.movable:  # NOTE [ Swapping ] 9: a pinned value the tier can take, if it scores lower
        t0 = time.perf_counter()
        m, v = movable_victim(rt, True)
        if m is None and best is None and rt.unheld is not None and rt.unheld.reads:  # (as a last resort)
            m, v = movable_victim(rt, False)
        if m is not None and v < rt._score:
            best = m
        rt.search_seconds += time.perf_counter() - t0
    return best


def movable_victim(rt: Runtime, skip_soft: bool) -> tuple[Storage | None, float]:
    """Of the pinned values a tier may copy out (``movable``), the one with the lowest score, the copies
    it needs as its cost, and that score (NOTE [ Swapping ] 9). ``skip_soft``: not one that an unheld
    plan's next steps read."""
    tier: Tier = rt.tier  # type: ignore[assignment]
    room = tier.free_bytes()
    u = rt.unheld
    soft = u.reads if skip_soft and u is not None else None
    now = rt.clock
    policy = rt.policy
    # a copy back brings no evicted neighbourhood with it (NOTE [ Swapping ] 3): the smallest extra there is
    neutral = Chain(0.0, 0.0, 1) if policy.extra == "chain" else 0.0
    best, best_score = None, math.inf
    for s in rt.movable:
        n = s.nbytes
        if s.locks or n == 0 or (s.host is None and n > room) or (soft and soft.get(s)):
            continue
        cost = tier.in_cost(n) + (0.0 if s.host is not None else tier.out_cost(n))
        stale = now - s.last_access + 1e-9
        v = cost / (n * stale) if policy.h_dtr else policy.score(cost, n, stale, neutral)
        if v < best_score:
            best, best_score = s, v
    return best, best_score


def policy_victim(rt: Runtime) -> Storage | None:
    """The policy's victim among the candidates; ``_score`` its score (-inf: a due drop or a plan's
    furthest read, taken first; inf: none)."""
    if not rt.tracking:
        track(rt)
    t0 = time.perf_counter()
    rt._score = -math.inf
    cands = rt.candidates
    n = len(cands)
    if n == 0:
        rt._score = math.inf
        rt.search_seconds += time.perf_counter() - t0
        return None
    pool: Any = cands
    if rt.sample_sqrt and n > 16:
        pool = rt.rng.sample(list(cands), max(16, math.isqrt(n)))
    floor: Any = rt.min_evict_bytes
    if floor is None:
        floor = 0.01 * rt.candidate_bytes / n
    if floor < rt.evict_minimum:
        floor = rt.evict_minimum
    u = rt.unheld
    soft = u.reads if u is not None else None
    best = None
    if rt.awaiting:  # NOTE [ Lifetimes ] 3: kept for an evicted output, which nothing waits for now
        best = due_drop(rt, soft)
        if best is not None:
            rt.search_seconds += time.perf_counter() - t0
            return best
    if soft:  # an unheld plan runs: what its next steps read goes last (NOTE [ Planned rematerialization ] 4)
        best = scored_victim(rt, [s for s in pool if not soft.get(s)], floor)
        if best is None:
            best = furthest_read(rt, u, cands)  # type: ignore[arg-type]
            rt._score = -math.inf if best is not None else math.inf
    if best is None:
        best = scored_victim(rt, pool, floor)
    least = rt.evict_minimum
    if best is None and floor > least:
        best = scored_victim(rt, pool, least)
    if best is None and pool is not cands:
        best = scored_victim(rt, cands, least)
    rt.search_seconds += time.perf_counter() - t0
    return best


def due_drop(rt: Runtime, soft: dict[Storage, int] | None) -> Storage | None:
    """A value kept without handles for a reader's evicted output (NOTE [ Lifetimes ] 3) that no such
    output waits for any more: the drop it was spared is due (not one an unheld plan's next steps read)."""
    found, gone = None, []
    for s in rt.awaiting:
        if s.refs or s.pinned:  # held again (a new view), or pinned since
            gone.append(s)
        elif not s.locks and not awaited(s) and not (soft and soft.get(s)):
            found = s
            break
    for s in gone:
        unawait(rt, s)
    return found


def furthest_read(rt: Runtime, u: UnheldPlan, cands: Any) -> Storage | None:
    """Of the candidates the unheld plan ``u``'s pending steps read, the one whose next read is furthest
    ahead (the larger on a tie): NOTE [ Planned rematerialization ] 4. The order is computed once per
    state of the plan's steps (``u.rev``), not per eviction."""
    if u.ahead_rev != u.rev:
        steps, roots = u.steps, u.roots
        ahead: dict[Storage, int] = {}  # storage -> steps until its next read
        n = len(steps)
        for k in range(n - 1, -1, -1):
            # a step already resident (brought back with a sibling) is popped without running unless it is
            # evicted first; counting its reads anyway measured better (tests' MLP 28% vs 29% of its peak)
            st = steps[k]
            for i in roots if st is None else reads(st):
                if i not in ahead:
                    ahead[i] = n - k
        u.ahead = sorted(ahead, key=lambda i: (-ahead[i], -i.nbytes))
        u.ahead_rev = u.rev
    least = max(1, rt.evict_minimum)
    for s in u.ahead:
        if s.resident and not s.locks and s.nbytes >= least and s in cands:
            return s
    return None


def scored_victim(rt: Runtime, pool: Any, floor: float) -> Storage | None:
    score = rt.policy.score
    extra = rt.tracker.extra if rt.tracker.scores else None
    bound = rt.policy.extra_floor if extra is not None else None
    now = rt.clock
    best, best_score = None, math.inf
    rt.scored += len(pool)
    it = rt.iterations
    if it.steer:  # NOTE [ Iteration plans ] 3: the plan's next read instead of the last read
        return planned_victim(rt, pool, floor, it)
    if rt.policy.h_dtr:  # the same loop with the default's score inline (the hot path of evicting)
        # the default tracker's ``extra`` called as the typed function it is (the same value; a bound
        # method called through ``Any`` cost about half the search on the bench's LSTM loop)
        comp = type(rt.tracker) is Components and bound == 0.0
        lo = float(floor)
        s: Storage
        for s in pool:
            n = s.nbytes
            if s.locks or n < lo or n == 0:
                continue
            op = s.op
            c = op.cost if op is not None else 0.0
            d = n * (now - s.last_access + 1e-9)
            if extra is None:
                v = (c + 0.0) / d
            elif bound is not None and (c + bound) / d >= best_score:
                continue
            elif comp:
                v = (c + comp_extra(s)) / d
            else:
                v = (c + extra(s)) / d
            if v < best_score:
                best, best_score = s, v
        rt._score = best_score
        return best
    for s in pool:
        if s.locks or s.nbytes < floor or s.nbytes == 0:
            continue
        stale = now - s.last_access + 1e-9
        if extra is None:
            v = score(s.cost, s.nbytes, stale, 0.0)
        elif bound is not None and score(s.cost, s.nbytes, stale, bound) >= best_score:
            continue  # even its smallest possible score does not win: its extra is not needed
        else:
            v = score(s.cost, s.nbytes, stale, extra(s))
        if v < best_score:
            best, best_score = s, v
    rt._score = best_score
    return best


def planned_victim(rt: Runtime, pool: Any, floor: float, it: Iterations) -> Storage | None:
    """``scored_victim`` while an iteration follows its plan: staleness replaced by its geometric mean with the time to
    the plan's next read (NOTE [ Iteration plans ] 3)."""
    score = rt.policy.score
    extra = rt.tracker.extra if rt.tracker.scores else None
    bound = rt.policy.extra_floor if extra is not None else None
    comp = type(rt.tracker) is Components and bound == 0.0
    now = rt.clock
    best, best_score = None, math.inf
    it.clean = False
    s: Storage
    for s in pool:
        n = s.nbytes
        if s.locks or n < floor or n == 0:
            continue
        dist = it.distance(s, now - s.last_access) + 1e-9
        c = s.cost
        if extra is None:
            v = score(c, n, dist, 0.0)
        elif bound is not None and score(c, n, dist, bound) >= best_score:
            continue
        else:
            v = score(c, n, dist, comp_extra(s) if comp else extra(s))
        if v < best_score:
            best, best_score = s, v
    rt._score = best_score
    return best
