"""Union-find sets of evicted storages (h_DTR^eq) and how they compare with the exact neighbourhood."""

from __future__ import annotations

import pytest
from coredrive import Driver, extra, full_check, uf

from torch_dtr.core import UFNode

# ---------------------------------------------------------------------------------------------- UFNode


def test_singleton() -> None:
    n = UFNode(3.5)
    assert n.parent is n and n.cost == 3.5 and n.find() is n
    assert UFNode().cost == 0.0


def test_union_sums_costs_and_returns_root() -> None:
    a, b, c = UFNode(1), UFNode(2), UFNode(4)
    r = a.union(b)
    assert r is a and b.parent is a and r.cost == 3
    assert a.find() is b.find() is a
    r2 = c.union(b)  # b is not a root: its root (a) is linked under c's root
    assert r2 is c and a.parent is c and c.cost == 7
    assert a.find() is b.find() is c.find() is c


def test_union_of_same_set_does_not_double_count() -> None:
    a, b = UFNode(1), UFNode(2)
    a.union(b)
    assert b.union(a) is a and a.cost == 3
    assert a.union(a) is a and a.cost == 3


def test_find_compresses_paths() -> None:
    nodes = [UFNode(1) for _ in range(6)]
    for child, parent in zip(nodes[1:], nodes[:-1], strict=True):
        child.parent = parent  # a hand-made chain 5 -> 4 -> ... -> 0
    assert nodes[5].find() is nodes[0]
    assert all(n.parent is nodes[0] for n in nodes)
    assert nodes[0].cost == 1  # find never moves costs


def test_long_chain_find_is_iterative() -> None:
    nodes = [UFNode(0) for _ in range(50_000)]
    for child, parent in zip(nodes[1:], nodes[:-1], strict=True):
        child.parent = parent
    assert nodes[-1].find() is nodes[0]


# ---------------------------------------------------------------------------------------------- runtime level


def _chain() -> tuple[Driver, list]:
    # c -> a (cost 3) -> b (cost 5) -> e (cost 7), each 10 B, no budget
    d = Driver(None, "dtr_eq")
    c = d.const(10, 1)
    a = d.op1([c], 3, 10, lambda v: v + 1)
    b = d.op1([a], 5, 10, lambda v: v * 2)
    e = d.op1([b], 7, 10, lambda v: v - 3)
    return d, [c, a, b, e]


def test_evicting_neighbours_shares_a_root() -> None:
    d, (c, a, b, e) = _chain()
    rt = d.rt
    rt.evict(a)
    assert uf(a) is not None and uf(a).find().cost == 3 and uf(b) is None
    assert extra(rt, b, "uf") == 3 and extra(rt, e, "uf") == 0
    rt.evict(b)
    assert uf(b) is not None
    root = uf(a).find()
    assert uf(b).find() is root and root.cost == 3 + 5
    # e is next to the component {a, b}: its extra cost is the whole component's
    assert extra(rt, e, "uf") == 8 == extra(rt, e, "exact")
    full_check(rt)


def test_rematerialize_leaves_the_component() -> None:
    d, (c, a, b, e) = _chain()
    rt = d.rt
    rt.evict(a)
    rt.evict(b)
    root = uf(b).find()
    rt.rematerialize(a)
    assert a.resident and uf(a) is None and a.payload == 2
    assert uf(b).find() is root and root.cost == 5  # 8 - cost(a)
    # on a chain the approximation is exact: both see {b} (cost 5) from e and from a
    for s in (a, e):
        assert extra(rt, s, "uf") == extra(rt, s, "exact") == 5
    rt.rematerialize(b)
    assert uf(b) is None and root.cost == 0 and b.payload == 4
    assert extra(rt, e, "uf") == extra(rt, e, "exact") == 0
    full_check(rt)


def test_eviction_merges_two_components() -> None:
    # x <- m -> y: x and y evicted apart are two components; evicting m joins them
    d = Driver(None, "dtr_eq")
    c = d.const(10, 1)
    m = d.op1([c], 2, 10, lambda v: v + 1)
    x = d.op1([m], 3, 10, lambda v: v + 2)
    y = d.op1([m], 5, 10, lambda v: v + 3)
    rt = d.rt
    rt.evict(x)
    rt.evict(y)
    assert uf(x).find() is not uf(y).find()
    assert extra(rt, m, "uf") == 8 == extra(rt, m, "exact")
    rt.evict(m)
    assert uf(x).find() is uf(y).find() is uf(m).find()
    assert uf(m).find().cost == 10
    assert d.read(y) == 5 and d.read(x) == 4
    full_check(rt)


def _star(policy: str) -> tuple[Driver, list]:
    """c -> m; m -> p; m -> q; q -> r; c -> D. p, m, q evicted (in that order), then m rematerialized.

    clock: m 1, p 31 (m touched), q 33 (m touched), r 34 (q touched), D 38; remat m: 39; tick 5: 44.
    """
    d = Driver(60, policy)
    c = d.const(10, 1)
    m = d.op1([c], 1, 10, lambda v: v + 1)      # cost 1
    p = d.op1([m], 30, 10, lambda v: v * 3)     # cost 30
    q = d.op1([m], 2, 10, lambda v: v * 5)      # cost 2
    r = d.op1([q], 1, 10, lambda v: v + 7)      # cost 1
    dd = d.op1([c], 4, 10, lambda v: v - 1)     # cost 4
    rt = d.rt
    for s in (p, m, q):
        rt.evict(s)
    rt.rematerialize(m)
    d.tick(5)
    assert rt.clock == 44 and rt.memory.tracked == 40
    return d, [c, m, p, q, r, dd]


def test_components_are_never_split() -> None:
    # {p, m, q} was one component (cost 33). Rematerializing m takes m's cost out (32) but does not
    # split it, although p and q are no longer connected through evicted storages. So r (next to q)
    # sees p's cost too under "uf", and only q's under "exact": the documented approximation.
    d, (c, m, p, q, r, dd) = _star("dtr_eq")
    rt = d.rt
    assert m.resident and uf(m) is None and not p.resident and not q.resident
    assert uf(p).find() is uf(q).find() and uf(q).find().cost == 32
    assert extra(rt, r, "exact") == 2
    assert extra(rt, r, "uf") == 32 == extra(rt, r, "exact") + p.cost
    full_check(rt)


def test_resident_storage_counts_each_adjacent_component_once() -> None:
    # m's two children p, q are in ONE component (through m when m was evicted): counted once
    d, (c, m, p, q, r, dd) = _star("dtr_eq")
    rt = d.rt
    assert uf(p).find() is uf(q).find()
    assert extra(rt, m, "uf") == 32 == extra(rt, m, "exact")


# scores at clock 44 (staleness r 10, D 6, m 5), all 10 B:
#   dtr:    r (1+2)/(10*10) = 0.03    D 4/(10*6) = 0.067   m (1+32)/(10*5) = 0.66  -> r
#   dtr_eq: r (1+32)/(10*10) = 0.33   D 0.067              m 0.66                  -> D
@pytest.mark.parametrize(("policy", "victim"), [("dtr", 4), ("dtr_eq", 5)])
def test_unsplit_component_changes_the_victim(policy: str, victim: int) -> None:
    d, storages = _star(policy)
    rt = d.rt
    before = rt.evictions
    rt.reserve(30)  # 40 + 30 > 60: one 10 B storage must go
    assert rt.evictions == before + 1
    assert d.evicted()[-1] is storages[victim]
    assert {s.sid for s in storages if not s.resident} == {storages[i].sid for i in (2, 3, victim)}
    # every value is still there
    c, m, p, q, r, dd = storages
    assert [d.read(s) for s in (p, q, r, dd)] == [6, 10, 17, 0]
    full_check(rt)


@pytest.mark.parametrize("policy", ["dtr", "dtr_local", "lru", "size", "msps"])
def test_other_policies_keep_no_union_find(policy: str) -> None:
    d2 = Driver(None, policy)
    c = d2.const(10, 1)
    a = d2.op1([c], 3, 10, lambda v: v + 1)
    b = d2.op1([a], 5, 10, lambda v: v * 2)
    d2.rt.evict(a)
    d2.rt.evict(b)
    assert uf(a) is None and uf(b) is None
    assert d2.read(b) == 4


def test_released_members_leave_the_component() -> None:
    # Regression (was a bug, eviction choices only): a storage released while evicted keeps
    # its cost in its component's root, and extra(rt, ..., "uf") also counts a released neighbour (which
    # _evict's union and the "exact" walk both skip). Released storages can never be recomputed, so
    # they should leave their component as rematerialized ones do.
    d = Driver(None, "dtr_eq")
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 1, 10, lambda v: v + 1)
    x, y = d.op([a], 7, [10, 10], lambda v: [v, v + 1])  # x and y: two outputs of one op
    rt.evict(x)
    rt.drop_ref(x)  # no dependents: released
    assert x.released and extra(rt, a, "exact") == 0
    assert extra(rt, a, "uf") == 0, "a released neighbour still counts under 'uf'"

    d = Driver(None, "dtr_eq")
    rt = d.rt
    c = d.const(10, 1)
    a = d.op1([c], 3, 10, lambda v: v + 1)
    b = d.op1([a], 5, 10, lambda v: v + 1)
    e = d.op1([a], 2, 10, lambda v: v + 1)
    rt.evict(a)
    rt.evict(b)
    rt.drop_ref(b)  # released while in the component {a, b}
    assert b.released and extra(rt, e, "exact") == 3
    assert uf(a).find().cost == 3 and extra(rt, e, "uf") == 3, "a released member's cost stays in the root"
