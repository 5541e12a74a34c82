"""Banishing (NOTE [ Banishing ]): a running sum of values nobody holds is pinned once its chain of
handle-less values is ``banish_depth`` links long, and the chain behind it is released."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import BudgetError


def _running_sum(d: Driver, steps: int, size: int = 8):
    """acc = acc + g_t, as autograd sums a shared weight's gradient over a recurrence: every g_t and every
    old total loses its handle as soon as the next total exists."""
    rt = d.rt
    c = d.const(10, 1)
    acc = d.op1([c], 1, size, lambda v: v)
    for t in range(steps):
        g = d.op1([c], 5, size, lambda v, t=t: v * t)
        new = d.op1([acc, g], 1, size, lambda a, b: a + b)
        rt.drop_ref(acc)
        rt.drop_ref(g)
        acc = new
    return c, acc


@pytest.mark.parametrize("depth", [4, 16])
def test_a_running_sum_keeps_one_total_and_no_chain(depth: int) -> None:
    steps = 100
    d = Driver(None, "dtr_eq", banish_depth=depth)
    rt = d.rt
    c, acc = _running_sum(d, steps)
    assert acc.payload == 1 + sum(range(steps))
    # from the depth-th total on, each total loses its recipe as soon as the one before loses its handle
    assert rt.banished == steps - depth  # acc_k has k links when it loses its handle; acc_depth.. acc_99
    assert acc.pinned and acc.resident
    # what is left: the constant, the total, and nothing of the chain (no evicted record kept)
    assert {s for s in rt.live if not s.released} == {c, acc}
    assert rt.memory.tracked == 10 + 8
    full_check(rt)
    rt.drop_ref(acc)
    assert acc.released and rt.memory.tracked == 10
    full_check(rt)


def test_without_banishing_the_chain_is_kept_and_costs_a_recomputation_per_step() -> None:
    steps = 100
    d = Driver(None, "dtr_eq", banish_depth=0)
    rt = d.rt
    c, acc = _running_sum(d, steps)
    assert rt.banished == 0 and not acc.pinned
    assert len(rt.live) > 2 * steps  # every old total and every g_t, evicted, kept for the recipe
    rt.evict(acc)
    assert d.read(acc) == 1 + sum(range(steps))
    assert rt.rematerializations >= 2 * steps  # the whole chain ran again
    full_check(rt)


def test_a_banished_total_still_comes_back_right_and_the_budget_holds() -> None:
    # a budget that leaves room for the constant, the total and one step's inputs and output only
    d = Driver(10 + 3 * 8, "dtr_eq", banish_depth=4)
    rt = d.rt
    c, acc = _running_sum(d, 50)
    assert d.read(acc) == 1 + sum(range(50))
    assert rt.rematerializations == 0  # nothing of the chain was ever needed again
    full_check(rt)


def test_an_in_place_unary_chain_is_not_a_sum() -> None:
    # x.sigmoid_() four times on one buffer (LSTM gates): old versions lose their handles, but each link
    # reads one handle-less value only, so nothing is banished and the newest version stays evictable
    d = Driver(None, "dtr_eq", banish_depth=2)
    rt = d.rt
    c = d.const(10, 1)
    x = d.op1([c], 1, 8, lambda v: v)
    for _ in range(6):
        rt.reserve(0)
        op = rt.ran([x], 1, lambda v=x: [v.payload + 1] if v.payload is not None else [None], "add_")
        x = rt.new_version(x, op)
    assert rt.banished == 0 and not x.pinned
    full_check(rt)


def test_a_pinned_value_without_handles_hands_its_readers_the_pin_whatever_their_size() -> None:
    # c cannot be recomputed: kept only for its readers' recipes it would stay resident for as long as they
    # live. Banishing pins its resident readers instead (even one larger than c: it is resident already, so
    # no byte is added) and frees c (NOTE [ Banishing ] 3)
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 1, 10, lambda v: v + 1)
    big = d.op1([c], 1, 40, lambda v: v + 2)
    before = rt.memory.tracked
    rt.drop_ref(c)
    assert a.pinned and big.pinned and rt.banished == 2
    assert c.released and rt.memory.tracked == before - 10
    assert rt.banished_bytes == 50
    full_check(rt)
    rt.drop_ref(big)
    assert big.released and rt.banished_bytes == 10
    full_check(rt)


def test_a_pinned_value_stays_while_a_held_reader_is_evicted() -> None:
    # a reader whose output is evicted and held still needs c to come back: c stays, resident, and a comes back
    # right (NOTE [ Banishing ] 7 does not bring held values back where a handle dies)
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 1, 10, lambda v: v + 1)
    rt.evict(a)
    rt.drop_ref(c)
    assert c.resident and not c.released and rt.banished == 0
    assert d.read(a) == 2
    full_check(rt)


def test_a_pinned_value_read_only_for_evicted_values_without_handles_is_cut_free() -> None:
    # NOTE [ Banishing ] 7: a, evicted without handles, is read by the recipe of b (held, resident): c is
    # freed, a is lost, b is pinned (4 bytes, a quarter of c's 16) and keeps its value
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(16, 1)
    a = d.op1([c], 1, 6, lambda v: v + 1)
    b = d.op1([a], 1, 4, lambda v: v * 3)
    rt.drop_ref(a)  # evicted at once, its recipe kept for b's
    assert not a.resident and not a.released
    rt.drop_ref(c)
    assert c.released and a.released and b.pinned and b.banished and rt.banished == 1
    assert rt.banished_bytes == 4
    assert d.read(b) == 6
    full_check(rt)


def test_a_pinned_value_stays_where_cutting_it_free_would_pin_over_a_quarter_of_it() -> None:
    # the same, with b more than a quarter of c: pinning b gains too little over keeping c (rule 7)
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(16, 1)
    a = d.op1([c], 1, 6, lambda v: v + 1)
    b = d.op1([a], 1, 5, lambda v: v * 3)
    rt.drop_ref(a)
    rt.drop_ref(c)
    assert c.resident and not c.released and not b.pinned and rt.banished == 0
    full_check(rt)


def test_a_released_output_does_not_stop_banishing() -> None:
    # an op with two outputs, one of them already released (a gradient nobody kept): the other, resident,
    # takes the pin and c is freed; the released one is not counted as banished
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(10, 1)
    kept, gone = d.op([c], 1, [10, 6], lambda v: [v + 1, v + 2])
    rt.drop_ref(gone)
    assert gone.released
    rt.drop_ref(c)
    assert c.released and kept.pinned and rt.banished == 1
    assert rt.banished_bytes == 10
    full_check(rt)


def test_banished_bytes_stay_out_of_the_floor_in_a_budget_error() -> None:
    # the floor is a lower bound for any schedule: bytes pinned by choice must not raise it, also when the
    # op's own reservation fails (NOTE [ The single-op floor ] 2, NOTE [ Banishing ] 5)
    d = Driver(60, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 1, 40, lambda v: v + 1)
    rt.drop_ref(c)  # a takes the pin: 40 B banished
    assert a.pinned and rt.banished_bytes == 40
    # an op that does not read a: a's 40 B were pinned by choice, so the floor is the op's 30 B alone (plus
    # nothing else unevictable), and the budget is above it
    with pytest.raises(BudgetError, match=r"single-op floor so far is 50 B: the budget is above it"):
        d.op1([], 1, 30, lambda: 0, "big")
    assert rt.stats().floor_bytes == 50
    # an op that reads a: a is its input, so it counts: 40 + 30 = 70 B, above the 60 B budget
    with pytest.raises(BudgetError, match=r"single-op floor so far is 70 B \(bigger\): below it no schedule"):
        d.op1([a], 1, 30, lambda v: v, "bigger")
    full_check(rt)
