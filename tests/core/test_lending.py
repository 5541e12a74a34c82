"""Lending (NOTE [ Planned rematerialization ] 6): recomputing an in-place op writes into its old version's
buffer instead of a copy when nothing else needs the old value, as the first run did."""

from __future__ import annotations

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import BudgetError


def _in_place_chain(d: Driver, n: int, read_old: int | None = None):
    """x0 = c; x_{k+1} = x_k.add_(1) n times (each write makes a new version, NOTE [ In-place mutation ]).
    The recipe of each version reads the one before; ``lent`` records what the runtime lent each replay.
    ``read_old``: another recipe reads that version too (y = x_k * 10, held), so its value stays needed."""
    rt = d.rt
    c = d.const(10, 1)
    x = d.op1([c], 1, 8, lambda v: v)
    lent: list[list[int]] = []
    y = None
    for k in range(n):
        def compute(lend=(), old=x):
            lent.append([s.sid for s in lend])
            assert old.resident
            return [old.payload + 1]

        if k == read_old:
            y = d.op1([x], 1, 8, lambda v: v * 10)
        rt.reserve(0)
        op = rt.ran([x], 1, compute, "add_", writes=[x])
        x = rt.new_version(x, op, None)
    return c, x, lent, y


def test_an_in_place_chain_comes_back_in_one_buffer():
    d = Driver(None, "dtr_eq")
    rt = d.rt
    c, x, lent, _ = _in_place_chain(d, 5)
    rt.evict(x)
    rt.set_budget(10 + 8)  # the constant and one 8 B buffer: no room for a copy
    assert d.read(x) == 1 + 5
    assert lent == [[1], [2], [3], [4], [5]]  # c is #0, version k is #(k + 1): each replay wrote its input
    assert rt.memory.peak <= 18 and rt.rematerializations == 6
    full_check(rt)


def test_an_old_version_another_recipe_reads_is_copied_not_lent():
    # y reads version 2: when y is evicted too, version 2 must keep its value for y's recipe, so replaying
    # the write into version 3 copies it, which needs a second buffer
    d = Driver(None, "dtr_eq")
    rt = d.rt
    c, x, lent, y = _in_place_chain(d, 5, read_old=2)
    rt.evict(x)
    rt.evict(y)
    rt.set_budget(10 + 8)
    rt.reset_peak()  # the unbudgeted build held y too
    with pytest.raises(BudgetError):
        d.read(x)
    full_check(rt)
    rt.set_budget(10 + 3 * 8)
    assert d.read(x) == 1 + 5
    assert d.read(y) == (1 + 2) * 10
    assert [3] not in lent  # version 2 (#3) was never written in place
    full_check(rt)
