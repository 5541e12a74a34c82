"""Planned allocation (MegTaiChi's TMA): an offset in one arena for every request of a traced iteration.

    plan([Request(start=0, end=4, size=64), Request(2, 6, 32)])   # -> Plan(offsets=[0, 64], size=96)

Torch-free. A request is one allocation of a storage: the bytes it needs from the event that made it (an op, a
recomputation, a copy back) to the event that freed it (an eviction, its last handle's death). NOTE [ Planned
allocation ] below.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# NOTE [ Planned allocation ]
#
# 1. The problem: give each request an offset so that no two requests live at the same time overlap in space,
#    and the arena (the largest offset + size) is small. Its lower bound is the most bytes live at once
#    (``max_live``); finding the optimum is NP-hard (dynamic storage allocation).
# 2. The rule (greedy by size, as TFLite's planner): requests in order of size, largest first (ties: the longer
#    lifetime, then the earlier start); each takes the lowest offset where it overlaps no placed request that
#    lives at the same time. Large requests placed first leave holes only small ones fill. The plan also tries
#    other ties among equal sizes (the latest end first, the earliest start first: on the LSTM loop at 50% the
#    ties alone moved the arena between 1.11x and 1.23x), the order by size x lifetime, two orders by
#    *contention* (the most bytes live at once during a request's lifetime, as TelaMalloc orders by it): size x
#    contention, and size with ties by contention; for every order, the smallest gap that fits instead of the
#    lowest too; it keeps the smallest arena, or ``first_fit``'s where that is smaller. Each won on some of the
#    bench's traces (2026-11-29 and 2026-11-30: size x contention took the LSTM loop at 50% from 1.107x to 1.061x,
#    ties by contention GPT-2 at 30% from 1.024x to 1.012x); orders by lifetime alone and by breadth never won, nor
#    did random ties, a bottom-up skyline, or the last plan's offsets as the next order. docs/arena.md.
# 3. The placed requests a request can collide with are found through time buckets (``_BUCKET`` events wide):
#    each placed request is listed in every bucket its lifetime touches, so a query reads the buckets of its own
#    lifetime instead of every placed request.
# 4. ``first_fit`` is what an allocator without a plan does (each request, in time order, at the lowest free
#    offset then; nothing moves): the baseline the plan is measured against (docs/arena.md).
# 5. Following a plan live (``periodic``; native/planned.h serves it, the simulated device's rule 10 in
#    native/simdevice.py): a training loop repeats its iteration, and some blocks outlive the iteration that made
#    them (gradients, made in the backward, freed by the next ``zero_grad``). So the plan is of one period of a
#    repeating schedule, cut where the fewest bytes live across (the cut falls between two requests; the bytes
#    that live across it are left to the allocator's own pools, as is a request that lives a whole period or
#    more); each request's lifetime is counted from the cut, and the plan is then ``plan``'s. An allocator follows
#    it as a cycle of requests: the n-th from the cut takes its offset while it has the plan's bytes and no live
#    block of the arena holds its range; at the first request that differs the program has left the plan, and the
#    rest go to the pools.
# 6. Tried and not kept (2026-11-30): the plan in the pools' own address range (the simulated device's expandable
#    segments), the blocks alive when it is made (parameters, the optimizer's state, the last step's gradients) as
#    ranges taken throughout, so that the holes between them are filled again instead of mapped beside an arena. GPT-2
#    at 80% of its peak, scale 1, after settling: 812 MiB reserved against 730 MiB without a plan (and 766 MiB with the
#    arena of its own). The gradients alive at that moment die in the next step, but were kept out of the plan's ranges
#    for all of it; and the runtime's iteration plans changed rule at the 5th step (NOTE [ Iteration plans ] 5), so
#    the requests changed too. What it would need: the blocks of the steps before the plan told apart from those
#    that stay, and a request that lives across the cut placed as two pieces at one address.
# 7. Then the squeaky wheel (Joslin and Clements' squeaky wheel optimization): from each of the ``STARTS`` orders
#    whose arenas came out smallest, a request that ends above the most bytes live at once is moved ahead in the
#    order (its rank halved, less one) and every request placed again; the smallest arena of all passes is kept. A
#    start stops after ``PATIENCE`` passes without a smaller arena, and the search when an arena comes within
#    ``CLOSE`` of that lower bound or after ``WORK`` placements in all (at most ``SQUEAKS`` passes), so its time is
#    bounded and the plan deterministic. Measured on the bench's traces (2026-12-01, benchmarks/arena.py): the LSTM
#    loop at 50% of its peak from 1.061x to 1.013x, ResNet-50 at 50% from 1.020x to 1.000x. Tried and not kept:
#    moving such a request to the front of the order (the LSTM loop at 50%: 1.061x; GPT-2 at 30%: 1.000x) or back by
#    a fixed 5% of the requests (1.023x; 1.012x); halving alone kept every trace that trained within 1.02x.

_BUCKET = 64  # events per time bucket (rule 3)
STARTS, PATIENCE, SQUEAKS = 3, 20, 150  # rule 7: the orders it starts from, passes without a smaller arena, passes
CLOSE = 1.001  # rule 7: an arena within this of the most bytes live at once is not searched further
WORK = 400_000  # rule 7: placements in all (a pass places every request once)


@dataclass(frozen=True)
class Request:
    """Bytes ``size`` live from event ``start`` to event ``end`` (exclusive; ``end > start``)."""

    start: int
    end: int
    size: int

    def __post_init__(self) -> None:
        if not (self.end > self.start >= 0 and self.size >= 0):
            raise ValueError(f"torch_dtr: a request needs 0 <= start < end and size >= 0, got start {self.start}, "
                             f"end {self.end}, size {self.size}")


@dataclass(frozen=True)
class Plan:
    offsets: list[int]  # one per request, in the order given
    size: int  # the arena: the largest offset + size


def max_live(requests: Iterable[Request]) -> int:
    """The most bytes live at once: the lower bound of any arena (rule 1)."""
    deltas: dict[int, int] = {}
    for r in requests:
        deltas[r.start] = deltas.get(r.start, 0) + r.size
        deltas[r.end] = deltas.get(r.end, 0) - r.size
    live = best = 0
    for t in sorted(deltas):
        live += deltas[t]
        best = max(best, live)
    return best


def _lowest_gap(placed: list[tuple[int, int]], size: int, best: bool = False) -> int:
    """The offset where ``size`` bytes go between the intervals ``placed`` ((offset, end), sorted): the lowest gap
    that fits, or with ``best`` the smallest one (the lowest of those); above them all where none fits."""
    at = 0
    found, room = -1, 0
    for lo, hi in placed:
        if lo - at >= size:
            if not best:
                return at
            if found < 0 or lo - at < room:
                found, room = at, lo - at
        at = max(at, hi)
    return found if found >= 0 else at


# NOTE [ Planned allocation ] 2: the orders tried, each with the lowest and the smallest gap; the smallest arena wins.
# Each key gets the request and its contention.
_ORDERS = {
    "size": lambda r, c: (-r.size, r.start - r.end, r.start),
    "size, ending last first": lambda r, c: (-r.size, -r.end, r.start),
    "size, starting first": lambda r, c: (-r.size, r.start, -r.end),
    "area": lambda r, c: (-r.size * (r.end - r.start), r.start),
    "size x contention": lambda r, c: (-r.size * c, r.start),
    "size, then contention": lambda r, c: (-r.size, -c, -r.end),
}


def contention(requests: Sequence[Request]) -> list[int]:
    """Per request, the most bytes live at once during its lifetime (rule 2): a sparse table of range maxima over
    the bytes live at each event."""
    if not requests:
        return []
    end = max(r.end for r in requests)
    live = [0] * (end + 1)
    for r in requests:
        live[r.start] += r.size
        live[r.end] -= r.size
    for t in range(1, end + 1):
        live[t] += live[t - 1]
    table = [live]
    width = 1
    while 2 * width <= end:
        prev = table[-1]
        table.append([max(prev[t], prev[t + width]) for t in range(len(prev) - width)])
        width *= 2
    out = []
    for r in requests:
        k = (r.end - r.start).bit_length() - 1
        row = table[k]
        out.append(max(row[r.start], row[r.end - (1 << k)]))
    return out


def _greedy(requests: Sequence[Request], order: list[int], best: bool) -> Plan:
    offsets = [0] * len(requests)
    buckets: dict[int, list[int]] = {}
    arena = 0
    for i in order:
        r = requests[i]
        if r.size == 0:
            continue
        seen: set[int] = set()
        busy: list[tuple[int, int]] = []
        for b in range(r.start // _BUCKET, (r.end - 1) // _BUCKET + 1):
            for j in buckets.get(b, ()):
                if j not in seen:
                    seen.add(j)
                    q = requests[j]
                    if q.start < r.end and r.start < q.end:
                        busy.append((offsets[j], offsets[j] + q.size))
        busy.sort()
        at = _lowest_gap(busy, r.size, best)
        offsets[i] = at
        arena = max(arena, at + r.size)
        for b in range(r.start // _BUCKET, (r.end - 1) // _BUCKET + 1):
            buckets.setdefault(b, []).append(i)
    return Plan(offsets, arena)


def plan(requests: Sequence[Request], work: int = WORK) -> Plan:
    """Offsets for ``requests`` by rules 2 and 7; no two requests live at the same time overlap in space. ``work``:
    the placements rule 7 may make in all (0: none)."""
    c = contention(requests)
    tried = []  # (arena, the order's index, fit, plan, order): never empty
    for k, key in enumerate(_ORDERS.values()):
        order = sorted(range(len(requests)), key=lambda i: key(requests[i], c[i]))
        for fit in (False, True):
            p = _greedy(requests, order, fit)
            tried.append((p.size, k, fit, p, order))
    tried.sort(key=lambda t: t[:3])
    best = tried[0][3]
    floor = max_live(requests)
    passes = min(SQUEAKS, work // max(1, len(requests)))
    for _size, _k, fit, p, order in tried[:STARTS]:
        if best.size <= floor * CLOSE or passes <= 0:
            break
        q, used = _squeaky(requests, order, fit, p, floor, passes)
        passes -= used
        if q.size < best.size:
            best = q
    online = first_fit(requests)
    return online if online.size < best.size else best


def _squeaky(requests: Sequence[Request], order: list[int], fit: bool, p: Plan, floor: int,
             passes: int) -> tuple[Plan, int]:
    """Rule 7 from the greedy ``order`` and its plan ``p``: the smallest plan found, and the passes it took."""
    rank = [0.0] * len(requests)
    for pos, i in enumerate(order):
        rank[i] = pos
    best, since, used = p, 0, 0
    while used < passes and since < PATIENCE and best.size > floor * CLOSE:
        for i, r in enumerate(requests):  # above the floor: placed earlier next time
            if r.size and p.offsets[i] + r.size > floor:
                rank[i] = rank[i] / 2 - 1
        p = _greedy(requests, sorted(range(len(requests)), key=rank.__getitem__), fit)
        used += 1
        if p.size < best.size:
            best, since = p, 0
        else:
            since += 1
    return best, used


def first_fit(requests: Sequence[Request]) -> Plan:
    """Rule 4: each request in time order at the lowest offset free when it starts (frees first at a tie)."""
    events = sorted([(r.end, 0, i) for i, r in enumerate(requests)] + [(r.start, 1, i) for i, r in enumerate(requests)])
    offsets = [0] * len(requests)
    busy: list[tuple[int, int]] = []  # (offset, end) of the live requests, sorted
    arena = 0
    for _t, kind, i in events:
        r = requests[i]
        if r.size == 0:
            continue
        if kind == 0:
            busy.remove((offsets[i], offsets[i] + r.size))
            continue
        at = _lowest_gap(busy, r.size)
        offsets[i] = at
        bisect.insort(busy, (at, at + r.size))
        arena = max(arena, at + r.size)
    return Plan(offsets, arena)


def check(requests: Sequence[Request], p: Plan) -> None:
    """Assert rule 1's invariant: requests live at the same time do not overlap in space (O(n log n + overlaps))."""
    events = sorted([(r.start, 1, i) for i, r in enumerate(requests) if r.size]
                    + [(r.end, 0, i) for i, r in enumerate(requests) if r.size])
    live: list[tuple[int, int, int]] = []
    for _t, kind, i in events:
        lo, hi = p.offsets[i], p.offsets[i] + requests[i].size
        if kind == 0:
            live.remove((lo, hi, i))
            continue
        k = bisect.bisect_left(live, (lo, hi, i))
        assert k == 0 or live[k - 1][1] <= lo, f"request {i} at [{lo}, {hi}) overlaps request {live[k - 1][2]}"
        assert k == len(live) or hi <= live[k][0], f"request {i} at [{lo}, {hi}) overlaps request {live[k][2]}"
        live.insert(k, (lo, hi, i))
        assert hi <= p.size, f"request {i} ends at {hi}, past the arena's {p.size}"


@dataclass(frozen=True)
class Cycle:
    cut: int  # the request (by index) the plan's period begins with
    offsets: list[int]  # per request, in the order given: its offset in the arena, or -1 (the allocator's pools)
    size: int  # the arena


def periodic(sizes: Sequence[int], starts: Sequence[int], ends: Sequence[int], period: int) -> Cycle:
    """A plan for one period of a repeating schedule (rule 5): request i of ``sizes[i]`` bytes is allocated at event
    ``starts[i]`` (ascending, within ``[0, period)``) and freed at ``ends[i]`` (after its start, possibly in the
    next period; -1: it lives on)."""
    n = len(sizes)
    if not (len(starts) == n == len(ends)) or period <= 0:
        raise ValueError(f"torch_dtr: periodic() needs one start and end per size and a period > 0, got {n} sizes, "
                         f"{len(starts)} starts, {len(ends)} ends, period {period}")
    cyclic = [ends[i] >= 0 and ends[i] - starts[i] < period for i in range(n)]
    diff = [0] * (period + 1)  # bytes live at each event of the period, requests from the period before included
    begin = [0] * (period + 1)  # bytes of the requests allocated at each event
    for i in range(n):
        if not cyclic[i]:
            continue
        s, e, z = starts[i], ends[i], sizes[i]
        begin[s] += z
        diff[s] += z
        if e <= period:
            diff[e] -= z
        else:
            diff[period] -= z
            diff[0] += z
            diff[e - period] -= z
    live, best, cut_at = 0, None, 0
    for t in range(period):
        live += diff[t]
        across = live - begin[t]
        if begin[t] and (best is None or across < best):
            best, cut_at = across, t
    cut = bisect.bisect_left(list(starts), cut_at) if n else 0
    offsets = [-1] * n
    spans: list[Request] = []
    kept: list[int] = []
    for i in range(n):
        if not cyclic[i]:
            continue
        s = starts[i] - cut_at + (period if starts[i] < cut_at else 0)
        e = s + ends[i] - starts[i]
        if e > period:  # it lives across the cut
            continue
        spans.append(Request(s, e, sizes[i]))
        kept.append(i)
    p = plan(spans)
    for i, off in zip(kept, p.offsets, strict=True):
        offsets[i] = off
    return Cycle(cut, offsets, p.size)
