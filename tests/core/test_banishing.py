"""Banishing (NOTE [ Banishing ]): a running sum of values nobody holds is pinned once its chain of
handle-less values is ``banish_depth`` links long, and the chain behind it is released."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check


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


def test_a_pinned_value_without_handles_hands_its_readers_the_pin() -> None:
    # c cannot be recomputed: kept only for a's recipe it would stay resident for as long as a lives;
    # banishing pins a (no larger) instead and frees c
    d = Driver(None, "dtr_eq", banish_depth=16)
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 1, 10, lambda v: v + 1)
    big = d.op1([c], 1, 40, lambda v: v + 2)  # larger than c: keeps its recipe, so c stays for it
    rt.drop_ref(c)
    assert a.pinned and rt.banished == 1
    assert not big.pinned and c.resident and not c.released
    rt.drop_ref(big)  # c's last reader is gone: c is released
    assert c.released
    full_check(rt)
