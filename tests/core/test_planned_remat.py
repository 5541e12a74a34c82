"""Planned rematerialization (NOTE [ Planned rematerialization ]) and the single-op floor (NOTE [ The
single-op floor ])."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import BudgetError
from torch_dtr.core.eviction import choose
from torch_dtr.core.records import UnheldPlan


def _chain(d: Driver, n: int, size: int, keep_handles: bool):
    rt = d.rt
    c = d.const(10, 0)
    xs = [d.op1([c], 1, size, lambda v: v + 1)]
    for _ in range(n - 1):
        xs.append(d.op1([xs[-1]], 1, size, lambda v: v + 1))
        if not keep_handles:
            rt.drop_ref(xs[-2])
    return c, xs


@pytest.mark.parametrize("keep_handles", [False, True])
def test_the_end_of_an_evicted_chain_comes_back_with_two_storages_beyond_the_constant(keep_handles: bool) -> None:
    # the DTR theorem's chain: no budget, everything evicted, then its end read: the plan runs the chain in
    # order, and a value without handles is dropped as soon as its reader ran; one with a handle is left to
    # the policy, so the peak is what was resident before plus at most two links (input and output of a step)
    d = Driver(10 + 2 * 8, "dtr_eq")
    rt = d.rt
    c, xs = _chain(d, 200, 8, keep_handles)
    for s in xs:
        if s.resident:
            rt.evict(s)
    rt.reset_peak()
    assert d.read(xs[-1]) == 200
    assert rt.memory.peak <= 10 + 2 * 8
    assert rt.rematerializations == 200
    full_check(rt)


def test_a_recurrence_whose_side_inputs_are_older_than_its_chain() -> None:
    # h_t = f(h_{t-1}, x_t), every x_t computed up front (older than every h): recomputing the oldest input
    # first would hold each x_t locked while the h chain below it is recomputed, so bringing back h_n would
    # need n x's at once; the plan visits the deeper input (the chain) first and needs O(1).
    n, size = 40, 8
    d = Driver(None, "dtr_eq", banish_depth=0)  # the chain is what is measured: keep it whole
    rt = d.rt
    c = d.const(10, 0)
    xs = [d.op1([c], 1, size, lambda v, k=k: v + k) for k in range(n)]
    hs = [d.op1([c], 1, size, lambda v: v)]
    for x in xs:
        hs.append(d.op1([hs[-1], x], 1, size, lambda h, xv: h + xv))
    for s in xs[:-1] + hs[:-1]:
        rt.drop_ref(s)  # only the end and the last x are held
    want = hs[-1].payload
    for s in (*xs, *hs):
        if s.resident:
            rt.evict(s)
    rt.reset_peak()
    assert d.read(hs[-1]) == want
    extra = (rt.memory.peak - 10) // size
    assert extra <= 4, extra  # (the older stack, oldest input first, held n = 40)
    full_check(rt)


def test_an_op_whose_inputs_do_not_fit_with_locks_is_run_by_one_plan() -> None:
    # o = op(a, z): a resident, z = f(y, w) evicted with y and w (no handles). Locking a first leaves no
    # room to hold y, w and z at once (10 + 8 + 3 * 8 = 42 > 34); the fallback drops the locks, lets the
    # policy evict a while z is recomputed and brings a back after (a stack that locks what it brought back
    # fails here with BudgetError).
    d = Driver(10 + 3 * 8, "lru")
    rt = d.rt
    c = d.const(10, 0)
    y = d.op1([c], 1, 8, lambda v: v + 1)
    w = d.op1([c], 1, 8, lambda v: v + 2)
    z = d.op1([y, w], 1, 8, lambda u, v: u + v)
    rt.drop_ref(y)  # dropped: evicted at once (z's recipe reads them)
    rt.drop_ref(w)
    rt.evict(z)
    a = d.op1([c], 1, 8, lambda v: v + 100)
    assert not (y.resident or w.resident or z.resident) and a.resident
    (o,) = d.op([a, z], 1, [8], lambda av, zv: [av + zv])
    assert o.payload == 100 + 3
    assert rt.memory.peak <= 10 + 3 * 8
    assert rt.rematerializations == 4  # y, w, z, and a after the policy evicted it
    full_check(rt)


def test_the_floor_is_the_largest_op_with_what_cannot_be_evicted() -> None:
    d = Driver(None, "dtr_eq")
    rt = d.rt
    c = d.const(10, 0)  # pinned: counted in every op's floor
    a = d.op1([c], 1, 20, lambda v: v + 1)  # 10 + 20 (c is pinned, counted once)
    b = d.op1([a, a], 1, 5, lambda x, y: x + y)  # 10 + 20 + 5: a counted once
    d.op([a, b], 1, [7, 3], lambda x, y: [x, y])  # 10 + 20 + 5 + 7 + 3 = 45
    assert rt.stats().floor_bytes == 45
    full_check(rt)


def test_a_budget_error_below_the_floor_says_no_schedule_can_run() -> None:
    d = Driver(40, "dtr_eq")
    rt = d.rt
    c = d.const(10, 0)
    a = d.op1([c], 1, 20, lambda v: v + 1)
    with pytest.raises(BudgetError, match=r"single-op floor so far is 45 B.*below it no schedule can run"):
        d.op1([a], 1, 15, lambda v: v + 1)  # 10 + 20 + 15 = 45 > 40
    assert rt.stats().floor_bytes == 45
    full_check(rt)


def test_an_unheld_plan_evicts_what_its_next_steps_read_last() -> None:
    # NOTE [ Planned rematerialization ] 4: while an unheld plan runs, the policy first chooses among the
    # candidates no pending step reads (the GPT-2 test model's smallest budget went from 35% to 29% of its
    # peak); only when none fits does it take a pending one
    d = Driver(None, "lru")
    rt = d.rt
    c = d.const(10, 0)
    p = d.op1([c], 1, 8, lambda v: v + 1)  # the oldest: LRU's pick
    q = d.op1([c], 1, 8, lambda v: v + 2)
    assert choose(rt) is p
    x = d.op1([p], 1, 4, lambda v: v * 2)
    rt.evict(x)
    rt.unheld = UnheldPlan({p: 1}, [x], ())  # the plan's pending step (x's recipe) reads p
    try:
        assert choose(rt) is q
        rt.lock([q])
        assert choose(rt) is p  # nothing else can go
        rt.unlock([q])
    finally:
        rt.unheld = None
    full_check(rt)


def test_an_unheld_plan_evicts_the_planned_value_read_furthest_ahead() -> None:
    # NOTE [ Planned rematerialization ] 4: among values the plan still reads, Belady's rule, not the
    # policy's score (LRU here would take q, the oldest; the next step reads q, so p goes)
    d = Driver(None, "lru")
    rt = d.rt
    c = d.const(10, 0)
    q = d.op1([c], 1, 8, lambda v: v + 2)
    p = d.op1([c], 1, 8, lambda v: v + 1)
    y = d.op1([q], 1, 4, lambda v: v * 3)  # reads q
    x = d.op1([p], 1, 4, lambda v: v * 2)  # reads p (so q is the least recently used)
    rt.evict(x)
    rt.evict(y)
    assert choose(rt) is q
    def plan(steps, roots=()):  # what bring(hold=False) sets while its plan runs
        rt.unheld = UnheldPlan({p: 1, q: 1}, steps, roots)

    try:
        plan([x, y])  # y's recipe runs next, then x's
        assert choose(rt) is p
        plan([y, x])  # x's recipe next
        assert choose(rt) is q
        plan([None, x], [q])  # the caller's op reads the roots last
        assert choose(rt) is q
        rt.lock([q])
        assert choose(rt) is p, "the next best when the furthest is locked"
        rt.unlock([q])
        rt.evict(p)  # the cached order is reused; an evicted value is skipped
        assert choose(rt) is q
    finally:
        rt.unheld = None
    full_check(rt)
