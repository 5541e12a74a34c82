"""The driver verbs of the runtime (acquire, ran, release, listen, set_cost): what each promises."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import BudgetError, Runtime, Storage


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


def _changed_chain() -> tuple[Driver, list]:
    """k (a constant) -> a -> b -> c, 10 B each; a and b evicted, the handle on a dropped (kept for b's recipe)."""
    d = Driver(None, "dtr_eq")
    k = d.const(10, 1)
    a = d.op1([k], 1, 10, lambda v: v + 1, "a")
    b = d.op1([a], 1, 10, lambda v: v * 2, "b")
    c = d.op1([b], 1, 10, lambda v: v + 3, "c")
    d.rt.drop_ref(a)  # no handle, a reader lives: evicted at once (NOTE [ Lifetimes ] 3)
    d.rt.evict(b)
    assert not a.resident and not b.resident and c.resident
    return d, [k, a, b, c]


def test_stranded_names_the_evicted_values_with_handles_an_invalidation_would_lose() -> None:
    d, (k, a, b, c) = _changed_chain()
    assert d.rt.stranded([a.op]) == [b], "a has no handle; c is resident"
    assert d.rt.stranded([c.op]) == []


def test_invalidate_after_rescuing_keeps_every_held_value_and_releases_the_rest() -> None:
    d, (k, a, b, c) = _changed_chain()
    rt = d.rt
    ops = [a.op]  # the recipes that read k
    for s in rt.stranded(ops):  # what the front end does before a write (NOTE [ Changed inputs ] 2)
        rt.rematerialize(s)
        rt.pin(s)
    # pinning b dropped b's recipe (NOTE [ Lifetimes ] 5), and with it a, which only b's recipe read
    assert a.released and b.op.compute is None
    rt.invalidate(ops, "k changed")  # a's recipe went with a: nothing left to do
    assert a.released, "nothing needs a any more: b is pinned, its recipe dropped"
    assert b.resident and b.pinned and b.payload == 4
    assert c.resident and not c.pinned and c.op.compute is not None, "c's recipe reads b, which stays"
    rt.evict(c)
    assert d.read(c) == 7
    full_check(rt)


def test_a_lost_value_raises_constant_changed_when_read() -> None:
    from torch_dtr.core import ConstantChangedError

    d, (k, a, b, c) = _changed_chain()
    rt = d.rt
    rt.evict(c)
    rt.invalidate([a.op], "k changed")  # no rescue: b and c are lost, a released
    assert a.released and not b.released and not c.released
    with pytest.raises(ConstantChangedError, match="output of c .*evicted, and then k changed"):
        d.read(c)
    full_check(rt)
    rt.drop_ref(c)
    rt.drop_ref(b)
    assert b.released and c.released and len(rt.live) == 1  # only k
    full_check(rt)


def _two_outputs_of_a_handleless_value() -> tuple[Driver, Storage, Storage, Storage]:
    """k (a constant) -> a -> (x, y); a's handle dropped, so only xy's recipe keeps it (evicted, not released)."""
    d = Driver(None, "dtr_eq")
    k = d.const(10, 1)
    a = d.op1([k], 1, 40, lambda v: v + 1, "a")
    x, y = d.op([a], 1, [4, 8], lambda v: [v * 2, v * 3], "xy")
    d.rt.drop_ref(a)
    assert not a.released and a.deps == 1
    return d, a, x, y


def test_pinning_every_live_output_drops_the_recipe_and_what_only_it_read() -> None:
    # NOTE [ Lifetimes ] 5: a pinned value is never recomputed, so its recipe need not keep its inputs.
    d, a, x, y = _two_outputs_of_a_handleless_value()
    rt = d.rt
    rt.pin(x)
    assert not a.released and x.op.compute is not None, "y can still be evicted and needs the recipe"
    rt.evict(y)
    assert d.read(y) == 6
    rt.pin(y)
    assert x.op.compute is None and a.released, "both outputs pinned: the recipe and a go"
    assert d.read(x) == 4 and d.read(y) == 6
    full_check(rt)


def test_releasing_the_last_unpinned_output_drops_the_recipe() -> None:
    d, a, x, y = _two_outputs_of_a_handleless_value()
    rt = d.rt
    rt.pin(x)
    rt.drop_ref(y)  # y released: x, pinned, is the only live output left
    assert y.released and x.op.compute is None and a.released
    assert d.read(x) == 4
    full_check(rt)


def test_a_pinned_evicted_value_keeps_its_recipe() -> None:
    d = Driver(None, "dtr_eq")
    rt = d.rt
    k = d.const(10, 1)
    a = d.op1([k], 1, 40, lambda v: v + 1, "a")
    b = d.op1([a], 1, 40, lambda v: v * 2, "b")
    rt.evict(b)
    rt.pin(b)  # pinned while evicted: it must still come back
    assert b.op.compute is not None
    assert d.read(b) == 4
    full_check(rt)


def test_dropping_pinned_recipes_along_a_long_chain_does_not_recurse() -> None:
    # each op makes [x_k, y_k] from x_{k-1}; every y_k pinned (unwrapped), the x's without handles: releasing
    # the last x drops 3,000 recipes one after the other (a recursive release hit Python's recursion limit)
    d = Driver(None, "dtr_eq")
    rt = d.rt
    prev = d.const(4, 0)
    ys = []
    for k in range(3000):
        nx, y = d.op([prev], 1, [4, 4], lambda v: [v + 1, v], f"s{k}")
        rt.pin(y)
        if k:
            rt.drop_ref(prev)
        ys.append(y)
        prev = nx
    rt.drop_ref(prev)
    assert all(y.resident and y.op.compute is None for y in ys)
    assert len(rt.live) == 1 + len(ys)  # the constant and the pinned values
    full_check(rt)
