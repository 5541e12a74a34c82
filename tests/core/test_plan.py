"""Plans from traced iterations (NOTE [ Iteration plans ] in core/plan.py): a repeated iteration is recognised and
followed, the eviction search then scores by the plan's next read, a different iteration leaves the plan and is
counted, and the rule that cost less is kept. Torch-free, through the driver verbs."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check


def _iteration(d: Driver, c, layers: int, size: int = 8) -> int:
    """A training-like iteration: a forward chain from ``c``, then a backward that reads it in reverse; every handle
    dies by its end. Returns the value computed (the same at every budget)."""
    rt = d.rt
    xs = [d.op1([c], 1, size, lambda v: v + 1, "fwd")]
    for _ in range(layers - 1):
        xs.append(d.op1([xs[-1]], 1, size, lambda v: v * 3 % 1009, "fwd"))
    g = d.op1([xs[-1]], 1, size, lambda v: v + 7, "loss")
    for x in reversed(xs):
        g2 = d.op1([g, x], 1, size, lambda a, b: (a * 31 + b) % 10007, "bwd")
        rt.drop_ref(g)
        rt.drop_ref(x)
        g = g2
    value = d.read(g)
    rt.drop_ref(g)
    return value


def _train(budget: int | None, iterations: int, layers: int = 24, boundaries: bool = True):
    d = Driver(budget, "dtr_comp")
    c = d.const(8, 1)
    values, costs = [], []
    for _ in range(iterations):
        before = d.rt.remat_cost
        values.append(_iteration(d, c, layers))
        costs.append(d.rt.remat_cost - before)
        if boundaries:
            d.rt.boundary()
    full_check(d.rt)
    return d, values, costs


def test_a_repeated_iteration_is_followed_to_its_end_with_the_same_values() -> None:
    _, plain, _ = _train(None, 4)
    d, values, _ = _train(8 + 10 * 8, 4)
    assert values == plain
    st = d.rt.stats()
    assert (st.iterations, st.diverged) == (4, 0)
    assert st.planned >= 1  # the second iteration follows the first's plan (rule 5: the plan first)
    assert st.evictions > 0 and st.peak_bytes <= 8 + 10 * 8


def test_an_iteration_that_differs_leaves_the_plan_and_is_counted() -> None:
    d = Driver(8 + 10 * 8, "dtr_comp")
    c = d.const(8, 1)
    for layers in (24, 24, 25, 25):
        _iteration(d, c, layers)
        d.rt.boundary()
    st = d.rt.stats()
    assert st.diverged == 1  # the third: one op more than its plan, from the first backward op on
    assert "not the plan's" in d.rt.iterations.divergence
    assert st.planned == 2  # the second, and the fourth (which follows the third's record)
    full_check(d.rt)


def test_without_boundaries_nothing_is_planned() -> None:
    d, _, _ = _train(8 + 10 * 8, 3, boundaries=False)
    st = d.rt.stats()
    assert (st.iterations, st.planned, st.diverged) == (0, 0, 0)


def test_following_the_plan_evicts_what_is_read_furthest_ahead_not_the_stalest() -> None:
    # a and b are made; a is read, so b is the stalest; then room is needed. The plan knows that b is read next
    # and a only much later: it evicts a, where the dynamic policy (the first iteration) evicts b.
    victims = []

    def iteration(d: Driver, c) -> None:
        rt = d.rt
        a = d.op1([c], 1, 8, lambda v: v + 1, "a")
        b = d.op1([c], 1, 8, lambda v: v + 2, "b")
        d.tick(10)
        rt.drop_ref(d.op1([a], 1, 8, lambda v: v, "read a"))
        n = len(d.evicted())
        rt.drop_ref(d.op1([c], 1, 16, lambda v: v, "needs room"))  # 8 B over the budget
        victims.append(["a" if s is a else "b" if s is b else "?" for s in d.evicted()[n:]])
        rb = d.op1([b], 1, 8, lambda v: v, "read b")
        d.tick(100)
        ra = d.op1([a], 1, 8, lambda v: v, "read a later")
        for s in (a, b, rb, ra):
            rt.drop_ref(s)

    d = Driver(8 + 24, "dtr_comp")
    c = d.const(8, 1)
    for _ in range(2):
        iteration(d, c)
        d.rt.boundary()
    first, second = victims
    assert (first, second) == (["b"], ["a"])
    assert d.rt.stats().planned == 1


@pytest.mark.parametrize("room", [4, 6, 7, 10])
def test_in_the_steady_state_the_rule_kept_costs_no_more_than_the_dynamic_policy(room: int) -> None:
    # rule 5: the first iteration measures the dynamic policy, the second follows the plan, then whichever cost less
    # (a tie: without). On this chain the plan recomputes less with room for 4, 6 or 7 values (84 vs 124, 30 vs 34,
    # 25 vs 31) and alike with 10
    budget = 8 + room * 8
    _, plain, _ = _train(None, 6)
    _, dyn_values, dynamic = _train(budget, 6, boundaries=False)
    d, values, planned = _train(budget, 6)
    assert values == plain == dyn_values
    assert planned[0] == dynamic[0]  # the first iteration: no plan yet
    if room < 10:
        assert all(p < q for p, q in zip(planned[1:], dynamic[1:], strict=True))
        assert d.rt.stats().planned == 5  # every iteration after the first
    else:
        assert planned == dynamic
        assert d.rt.stats().planned == 1  # the second only: no better than without it


def test_nothing_is_recorded_without_a_budget_and_a_budget_set_later_plans_from_the_next_boundary() -> None:
    d = Driver(None, "dtr_comp")
    c = d.const(8, 1)
    _iteration(d, c, 8)
    assert d.rt.iterations.pos == 0  # rule 6: nothing recorded
    d.rt.boundary()
    d.rt.set_budget(8 + 4 * 8)
    _iteration(d, c, 8)  # not recorded either: the budget came during the iteration's stretch
    d.rt.boundary()
    for _ in range(2):
        _iteration(d, c, 8)
        d.rt.boundary()
    st = d.rt.stats()
    assert (st.iterations, st.planned, st.diverged) == (4, 1, 0)  # the fourth follows the third's plan
    d.rt.set_budget(None)
    assert not d.rt.iterations.recording
    full_check(d.rt)


def test_an_iteration_longer_than_the_limit_stops_recording_and_leaves_no_plan() -> None:
    from torch_dtr.core.plan import LIMIT, Iterations
    from torch_dtr.core.records import Storage

    it = Iterations()
    s = Storage(0, 8, None, None, False)
    it.made(s)
    for _ in range(LIMIT + 1):
        it.ran([s], 1.0, "op")
    assert not it.recording and it.keys == [] and it.uses == []  # rule 6: the record does not grow on
    it.boundary([], 0.0)
    assert it.plan is None and not it.following and it.recording
