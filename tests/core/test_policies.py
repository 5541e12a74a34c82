"""Each policy evicts the storage that a hand computation of its score predicts.

Scores (lowest evicted), staleness = clock - last_access, clock += cost of every recorded op:
  dtr_eq / dtr / dtr_local: (cost + extra) / (nbytes * staleness), extra = uf / exact / 0
  lru: 1 / staleness;  size: 1 / nbytes;  msps: (cost + evicted ancestors' cost) / nbytes
"""

from __future__ import annotations

import math

import pytest
from coredrive import Driver, full_check

from torch_dtr.core import DEFAULT_POLICY, POLICIES, BudgetError, Policy, Runtime, get_policy, register

BUILTIN = ("dtr_eq", "dtr", "dtr_local", "lru", "size", "msps")


@pytest.fixture(autouse=True)
def _restore_policies():
    saved = dict(POLICIES)
    yield
    POLICIES.clear()
    POLICIES.update(saved)


def test_builtin_policies_registered() -> None:
    assert set(BUILTIN) <= set(POLICIES)
    assert DEFAULT_POLICY == "dtr_eq"
    assert Runtime(None).policy is POLICIES["dtr_eq"]
    assert {POLICIES[n].extra for n in BUILTIN} == {"uf", "exact", "", "ancestors"}
    assert POLICIES["dtr_eq"].extra == "uf" and POLICIES["dtr"].extra == "exact"
    assert POLICIES["dtr_local"].extra == "" and POLICIES["msps"].extra == "ancestors"


def _only_victim(d: Driver, before: int, pool: dict[str, object]) -> str:
    rt = d.rt
    assert rt.evictions == before + 1, "exactly one eviction expected"
    gone = [name for name, s in pool.items() if not s.resident]  # type: ignore[attr-defined]
    assert len(gone) == 1, gone
    assert d.evicted() == [pool[gone[0]]]
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
# tracked = 10 + 10 + 10 + 50 + 10 = 90; budget 100; reserve(20) must free 10 B: one eviction.
SCENARIO1 = {"dtr_eq": "H", "dtr": "H", "dtr_local": "H", "lru": "L", "size": "S", "msps": "M"}


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
# tracked = 10 + 10 + 12 = 32; budget 42; reserve(20) must free 10 B: one eviction.
SCENARIO2 = {"dtr_eq": "D", "dtr": "D", "dtr_local": "B", "lru": "B", "size": "D", "msps": "D"}


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
    if policy == "dtr_eq":
        assert a.uf is not None and a.uf.find().cost == 100
        assert rt._extra(b, "uf") == 100 and rt._extra(dd, "uf") == 0
    else:
        assert a.uf is None  # only the union-find policy keeps components
    assert rt._extra(b, "exact") == 100 and rt._extra(b, "ancestors") == 100
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
# tracked = 10 + 10 + 10 = 30; budget 40; reserve(20): one eviction.
SCENARIO3 = {"dtr_eq": "R", "dtr": "R", "dtr_local": "R", "lru": "R", "msps": "P"}


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
    assert rt._extra(p, "ancestors") == 0 and rt._extra(p, "exact") == 50
    rt.reserve(20)
    assert _only_victim(d, 1, {"P": p, "R": r}) == SCENARIO3[policy]
    assert d.read(q) == 20


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
