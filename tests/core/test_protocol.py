"""The driver verbs of the runtime (acquire, ran, release, listen, set_cost): what each promises."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import BudgetError, Runtime


def _three() -> tuple[Driver, list]:
    """a, b, c of 10 B each under a 20 B budget (lru): a evicted, b older than c, both resident."""
    d = Driver(20, "lru")
    a = d.op1([], 1, 10, lambda: 1, "a")
    b = d.op1([], 1, 10, lambda: 2, "b")
    d.rt.evict(a)
    c = d.op1([], 1, 10, lambda: 3, "c")
    assert not a.resident and b.resident and c.resident
    return d, [a, b, c]


def test_acquire_locks_resident_inputs_before_bringing_back_the_others() -> None:
    d, (a, b, c) = _three()
    held = d.rt.acquire([a, b])
    assert a.resident and b.resident and a.locks == b.locks == 1
    assert not c.resident, "the stalest unlocked storage (c) made room; b was locked"
    assert d.rt.rematerializations == 1
    d.rt.release(held)
    assert a.locks == b.locks == 0
    full_check(d.rt)


def test_acquire_in_order_lets_a_later_input_be_evicted_and_brought_back() -> None:
    d, (a, b, c) = _three()
    held = d.rt.acquire([a, b], resident_first=False)
    assert a.resident and b.resident and not c.resident
    assert d.rt.rematerializations == 2, "b (stalest, not yet locked) was evicted for a, then recomputed"
    d.rt.release(held)
    full_check(d.rt)


def test_acquire_releases_what_it_held_when_it_fails() -> None:
    d = Driver(20, "lru")
    a = d.op1([], 1, 10, lambda: 1, "a")
    b = d.op1([], 1, 10, lambda: 2, "b")
    d.rt.evict(a)
    d.rt.budget = 10  # b fills it and is locked first: a cannot come back
    with pytest.raises(BudgetError, match="recomputing a"):
        d.rt.acquire([a, b])
    assert b.locks == 0 and a.locks == 0
    d.rt.budget = 20
    full_check(d.rt)


def test_ran_counts_advances_and_records_only_with_a_compute() -> None:
    d = Driver(None)
    x = d.op1([], 2, 8, lambda: 1)
    rt = d.rt
    ops, clock = rt.ops, rt.clock
    assert rt.ran([x], 5.0) is None  # no recipe: a view, or an op that cannot be replayed
    assert rt.ops == ops + 1 and rt.clock == clock + 5 and x.last_access == rt.clock and x.deps == 0
    op = rt.ran([x, x], 1.0, lambda: [2], "f")
    assert op is not None and op.inputs == (x,) and x.deps == 1 and rt.ops == ops + 2
    y = rt.output(op, 8, 2)
    rt.add_ref(y)
    full_check(rt)


def test_listeners_any_number_and_removable() -> None:
    rt = Runtime(10, "lru")
    seen_a: list[str] = []
    seen_b: list[str] = []
    rt.listen(lambda k, s: seen_a.append(k))
    stop_b = rt.listen(lambda k, s: seen_b.append(k))
    op = rt.ran([], 1.0, lambda: [1])
    s = rt.output(op, 8, 1)
    rt.add_ref(s)
    rt.reserve(8)  # evicts s
    assert seen_a == seen_b == ["evict"]
    stop_b()
    stop_b()  # twice is harmless
    rt.get(s)
    assert seen_a == ["evict", "remat"] and seen_b == ["evict"]


def test_set_cost_keeps_a_cost_summed_into_an_evicted_set() -> None:
    d = Driver(None, "dtr_eq")
    x = d.op1([], 1, 8, lambda: 1)
    y = d.op1([x], 2, 8, lambda v: v + 1)
    d.rt.set_cost(y.op, 7.0)
    assert y.cost == 7.0
    d.rt.evict(y)
    d.rt.set_cost(y.op, 9.0)  # y's cost is in its union-find set now: changing it would unbalance the sum
    assert y.cost == 7.0
    full_check(d.rt)


def test_set_budget_evicts_to_fit_or_keeps_the_old_budget() -> None:
    d = Driver(100, "lru")
    c = d.const(30, 0)
    x = d.op1([c], 1, 40, lambda v: 1)
    d.rt.set_budget(80)  # 70 tracked fits: nothing to evict
    assert x.resident and d.rt.budget == 80
    d.rt.set_budget(50)  # evicts x
    assert not x.resident and d.rt.budget == 50
    with pytest.raises(BudgetError, match="the new budget"):
        d.rt.set_budget(20)  # below the constant
    assert d.rt.budget == 50, "a budget that cannot be kept must not stay installed"
    full_check(d.rt)
