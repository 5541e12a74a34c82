"""Each policy evicts the storage that a hand computation of its score predicts.

Scores (lowest evicted), staleness = clock - last_access, clock += cost of every recorded op:
  dtr_eq / dtr / dtr_local: (cost + extra) / (nbytes * staleness), extra = uf / exact / 0
  lru: 1 / staleness;  size: 1 / nbytes;  msps: (cost + evicted ancestors' cost) / nbytes
  dtr_chain: (cost + nbhd + path) * sqrt(length) / (nbytes * staleness), extra = Chain(nbhd, path, length):
    nbhd as uf; path: cost along the costliest evicted path above; length: longest evicted chain through it
"""

from __future__ import annotations

import math

import pytest
from coredrive import Driver, extra, full_check, links, uf

from torch_dtr.core import DEFAULT_POLICY, POLICIES, BudgetError, Chain, Policy, Runtime, Storage, get_policy, register

BUILTIN = ("dtr_eq", "dtr", "dtr_local", "lru", "size", "msps", "dtr_chain", "dtr_comp")


@pytest.fixture(autouse=True)
def _restore_policies():
    saved = dict(POLICIES)
    yield
    POLICIES.clear()
    POLICIES.update(saved)


def test_builtin_policies_registered() -> None:
    assert set(BUILTIN) <= set(POLICIES)
    assert DEFAULT_POLICY == "dtr_comp"
    assert Runtime(None).policy is POLICIES["dtr_comp"]
    assert {POLICIES[n].extra for n in BUILTIN} == {"uf", "exact", "", "ancestors", "chain", "comp"}
    assert POLICIES["dtr_eq"].extra == "uf" and POLICIES["dtr"].extra == "exact"
    assert POLICIES["dtr_local"].extra == "" and POLICIES["msps"].extra == "ancestors"
    assert POLICIES["dtr_chain"].extra == "chain"


def _only_victim(d: Driver, before: int, pool: dict[str, object]) -> str:
    rt = d.rt
    assert rt.evictions == before + 1, "exactly one eviction expected"
    gone = [name for name, s in pool.items() if not s.resident]  # type: ignore[attr-defined]
    assert len(gone) == 1, gone
    assert d.evicted()[before:] == [pool[gone[0]]]
    full_check(rt)
    return gone[0]


# ---------------------------------------------------------------------------------------------- scenario 1
# c: constant 10 B. Four independent ops read only c:
#   L = f(c) cost 8, 10 B   clock 8   -> L.last_access 8
#   H = f(c) cost 2, 10 B   clock 10  -> H.last_access 10
#   S = f(c) cost 40, 50 B  clock 50  -> S.last_access 50
#   M = f(c) cost 1, 10 B   clock 51  -> M.last_access 51
#   tick cost 5             clock 56
# staleness: L 48, H 46, S 6, M 5. Nothing is evicted, so every extra is 0.
#   h_DTR: L 8/(10*48)=0.0167  H 2/(10*46)=0.00435  S 40/(50*6)=0.133  M 1/(10*5)=0.02   -> H
#   lru:   L 1/48 (the stalest)                                                             -> L
#   size:  S 1/50 (the biggest)                                                             -> S
#   msps:  L 8/10=0.8  H 2/10=0.2  S 40/50=0.8  M 1/10=0.1                                  -> M
#   dtr_chain: Chain(0, 0, 1) for all, so h_DTR                                             -> H
#   dtr_comp: h_DTR with exact components (none here)                                       -> H
# tracked = 10 + 10 + 10 + 50 + 10 = 90; budget 100; reserve(20) must free 10 B: one eviction.
SCENARIO1 = {"dtr_eq": "H", "dtr": "H", "dtr_local": "H", "lru": "L", "size": "S", "msps": "M", "dtr_chain": "H",
             "dtr_comp": "H"}


@pytest.mark.parametrize("policy", BUILTIN)
def test_scenario_independent_storages(policy: str) -> None:
    d = Driver(100, policy)
    c = d.const(10, 1)
    pool = {
        "L": d.op1([c], 8, 10, lambda v: v + 1),
        "H": d.op1([c], 2, 10, lambda v: v + 2),
        "S": d.op1([c], 40, 50, lambda v: v + 3),
        "M": d.op1([c], 1, 10, lambda v: v + 4),
    }
    d.tick(5)
    rt = d.rt
    assert rt.clock == 56
    assert {k: rt.clock - s.last_access for k, s in pool.items()} == {"L": 48, "H": 46, "S": 6, "M": 5}
    assert rt.memory.tracked == 90 and rt.evictions == 0
    rt.reserve(20)
    assert _only_victim(d, 0, pool) == SCENARIO1[policy]
    assert rt.memory.tracked == 90 - pool[SCENARIO1[policy]].nbytes
    assert c.resident


# ---------------------------------------------------------------------------------------------- scenario 2
# An evicted neighbour's cost: dtr_eq and dtr count it, dtr_local does not.
#   A = f(c)  cost 100, 10 B  clock 100
#   B = g(A)  cost 1,   10 B  clock 101 (A and B last_access 101)
#   D = h(c)  cost 2,   12 B  clock 103
#   tick 7                     clock 110; then A's handle dies: A has a dependent (B), so it is dropped
# staleness: B 9, D 7.
#   dtr_local: B 1/(10*9)=0.0111        D 2/(12*7)=0.0238  -> B
#   dtr_eq:    B (1+100)/(10*9)=1.12    D 0.0238           -> D   (A's component costs 100)
#   dtr:       same as dtr_eq (A is B's only evicted neighbour) -> D
#   msps:      B (1+100)/10=10.1        D 2/12=0.167        -> D   (A is an evicted ancestor of B)
#   lru:       B is the stalest                             -> B
#   size:      D is the bigger                              -> D
#   dtr_chain: B Chain(100, 100, 2): (1+100+100)*sqrt(2)/(10*9)=3.16   D 0.0238 -> D  (A: B's evicted input)
#   dtr_comp:  as dtr (A's component {A} costs 100)                    -> D
# tracked = 10 + 10 + 12 = 32; budget 42; reserve(20) must free 10 B: one eviction.
SCENARIO2 = {"dtr_eq": "D", "dtr": "D", "dtr_local": "B", "lru": "B", "size": "D", "msps": "D", "dtr_chain": "D",
             "dtr_comp": "D"}


def _scenario2(policy: str) -> tuple[Driver, dict[str, object]]:
    d = Driver(42, policy)
    c = d.const(10, 1)
    a = d.op1([c], 100, 10, lambda v: v * 3)
    b = d.op1([a], 1, 10, lambda v: v + 5)
    dd = d.op1([c], 2, 12, lambda v: v - 7)
    d.tick(7)
    d.rt.drop_ref(a)
    return d, {"A": a, "B": b, "D": dd}


@pytest.mark.parametrize("policy", BUILTIN)
def test_scenario_evicted_neighbour(policy: str) -> None:
    d, s = _scenario2(policy)
    a, b, dd = s["A"], s["B"], s["D"]
    rt = d.rt
    assert not a.resident and not a.released and rt.drops == 1 and rt.evictions == 0
    if policy in ("dtr_eq", "dtr_chain"):
        assert uf(a) is not None and uf(a).find().cost == 100
        assert extra(rt, b, "uf") == 100 and extra(rt, dd, "uf") == 0
    elif policy == "dtr_comp":
        assert uf(a) is None and a.aux.members == {a: None} and a.aux.cost == 100
        assert extra(rt, b, "comp") == 100 and extra(rt, dd, "comp") == 0
    else:
        assert uf(a) is None  # only the union-find policy keeps components
    assert extra(rt, b, "exact") == 100 and extra(rt, b, "ancestors") == 100
    assert rt.clock - b.last_access == 9 and rt.clock - dd.last_access == 7
    rt.reserve(20)
    victim = _only_victim(d, 0, {"B": b, "D": dd})
    assert victim == SCENARIO2[policy]
    # and the values survive: B needs A, which is rematerialized on the way
    assert d.read(b) == 8 and d.read(dd) == -6
    full_check(rt)


def test_dtr_eq_and_dtr_local_disagree() -> None:
    # same graph, same clock: only the evicted neighbour's cost (A, 100) separates the two policies
    victims = {}
    for policy in ("dtr_eq", "dtr_local"):
        d, s = _scenario2(policy)
        d.rt.reserve(20)
        victims[policy] = [k for k in ("B", "D") if not s[k].resident]
    assert victims == {"dtr_eq": ["D"], "dtr_local": ["B"]}


# ---------------------------------------------------------------------------------------------- scenario 3
# msps looks only at evicted ANCESTORS (and not at staleness); dtr counts evicted children too.
#   P = f(c) cost 1, 10 B   clock 1
#   R = f(c) cost 3, 10 B   clock 4   (R last_access 4)
#   Q = g(P) cost 50, 10 B  clock 54  (P last_access 54); then Q is evicted by hand
#   tick 6                  clock 60
# staleness: P 6, R 56.
#   msps:      P (1+0)/10 = 0.1 (Q is a child, not an ancestor)   R 3/10 = 0.3   -> P
#   dtr:       P (1+50)/(10*6) = 0.85                             R 3/(10*56) = 0.0054 -> R
#   dtr_eq:    same extra as dtr here (Q's component = {Q}, 50)    -> R
#   dtr_local: P 1/60 = 0.0167                                    R 0.0054 -> R
#   lru:       R (stalest)
#   dtr_chain: P Chain(50, 0, 2) (Q is below P, not above): (1+50)*sqrt(2)/(10*6)=1.20  R 0.0054 -> R
# tracked = 10 + 10 + 10 = 30; budget 40; reserve(20): one eviction.
SCENARIO3 = {"dtr_eq": "R", "dtr": "R", "dtr_local": "R", "lru": "R", "msps": "P", "dtr_chain": "R"}


@pytest.mark.parametrize("policy", sorted(SCENARIO3))
def test_scenario_msps_ancestors_only(policy: str) -> None:
    d = Driver(40, policy)
    c = d.const(10, 1)
    p = d.op1([c], 1, 10, lambda v: v + 1)
    r = d.op1([c], 3, 10, lambda v: v + 2)
    q = d.op1([p], 50, 10, lambda v: v * 10)
    rt = d.rt
    rt.evict(q)
    d.tick(6)
    assert rt.evictions == 1
    assert extra(rt, p, "ancestors") == 0 and extra(rt, p, "exact") == 50
    rt.reserve(20)
    assert _only_victim(d, 1, {"P": p, "R": r}) == SCENARIO3[policy]
    assert d.read(q) == 20


# ---------------------------------------------------------------------------------------------- scenario 4
# dtr_chain counts what bringing a candidate back costs (its evicted inputs' path) on top of the union-find
# neighbourhood, so an evicted ANCESTOR weighs more than an evicted child; dtr_eq counts both the same.
#   A = f(c) cost 30, 10 B  clock 30
#   P = g(A) cost 2,  10 B  clock 32  (A, P last_access 32)
#   Q = h(c) cost 2,  10 B  clock 34
#   K = k(Q) cost 30, 10 B  clock 64  (Q, K last_access 64); then A and K are evicted by hand
#   tick 40                 clock 104
# staleness: P 72, Q 40. Extras: P Chain(30, 30, 2) (A above it), Q Chain(30, 0, 2) (K below it).
#   dtr_eq:    P (2+30)/(10*72) = 0.0444          Q (2+30)/(10*40) = 0.08            -> P
#   dtr:       same as dtr_eq                                                       -> P
#   dtr_chain: P (2+30+30)*sqrt(2)/(10*72) = 0.122  Q (2+30+0)*sqrt(2)/(10*40) = 0.113 -> Q
# tracked = c 10 + P 10 + Q 10 = 30; budget 30; reserve(10): one eviction.
SCENARIO4 = {"dtr_eq": "P", "dtr": "P", "dtr_chain": "Q"}


@pytest.mark.parametrize("policy", sorted(SCENARIO4))
def test_scenario_chain_counts_the_path_above(policy: str) -> None:
    d = Driver(None, policy)  # the budget is set once the graph is built
    c = d.const(10, 1)
    a = d.op1([c], 30, 10, lambda v: v + 1)
    p = d.op1([a], 2, 10, lambda v: v * 2)
    q = d.op1([c], 2, 10, lambda v: v + 3)
    k = d.op1([q], 30, 10, lambda v: v * 5)
    rt = d.rt
    rt.evict(a)
    rt.evict(k)
    d.tick(40)
    rt.budget = 30
    rt.reset_peak()
    assert rt.clock == 104 and rt.clock - p.last_access == 72 and rt.clock - q.last_access == 40
    assert extra(rt, p, "exact") == 30 and extra(rt, q, "exact") == 30
    if policy == "dtr_chain":
        assert extra(rt, p, "chain") == Chain(30, 30, 2) and extra(rt, q, "chain") == Chain(30, 0, 2)
    rt.reserve(10)
    assert _only_victim(d, 2, {"P": p, "Q": q}) == SCENARIO4[policy]
    assert (d.read(p), d.read(q), d.read(k), d.read(a)) == (4, 4, 20, 2)
    full_check(rt)


# ---------------------------------------------------------------------------------------------- scenario 5
# The same neighbourhood and path cost; only the length of the evicted chain differs.
#   A1 = f(c)  cost 1   clock 1
#   A2 = f(A1) cost 1   clock 2
#   A3 = f(A2) cost 1   clock 3
#   X  = f(A3) cost 1   clock 4   (X last_access 4)
#   Y0 = f(c)  cost 3   clock 7
#   Y  = f(Y0) cost 1   clock 8   (Y last_access 8); then A1, A2, A3, Y0 are evicted by hand, in that order
#   tick 12             clock 20
# links (up, down, path): A1 (1, 2, 1), A2 (2, 2, 2), A3 (3, 1, 3), Y0 (1, 1, 3): each is evicted
# below an evicted input and pushes down one step up (A1 is two steps from A3: 2, not 3).
# staleness: X 16, Y 12. Extras: X Chain(3, 3, 4) (component {A1, A2, A3}; chain A1-A2-A3-X),
# Y Chain(3, 3, 2).
#   dtr_eq:    X (1+3)/(10*16) = 0.025                Y (1+3)/(10*12) = 0.0333         -> X
#   dtr_chain: X (1+3+3)*sqrt(4)/(10*16) = 0.0875     Y (1+3+3)*sqrt(2)/(10*12) = 0.0825 -> Y
# tracked = c 10 + X 10 + Y 10 = 30; budget 30; reserve(10): one eviction.
SCENARIO5 = {"dtr_eq": "X", "dtr_chain": "Y"}


def _scenario5(policy: str, order: str) -> tuple[Driver, dict[str, Storage]]:
    d = Driver(None, policy)  # the budget is set once the graph is built
    c = d.const(10, 1)
    a1 = d.op1([c], 1, 10, lambda v: v + 1)
    a2 = d.op1([a1], 1, 10, lambda v: v + 1)
    a3 = d.op1([a2], 1, 10, lambda v: v + 1)
    x = d.op1([a3], 1, 10, lambda v: v * 10)
    y0 = d.op1([c], 3, 10, lambda v: v - 1)
    y = d.op1([y0], 1, 10, lambda v: v - 1)
    chain = {"A1": a1, "A2": a2, "A3": a3}
    for name in order.split():
        d.rt.evict(chain[name])
    d.rt.evict(y0)
    d.tick(12)
    d.rt.budget = 30
    d.rt.reset_peak()
    return d, {"X": x, "Y": y, "Y0": y0, **chain}


@pytest.mark.parametrize("policy", sorted(SCENARIO5))
def test_scenario_chain_penalizes_long_evicted_chains(policy: str) -> None:
    d, s = _scenario5(policy, "A1 A2 A3")
    rt = d.rt
    x, y = s["X"], s["Y"]
    assert rt.clock - x.last_access == 16 and rt.clock - y.last_access == 12
    assert extra(rt, x, "exact") == 3 and extra(rt, y, "exact") == 3
    if policy == "dtr_chain":  # only the "chain" kind keeps the estimates
        assert [links(s[k]) for k in ("A1", "A2", "A3", "Y0")] == [
            (1, 2, 1), (2, 2, 2), (3, 1, 3), (1, 1, 3)]
        assert extra(rt, x, "chain") == Chain(3, 3, 4) and extra(rt, y, "chain") == Chain(3, 3, 2)
    rt.reserve(10)
    assert _only_victim(d, 4, {"X": x, "Y": y}) == SCENARIO5[policy]
    assert d.read(x) == 40 and d.read(y) == -1
    full_check(rt)


def test_chain_estimates_are_pushed_one_step_only() -> None:
    # NOTE [ Evicted chains ] 1-2: evicting the chain bottom-up (A3, A2, A1) pushes each value one step down;
    # A3 is two steps from A1, so it does not learn about A1 (true up 3, path 3; estimated 2, 2).
    d, s = _scenario5("dtr_chain", "A3 A2 A1")
    assert [links(s[k]) for k in ("A1", "A2", "A3")] == [
        (1, 3, 1), (2, 2, 2), (2, 1, 2)]
    rt = d.rt
    assert extra(rt, s["X"], "chain") == Chain(3, 2, 3)
    # a rematerialization changes no estimate; the storage's own are reset when it is evicted again
    rt.budget = None
    assert d.read(s["A3"]) == 4 and d.read(s["X"]) == 40
    assert all(s[k].resident for k in ("A1", "A2", "A3"))
    assert links(s["A3"])[0::2] == (2, 2)
    rt.evict(s["A2"])
    assert links(s["A2"]) == (1, 1, 1)
    full_check(rt)


# ---------------------------------------------------------------------------------------------- get_policy
def test_get_policy_unknown_name() -> None:
    with pytest.raises(ValueError) as e:
        get_policy("no_such_policy")
    msg = str(e.value)
    assert "no_such_policy" in msg
    for name in BUILTIN:
        assert repr(name) in msg


@pytest.mark.parametrize("bad", [["dtr"], None, 3])
def test_get_policy_wrong_type(bad: object) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy(bad)  # type: ignore[arg-type]


def test_runtime_rejects_unknown_policy_and_negative_budget() -> None:
    with pytest.raises(ValueError, match="dtr_eq"):
        Runtime(10, policy="DTR-EQ")
    with pytest.raises(ValueError, match="budget"):
        Runtime(-1)
    assert Runtime(0).budget == 0


def test_get_policy_passes_policy_objects_through() -> None:
    p = Policy("anon", lambda c, n, s, e: 0.0)
    assert get_policy(p) is p
    assert "anon" not in POLICIES
    assert get_policy("lru") is POLICIES["lru"]


def test_policy_rejects_unknown_extra_kind() -> None:
    with pytest.raises(ValueError, match="extra kind"):
        Policy("bad", lambda c, n, s, e: 0.0, "neighbours")


def test_register_custom_policy() -> None:
    # evict the MOST expensive storage (the opposite of what DTR wants)
    p = register(Policy("most_expensive", lambda cost, nbytes, staleness, extra: -cost))
    assert POLICIES["most_expensive"] is p and get_policy("most_expensive") is p
    with pytest.raises(ValueError) as e:
        get_policy("nope")
    assert "'most_expensive'" in str(e.value)
    d = Driver(40, "most_expensive")
    c = d.const(10, 0)
    cheap = d.op1([c], 1, 10, lambda v: v + 1)
    dear = d.op1([c], 9, 10, lambda v: v + 2)
    mid = d.op1([c], 5, 10, lambda v: v + 3)
    d.rt.reserve(10)
    assert not dear.resident and cheap.resident and mid.resident and d.rt.evictions == 1
    full_check(d.rt)


def test_custom_policy_sees_the_documented_features() -> None:
    seen: dict[int, tuple[float, int, float, float]] = {}

    def spy(cost: float, nbytes: int, staleness: float, extra: float) -> float:
        seen[nbytes] = (cost, nbytes, staleness, extra)
        return -nbytes  # evict the biggest

    d = Driver(100, Policy("spy", spy, "exact"))
    c = d.const(10, 0)
    a = d.op1([c], 4, 11, lambda v: v + 1)     # clock 4
    b = d.op1([a], 6, 12, lambda v: v + 1)     # clock 10; a touched at 10
    e = d.op1([b], 2, 13, lambda v: v + 1)     # clock 12; b touched at 12
    d.rt.evict(b)
    d.tick(3)                                  # clock 15
    d.rt.reserve(100 - d.rt.memory.tracked + 1)  # forces one eviction of a or e
    assert set(seen) == {11, 13}
    cost, n, st, extra = seen[11]
    assert (cost, n, extra) == (4, 11, 6) and math.isclose(st, 5, rel_tol=1e-6)
    cost, n, st, extra = seen[13]
    assert (cost, n, extra) == (2, 13, 6) and math.isclose(st, 3, rel_tol=1e-6)
    assert not e.resident and a.resident


# ---------------------------------------------------------------------------------------------- size floor
# tiny T: cost 1, 1 B, created first; big G: cost 1000, 1000 B; tick 10.
# clock: T 1, G 1001, then 1011. staleness: T 1010, G 10.
#   h_DTR: T 1/(1*1010) = 0.00099 < G 1000/(1000*10) = 0.1, so without a floor T goes first.
# default floor = 1% of the average candidate size = 0.01 * 1001 / 2 = 5.005 B > 1 B: T is skipped.
def _floor_graph(budget: int, **kw: object) -> tuple[Driver, object, object]:
    d = Driver(budget, "dtr_eq", **kw)
    c = d.const(10, 0)
    t = d.op1([c], 1, 1, lambda v: v + 1)
    g = d.op1([c], 1000, 1000, lambda v: v + 2)
    d.tick(10)
    assert d.rt.memory.tracked == 1011
    return d, t, g


def test_min_evict_bytes_zero_evicts_the_lowest_score() -> None:
    d, t, g = _floor_graph(1011, min_evict_bytes=0)
    d.rt.reserve(1)
    assert not t.resident and g.resident and d.rt.evictions == 1


def test_default_floor_skips_tiny_storage() -> None:
    d, t, g = _floor_graph(1011)
    d.rt.reserve(1)
    assert t.resident and not g.resident and d.rt.evictions == 1
    full_check(d.rt)


def test_default_floor_tiny_storage_taken_when_it_is_the_only_way() -> None:
    d, t, g = _floor_graph(1011)
    d.rt.lock([g])  # an op in flight reads G: T is the only candidate, although under the floor
    d.rt.reserve(1)
    assert not t.resident and g.resident and d.rt.evictions == 1
    d.rt.unlock([g])
    full_check(d.rt)


def test_default_floor_tiny_storage_taken_after_the_big_one() -> None:
    d, t, g = _floor_graph(1011)
    d.rt.reserve(1001)  # both must go: G first (floor), then T
    assert d.evicted() == [g, t]
    assert d.rt.memory.tracked == 10
    with pytest.raises(BudgetError):
        d.rt.reserve(1002)


def test_explicit_min_evict_bytes() -> None:
    d, t, g = _floor_graph(1011, min_evict_bytes=500)
    d.rt.reserve(1)
    assert t.resident and not g.resident
    # a floor above every candidate falls back to the lowest score among all of them
    d, t, g = _floor_graph(1011, min_evict_bytes=5000)
    d.rt.reserve(1)
    assert not t.resident and g.resident


def test_evict_minimum_is_a_hard_floor() -> None:
    """NOTE [ The smallest victim ]: below ``evict_minimum`` a storage is never evicted, not even as the last way."""
    d, t, g = _floor_graph(1011, evict_minimum=2)
    d.rt.lock([g])  # T (1 B) is the only candidate: without the minimum it would go (test above)
    with pytest.raises(BudgetError):
        d.rt.reserve(1)
    assert t.resident and g.resident and d.rt.evictions == 0
    d.rt.unlock([g])
    d.rt.reserve(1000)  # G goes; T stays although a byte more would need it too
    assert t.resident and not g.resident
    with pytest.raises(BudgetError):
        d.rt.reserve(1001)
    assert t.resident
    full_check(d.rt)


def test_zero_byte_storages_are_never_chosen() -> None:
    d = Driver(20, "lru", min_evict_bytes=0)
    c = d.const(10, 0)
    z = d.op1([c], 1, 0, lambda v: v)  # the stalest, but freeing it frees nothing
    x = d.op1([c], 1, 10, lambda v: v + 1)
    d.tick(1)
    d.rt.reserve(10)
    assert z.resident and not x.resident
    with pytest.raises(BudgetError):
        d.rt.reserve(11)
    assert z.resident


def test_exact_components_split_where_union_find_does_not() -> None:
    """NOTE [ Exact components ] 1: A feeds B1 and B2; with all three evicted they form one component. Bringing A
    back cuts it in two: X's evicted neighbourhood is then B1 alone (3), while union-find's set still sums
    B1 and B2 (43)."""
    got = {}
    for policy, kind in (("dtr_comp", "comp"), ("dtr_eq", "uf")):
        d = Driver(None, policy)
        rt = d.rt
        c = d.const(10, 1)
        a = d.op1([c], 100, 10, lambda v: v + 1)
        b1 = d.op1([a], 3, 10, lambda v: v * 2)
        b2 = d.op1([a], 40, 10, lambda v: v * 3)
        x = d.op1([b1], 1, 10, lambda v: v + 7)
        for s in (b1, a, b2):
            rt.evict(s)
        assert extra(rt, x, kind) == 143
        assert d.read(a) == 2
        full_check(rt)
        got[policy] = extra(rt, x, kind)
        assert d.read(x) == 11 and d.read(b2) == 6
        full_check(rt)
    assert got == {"dtr_comp": 3, "dtr_eq": 43}
