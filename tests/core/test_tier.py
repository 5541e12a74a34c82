"""The host tier (NOTE [ Swapping ] in core/swap.py): a victim is copied out instead of dropped when copying
it back costs less than recomputing it, comes back by its copy, and the budget holds throughout."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check
from hypothesis import given
from hypothesis import strategies as st
from test_hypothesis import BUILTIN, FRAC, SETTINGS, _check_program, programs

from torch_dtr.core import BudgetError, Tier


class Counting(Tier):
    """A tier whose copies are real objects (tuples), so that a wrong handle shows up as a wrong value."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.discarded = 0

    def copy_out(self, s):
        return ("copy", s.payload)

    def copy_in(self, s):
        tag, v = s.host
        assert tag == "copy"
        return v

    def discard(self, handle) -> None:
        self.discarded += 1


def chain(d: Driver, n: int, cost: float, nbytes: int = 10):
    """x0 = const, x_{k+1} = x_k + 1, each a handle the test keeps."""
    c = d.const(nbytes, 0)
    xs = [c]
    for _ in range(n):
        xs.append(d.op1([xs[-1]], cost, nbytes, lambda v: v + 1))
    return xs


def test_expensive_values_are_swapped_and_come_back_by_their_copy() -> None:
    tier = Counting(budget=None, bandwidth=10.0)  # copying 10 B out and back costs 2: recomputing costs 100
    d = Driver(30, "dtr_comp", tier=tier)
    xs = chain(d, 6, cost=100.0)
    full_check(d.rt)
    st_ = d.rt.stats()
    assert st_.evictions >= 3 and st_.swaps_out == st_.evictions and st_.peak_bytes <= 30
    remat = d.rt.rematerializations
    assert [d.read(x) for x in xs] == list(range(7))
    assert d.rt.rematerializations == remat, "a swapped value was recomputed"
    assert d.rt.stats().swaps_in >= 3
    full_check(d.rt)


def test_cheap_values_are_dropped_and_recomputed() -> None:
    tier = Counting(budget=None, bandwidth=10.0)  # copying costs 2, recomputing 0.5
    d = Driver(30, "dtr_comp", tier=tier)
    xs = chain(d, 6, cost=0.5)
    assert d.rt.evictions >= 3 and tier.outs == 0
    assert [d.read(x) for x in xs] == list(range(7))
    assert d.rt.rematerializations >= 3
    full_check(d.rt)


def test_a_full_host_tier_drops_instead() -> None:
    tier = Counting(budget=20, bandwidth=10.0)  # room for two copies
    d = Driver(30, "dtr_comp", tier=tier)
    xs = chain(d, 8, cost=100.0)
    assert tier.outs == 2 and tier.used == 20 and d.rt.evictions > 2
    assert [d.read(x) for x in xs] == list(range(9))
    full_check(d.rt)
    assert tier.peak == 20


def test_a_value_copied_back_keeps_its_copy_and_is_swapped_again_for_free() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(30, "lru", tier=tier)  # lru: the oldest goes first, so the order is known
    xs = chain(d, 3, cost=100.0)  # const + 3 values of 10 B in a budget of 30: x1 is out
    assert not xs[1].resident and xs[1].host is not None
    outs = tier.outs
    d.read(xs[1])  # comes back; x2 goes out
    assert xs[1].resident and xs[1] in tier.spare
    d.read(xs[2])  # x3 or x1 goes out: whichever it is, no copy is made for x1
    d.read(xs[3])
    d.read(xs[1])
    assert tier.ins >= 3
    full_check(d.rt)
    assert tier.outs <= outs + 2  # x2 and x3 copied once each at most; x1 never again
    assert [d.read(x) for x in xs] == list(range(4))


def test_released_values_free_their_copies() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(30, "dtr_comp", tier=tier)
    xs = chain(d, 6, cost=100.0)
    assert tier.used > 0
    for x in reversed(xs):
        d.rt.drop_ref(x)
    full_check(d.rt)
    assert tier.used == 0 and not tier.spare and tier.discarded == tier.outs
    assert not d.rt.live


@pytest.mark.parametrize("n", [3, 8])
def test_a_value_let_go_keeps_its_copy_only_while_the_tier_holds_at_most_the_budget(n: int) -> None:
    """NOTE [ Swapping ] 10: at 30 B of budget, three values copied out (x1 back, with its spare copy) leave the
    tier within the budget: x1 keeps its copy when its handle dies; eight leave it above: x1 is dropped."""
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(30, "lru", tier=tier)
    xs = chain(d, n, cost=100.0)
    d.read(xs[1])
    assert xs[1].resident and xs[1].host is not None
    used = tier.used
    assert (used <= 30) == (n == 3)
    d.rt.drop_ref(xs[1])  # only x2's recipe reads it now
    assert not xs[1].resident
    assert (xs[1].host is not None) == (n == 3)
    assert tier.used == (used if n == 3 else used - 10)
    full_check(d.rt)
    assert [d.read(x) for x in xs[2:]] == list(range(2, n + 1))
    full_check(d.rt)


def test_a_dropped_value_whose_input_was_swapped_comes_back_by_copy_then_recipe() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(None, "dtr_comp", tier=tier)
    c = d.const(10, 1)
    big = d.op1([c], 1000.0, 10, lambda v: v * 7)  # expensive: copied out
    small = d.op1([big], 0.1, 10, lambda v: v + 1)  # cheap: dropped
    d.rt.evict(big)
    d.rt.evict(small)
    assert big.host is not None and small.host is None and not small.resident
    assert d.read(small) == 8
    assert big.resident and tier.ins == 1 and d.rt.rematerializations == 1
    full_check(d.rt)


def test_an_old_version_with_a_copy_is_swapped_not_superseded() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(None, "dtr_comp", tier=tier)
    rt = d.rt
    c = d.const(10, 1)
    x = d.op1([c], 1000.0, 10, lambda v: v + 1)
    y = d.op1([x], 1.0, 10, lambda v: v * 3)  # a recipe reads x's first version
    rt.evict(x)
    d.read(x)  # back, with a spare copy
    # an in-place write to x: its buffer becomes the new version's; the copy keeps the old value
    held = rt.acquire([x])
    try:
        op = rt.ran([x], 1.0, lambda: [x.payload + 10], "add_")
        new = rt.new_version(x, op)
    finally:
        rt.release(held)
    assert x.host is not None and not x.resident and x not in tier.spare
    new.payload = 12
    rt.evict(y)
    assert d.read(y) == 6  # recomputed from x's old version, copied back
    full_check(rt)


def test_a_sum_written_in_place_keeps_the_copies_of_its_old_versions_within_the_device_budget() -> None:
    """NOTE [ Swapping ] 4 and 10: a running total swapped out and back before each in-place write leaves one old
    version per write, each read by the next version's recipe and holding the copy it came back from; they keep
    their copies only while the tier holds no more than the device budget (before, all of them did: 3.4 GiB of
    copies for the bench's LSTM loop at 35% of its 155 MiB peak under the native front end)."""
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(40, "dtr_comp", tier=tier)
    rt = d.rt
    c = d.const(10, 1)
    x = d.op1([c], 1000.0, 10, lambda v: v)  # the total, held
    versions = []
    most = 0
    for k in range(12):
        g = d.op1([c], 500.0, 10, lambda v, k=k: v * k)  # the next term (handle-less once summed)
        rt.evict(x)  # swapped: its chain of versions costs more to recompute than its copy
        assert x.host is not None and not x.resident
        held = rt.acquire([x, g])
        total = x.payload + g.payload
        try:
            op = rt.ran([x, g], 1.0, lambda x=x, g=g: [x.payload + g.payload], "add_", writes=(x,))
            new = rt.new_version(x, op)
        finally:
            rt.release(held)
        new.payload = total
        rt.drop_ref(g)
        versions.append(x)
        x = new
        most = max(most, tier.used)
        full_check(rt)
    assert most <= 40 + 10, most  # the device budget, and the copy of the one value held
    assert sum(v.host is not None for v in versions) < len(versions), "every old version kept its copy"
    assert any(v.host is None and not v.resident for v in versions), "no old version was dropped"
    assert d.read(x) == 1 + sum(range(12))
    full_check(rt)


def test_copies_in_flight_count_against_the_budget_until_they_land() -> None:
    class Slow(Counting):
        settled: list[bool] = []

        def hold(self, s) -> None:
            super().hold(s)
            self.pending += s.nbytes

        def settle(self, wait: bool) -> None:
            self.settled.append(wait)
            if wait:
                self.pending = 0

    tier = Slow(budget=None, bandwidth=10.0)
    d = Driver(30, "dtr_comp", tier=tier)
    xs = chain(d, 4, cost=100.0)
    assert tier.settled and True in tier.settled, "a copy in flight was not waited for"
    assert d.rt.memory.tracked + tier.pending <= 30
    assert [d.read(x) for x in xs] == list(range(5))
    full_check(d.rt)


def test_a_budget_below_what_must_stay_still_raises() -> None:
    d = Driver(15, "dtr_comp", tier=Counting(budget=None, bandwidth=10.0))
    c = d.const(10, 1)
    with pytest.raises(BudgetError):
        d.op1([c], 100.0, 10, lambda v: v + 1)


def test_tier_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="host_budget"):
        Tier(budget=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        Tier(bandwidth=0)


TIERS = st.builds(Counting, budget=st.sampled_from([None, 0, 50, 200]),
                  bandwidth=st.sampled_from([0.05, 1.0, 20.0]), out_free=st.booleans())


@SETTINGS
@given(programs(multi_output=True), FRAC, st.sampled_from(BUILTIN), st.booleans(), TIERS)
def test_random_programs_with_a_tier(prog, frac, policy, sample, tier) -> None:
    """Values equal the unconstrained run's, the budget and the host budget hold (``check``), nothing leaks."""
    _check_program(prog, frac, policy, sample, tier=tier)


# NOTE [ Swapping ] 9: values whose recipes can no longer run are pinned, but only the runtime holds them: a tier
# may still copy them out.

def _invalidated_chain(d: Driver, n: int) -> list:
    """A chain whose recipes all read the constant, then are invalidated (as a write to it would)."""
    c = d.const(10, 1)
    xs = []
    prev = c
    for _ in range(n):
        prev = d.op1([prev, c], 1.0, 10, lambda v, k: v + k)
        xs.append(prev)
    d.rt.invalidate(list(c.children), "the constant changed")
    return xs


def test_values_whose_recipes_cannot_run_are_swapped_not_pinned_in_place() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(None, "dtr_comp", tier=tier)
    xs = _invalidated_chain(d, 4)
    assert all(x.pinned and x.moves and x in d.rt.movable for x in xs)
    assert d.rt.movable_bytes == 40
    d.rt.set_budget(30)  # the constant and two of the four values fit: two are copied out
    d.rt.reset_peak()
    full_check(d.rt)
    swapped = [x for x in xs if x.host is not None and not x.resident]
    assert len(swapped) == 2 and tier.outs == 2 and d.rt.memory.tracked <= 30
    assert [d.read(x) for x in xs] == [2, 3, 4, 5]  # back by their copies, not recomputed
    assert d.rt.rematerializations == 0 and tier.ins >= 2
    full_check(d.rt)
    assert d.rt.memory.peak <= 30
    for x in xs:  # released: every copy goes
        d.rt.drop_ref(x)
    full_check(d.rt)
    assert tier.used == 0


def test_without_a_tier_such_values_stay() -> None:
    d = Driver(None, "dtr_comp")
    _invalidated_chain(d, 4)
    assert not d.rt.movable  # kept only with a tier
    with pytest.raises(BudgetError):
        d.rt.set_budget(30)


def test_a_swapped_value_whose_recipe_is_invalidated_keeps_its_copy() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(None, "dtr_comp", tier=tier)
    c = d.const(10, 1)
    x = d.op1([c], 1000.0, 10, lambda v: v + 1)  # expensive: swapped when evicted
    d.rt.evict(x)
    assert x.host is not None
    assert d.rt.stranded([x.op]) == []  # it comes back by its copy: nothing to rescue
    d.rt.invalidate([x.op], "the constant changed")
    assert x.pinned and x.moves and not x.resident and x.op.compute is None
    assert d.read(x) == 2 and x in d.rt.movable
    full_check(d.rt)


def test_unwrapping_a_movable_value_pins_it_in_place() -> None:
    tier = Counting(budget=None, bandwidth=10.0)
    d = Driver(None, "dtr_comp", tier=tier)
    (x,) = _invalidated_chain(d, 1)
    d.rt.pin(x)  # now shared with something the runtime cannot see
    assert x.pinned and not x.moves and x not in d.rt.movable
    with pytest.raises(BudgetError):
        d.rt.set_budget(15)
    full_check(d.rt)


def _invalidating(kills: list[int]):
    """An ``on_step`` for ``execute``: after step ``j`` in ``kills``, the recipe of a value that a handle names is
    invalidated as a front end does it (its stranded values brought back and pinned first)."""
    def on_step(rt, j, handles) -> None:
        if j not in kills:
            return
        named = [s for s in handles.values() if s.op is not None and s.op.compute is not None]
        if not named:
            return
        op = named[j % len(named)].op
        rt.rescue([op])
        rt.invalidate([op], "a test wrote its input")
    return on_step


@SETTINGS
@given(programs(multi_output=True), FRAC, st.sampled_from(BUILTIN), st.lists(st.integers(0, 24), max_size=4),
       st.booleans())
def test_random_programs_with_invalidated_recipes_and_a_tier(prog, frac, policy, kills, out_free) -> None:
    """Pinned values a tier may copy out: values equal the unconstrained run's, the budget holds (``check``)."""
    tier = Counting(budget=None, bandwidth=1.0, out_free=out_free)
    _check_program(prog, frac, policy, False, tier=tier, on_step=_invalidating(kills))
