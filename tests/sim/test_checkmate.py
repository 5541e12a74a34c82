"""The Checkmate MILP baseline: optimality on small graphs, budget safety of its schedules, log import."""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pytest

from torch_dtr.sim import checkmate, log
from torch_dtr.sim.checkmate import (
    DIRECT_MAX_NODES,
    Graph,
    ScheduleError,
    chain,
    graph_from_log,
    min_budget,
    peak_bytes,
    simulate_schedule,
    smallest_budget,
    solve,
)

RESNET = Path(__file__).resolve().parents[3] / "shared" / "dtr-logs" / "resnet32-bs56.log"


def _check_schedule(g: Graph, sol) -> None:
    """The solver's schedule, replayed independently, computes every node, keeps the outputs and fits."""
    assert sol.R is not None and sol.S is not None
    assert sol.R.diagonal().all()
    assert simulate_schedule(g, sol.R, sol.S) == sol.peak <= sol.budget
    assert sol.compute == pytest.approx(sum(g.cost[i] for _, i in zip(*np.nonzero(sol.R), strict=True)))


# ----------------------------------------------------------------------------------------------- chains
def test_chain_shape_and_peak() -> None:
    g = chain(4)
    assert g.names == ("f0", "f1", "f2", "f3", "g3", "g2", "g1", "g0")
    assert g.deps == ((), (0,), (1,), (2,), (3,), (2, 4), (1, 5), (0, 6))
    assert g.keep == {7} and peak_bytes(g) == 5  # n + 1: every activation plus the first gradient
    assert peak_bytes(chain(6, backward=False)) == 2


@pytest.mark.parametrize("n", [8, 10, 12])
def test_chain_unlimited_budget_is_free(n: int) -> None:
    g = chain(n)
    for budget in (peak_bytes(g), 10 * n):
        sol = solve(g, budget, time_limit=30)
        assert sol.status == "optimal" and sol.overhead == pytest.approx(1.0)
        _check_schedule(g, sol)


@pytest.mark.parametrize("n", [8, 10, 12])
def test_chain_sqrt_budget_recomputes_within_budget(n: int) -> None:
    g = chain(n)
    budget = round(2 * math.sqrt(n))
    assert budget < peak_bytes(g)
    sol = solve(g, budget, time_limit=30)
    assert sol.status == "optimal" and sol.overhead > 1.0
    assert sol.lower_bound <= sol.overhead + 1e-6 and sol.gap <= 1e-4
    _check_schedule(g, sol)
    lp = solve(g, budget, relax=True)
    assert lp.status == "lp" and lp.overhead <= sol.overhead + 1e-6 and lp.R is None


def test_larger_budget_never_costs_more() -> None:
    g = chain(9)
    over = [solve(g, b, time_limit=30).overhead for b in range(min_budget(g), peak_bytes(g) + 1)]
    assert over == sorted(over, reverse=True) and over[-1] == pytest.approx(1.0) and over[0] > 1.5


# ------------------------------------------------------------------------------------ brute force
def _stage(g: Graph, s_in: frozenset, order: list[int], s_out: frozenset) -> int | None:
    """Peak of one stage under the memory rule (written apart from the module), or None if it is invalid."""
    present, peak = set(s_in), 0
    for idx, k in enumerate(order):
        if not set(g.deps[k]) <= present:
            return None
        present.add(k)
        live = {i for i in present if i == k or i in s_out or any(i in g.deps[j] for j in order[idx:])}
        peak = max(peak, g.const_bytes + sum(g.size[i] for i in live))
        present = {i for i in live if i in s_out or any(i in g.deps[j] for j in order[idx + 1 :])}
    return peak if s_out <= present else None


def _brute(g: Graph, budget: int) -> float | None:
    """Cheapest schedule by dynamic programming over (held set entering a stage): every recompute set and
    every checkpoint set of every stage."""
    best = {frozenset(): 0.0}
    for t in range(g.n):
        nxt: dict[frozenset, float] = {}
        for s_in, c in best.items():
            for extra in itertools.chain.from_iterable(itertools.combinations(range(t), r) for r in range(t + 1)):
                order = [*extra, t]
                pool = sorted(s_in | set(order))
                outs = ([frozenset(g.keep)] if t == g.n - 1 else
                        [frozenset(s) for r in range(len(pool) + 1) for s in itertools.combinations(pool, r)])
                cost = c + sum(g.cost[i] for i in order)
                for s_out in outs:
                    p = _stage(g, s_in, order, s_out)
                    if p is not None and p <= budget and cost < nxt.get(s_out, math.inf):
                        nxt[s_out] = cost
        best = nxt
    return min(best.values(), default=None)


def _random_graph(rng: random.Random, n: int) -> Graph:
    deps = tuple(tuple(sorted(rng.sample(range(i), rng.randint(0, min(i, 2))))) for i in range(n))
    keep = frozenset({n - 1} | {i for i in range(n - 1) if rng.random() < 0.2})
    return Graph(tuple(float(rng.randint(1, 5)) for _ in range(n)), tuple(rng.randint(1, 4) for _ in range(n)),
                 deps, keep, rng.randint(0, 2), tuple(f"v{i}" for i in range(n)))


@pytest.mark.parametrize("seed", range(6))
def test_milp_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    g = _random_graph(rng, 5)
    statuses = set()
    for budget in range(min_budget(g) - 1, peak_bytes(g) + 1):
        want = _brute(g, budget)
        sol = solve(g, budget, time_limit=30)
        statuses.add(sol.status)
        if want is None:
            assert sol.status == "infeasible", (g, budget, sol)
            continue
        assert sol.status == "optimal" and sol.compute == pytest.approx(want), (g, budget, sol, want)
        _check_schedule(g, sol)
        assert solve(g, budget, relax=True).compute <= want + 1e-6
    assert {"optimal", "infeasible"} <= statuses


@pytest.mark.parametrize("seed", range(3))
def test_running_sum_form_agrees(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # graphs over DIRECT_MAX_NODES get the running-sum memory rows: same optimum, same replayed safety
    g = _random_graph(random.Random(seed), 7) if seed else chain(6)
    budgets = range(min_budget(g), peak_bytes(g) + 1)
    want = [solve(g, b).compute for b in budgets]
    monkeypatch.setattr(checkmate, "DIRECT_MAX_NODES", 0)
    for b, w in zip(budgets, want, strict=True):
        sol = solve(g, b)
        assert sol.compute == pytest.approx(w)
        if sol.R is not None:
            _check_schedule(g, sol)


def test_brute_force_on_chain_by_hand() -> None:
    # chain(2): f0 f1 g1(f1) g0(f0, g1). Holding everything peaks at 3 (f0, f1, g1), and 3 is also the least
    # budget (g0 reads f0 and g1): the optimum at 3 is the 4 units of one pass; at 2 nothing fits.
    g = chain(2)
    assert _brute(g, 3) == 4.0 == solve(g, 3).compute and _brute(g, 2) is None


# --------------------------------------------------------------------------------- errors, edge cases
def test_infeasible_budget_is_reported_quickly() -> None:
    g = chain(50)  # 100 nodes: building the MILP would take a while, the bound check does not
    t0 = time.perf_counter()
    sol = solve(g, min_budget(g) - 1)
    assert sol.status == "infeasible" and sol.R is None and math.isinf(sol.overhead)
    assert time.perf_counter() - t0 < 0.5


def test_milp_proves_infeasible_past_the_quick_bound() -> None:
    # v5 reads v1 and v3; v3 reads v0, v2. Stages run in index order, so v1 is made before v3 and held while
    # v3 is computed: 2 + 4 + 4 + 2 + 4 = 16 bytes, although each single op fits in 14 (= min_budget).
    g = Graph((2.0, 4.0, 4.0, 3.0, 1.0, 5.0), (4, 4, 2, 4, 1, 4), ((), (), (0,), (0, 2), (0, 1), (1, 3)),
              frozenset({5}), 2)
    assert min_budget(g) == 14 and _brute(g, 14) is None
    assert solve(g, 14).status == "infeasible"
    assert solve(g, 16).compute == pytest.approx(_brute(g, 16))


@pytest.mark.parametrize("seed", range(6))
def test_smallest_budget_is_the_least_feasible_one(seed: int) -> None:
    g = _random_graph(random.Random(100 + seed), 5)
    want = next(b for b in range(min_budget(g), peak_bytes(g) + 1) if _brute(g, b) is not None)
    assert smallest_budget(g) == (want, True)
    # with a tolerance the answer is feasible and at most that far above the least
    b, exact = smallest_budget(g, tolerance=3)
    assert exact and want <= b <= want + 3


@pytest.mark.parametrize("g", [chain(3), _random_graph(random.Random(2), 6)], ids=["chain3", "random6"])
@pytest.mark.parametrize("max_overhead", [1.0, 1.15, 1.5])
def test_smallest_budget_within_an_overhead(g: Graph, max_overhead: float) -> None:
    # only schedules computing at most max_overhead x one pass count: on these graphs the least budget
    # and the least budget with an optimum that cheap differ (chain(3): 7/6 of a pass at 3 bytes, 1x at 4)
    base = sum(g.cost)
    budgets = range(min_budget(g), peak_bytes(g) + 1)
    want = next(b for b in budgets if (c := _brute(g, b)) is not None and c <= max_overhead * base + 1e-9)
    assert smallest_budget(g, max_overhead=max_overhead) == (want, True)


def test_smallest_budget_past_the_quick_bound() -> None:
    g = Graph((2.0, 4.0, 4.0, 3.0, 1.0, 5.0), (4, 4, 2, 4, 1, 4), ((), (), (0,), (0, 2), (0, 1), (1, 3)),
              frozenset({5}), 2)
    assert min_budget(g) == 14 and _brute(g, 15) is not None and smallest_budget(g) == (15, True)
    with pytest.raises(ValueError, match="tolerance must be an int"):
        smallest_budget(g, tolerance=-1)
    with pytest.raises(ValueError, match="max_overhead must be >= 1"):
        smallest_budget(g, max_overhead=0.5)


def test_bad_arguments_raise() -> None:
    g = chain(3)
    for kw in ({"budget_bytes": -1}, {"budget_bytes": math.inf}, {"budget_bytes": 10, "time_limit": 0}):
        with pytest.raises(ValueError, match="must be"):
            solve(g, **kw)
    with pytest.raises(ValueError, match="deps"):
        Graph((1.0, 1.0), (1, 1), ((), (1,)))
    with pytest.raises(ValueError, match="keep"):
        Graph((1.0,), (1,), ((),), frozenset({3}))
    with pytest.raises(ValueError, match="at least one node"):
        solve(Graph((), (), ()), 10)


def test_checker_rejects_broken_schedules() -> None:
    g = chain(3)
    R, S = np.eye(6, dtype=bool), np.zeros((7, 6), dtype=bool)
    with pytest.raises(ScheduleError, match="not resident"):
        simulate_schedule(g, R, S)
    sol = solve(g, peak_bytes(g))
    S = sol.S.copy()
    S[6, 5] = False
    with pytest.raises(ScheduleError, match="keep nodes"):
        simulate_schedule(g, sol.R, S)


# ---------------------------------------------------------------------------------------------- logs
def _line(kind: str, **f) -> str:
    return json.dumps({"INSTRUCTION": kind, **{k: v if isinstance(v, list) else str(v) for k, v in f.items()}})


def _call(op: str, args: list[str], results: list[tuple[str, int, int]], t: int) -> list[str]:
    out = [_line("CALL", NAME=op, ARGS=args, RESULT=[r for r, _, _ in results], TIME=t)]
    for r, b, a in results:
        out += [_line("MEMORY", NAME=r, MEMORY=b), _line("ALIAS", NAME=r, ALIAS=a)]
    return out


HAND_LOG = [
    _line("CONSTANT", NAME="p"), _line("MEMORY", NAME="p", MEMORY=7),  # before START, still named: counts
    _line("CONSTANT", NAME="q"), _line("MEMORY", NAME="q", MEMORY=5), _line("RELEASE", NAME="q"),  # gone
    _line("ANNOTATE", ANNOTATION="START"),
    _line("CONSTANT", NAME="w"), _line("MEMORY", NAME="w", MEMORY=100),
    *_call("t", ["w"], [("wt", 100, 0)], 1),  # a view of a constant: no node
    *_call("conv", ["p", "wt"], [("a", 40, -1)], 10),  # node 0
    *_call("bn", ["a", "w"], [("b", 40, -1), ("m", 8, -1), ("r", 0, -1)], 20),  # node 1: 48 bytes
    *_call("view", ["b"], [("bv", 40, 0)], 1),  # a view of node 1
    *_call("relu", ["bv"], [("c", 40, -1)], 5),  # node 2 reads node 1 through the view
    _line("COPY", DST="c2", SRC="c"),
    _line("MUTATE", NAME="add_", ARGS=["c", "a"], MUTATE=[0], TIME="3"),  # node 3: new version of c (and c2)
    _line("RELEASE", NAME="a"), _line("RELEASE", NAME="b"), _line("RELEASE", NAME="bv"), _line("RELEASE", NAME="c"),
    *_call("sum", ["c2"], [("loss", 4, -1)], 2),  # node 4 reads the mutated version
    _line("COPY_FROM", DST="m", SRC="loss"), _line("RELEASE", NAME="r"),  # node 1 loses its last names
]


def test_graph_from_hand_written_log() -> None:
    g = graph_from_log(log.parse(HAND_LOG))
    assert g.names == ("conv", "bn", "relu", "add_", "sum")
    assert g.cost == (10.0, 20.0, 5.0, 3.0, 2.0)  # view ops' time is dropped
    assert g.size == (40, 48, 40, 40, 4)
    assert g.deps == ((), (0,), (1,), (0, 2), (3,))
    assert g.keep == {3, 4}  # c2 -> the mutated version; m and loss -> sum
    assert g.const_bytes == 107  # p (named at START) + w, each once; q was released before START
    assert peak_bytes(g) == 107 + 40 + 48 + 40  # conv output is held for the MUTATE while relu runs
    assert min_budget(g) == 107 + 120  # the MUTATE reads conv and relu and writes a new version
    assert solve(g, min_budget(g) - 1).status == "infeasible"
    sol = solve(g, min_budget(g))  # relu cannot run with conv held: conv is rerun for the MUTATE
    assert sol.status == "optimal" and sol.compute == 40 + 10
    _check_schedule(g, sol)


def test_graph_from_log_slice_and_split() -> None:
    lg = log.parse(HAND_LOG)
    g = graph_from_log(lg, max_ops=3)
    assert g.names == ("conv", "bn", "relu") and g.keep == {0, 1, 2}  # all still named at the cut
    s = graph_from_log(lg, split_outputs=True)
    assert s.names == ("conv", "bn", "bn", "relu", "add_", "sum")
    assert s.size == (40, 40, 8, 40, 40, 4) and s.cost == (10.0, 20.0, 0.0, 5.0, 3.0, 2.0)
    assert s.deps == ((), (0,), (0, 1), (1,), (0, 3), (4,))
    assert s.keep == {4, 5}
    with pytest.raises(ValueError, match="max_ops"):
        graph_from_log(lg, max_ops=0)


@pytest.mark.skipif(not RESNET.is_file(), reason="the DTR logs are not in this workspace")
def test_resnet_slice_builds_and_solves() -> None:
    lg = log.read(RESNET)
    g = graph_from_log(lg, max_ops=40)
    assert g.n == 40 and g.const_bytes > 0 and all(d < i for i in range(g.n) for d in g.deps[i])
    peak = peak_bytes(g)
    sol = solve(g, peak, time_limit=30)
    assert sol.status == "optimal" and sol.overhead == pytest.approx(1.0)
    _check_schedule(g, sol)
    # a forward prefix still names every activation (saved for backward): nothing can be given up
    assert min_budget(g) == peak and solve(g, peak // 2).status == "infeasible"
    s = graph_from_log(lg, max_ops=40, split_outputs=True)
    assert s.n == 40 and peak_bytes(s) < peak


# ---------------------------------------------------------------- offload: a third choice per value
def test_cheap_copies_lower_the_optimum_and_the_schedule_checks_out():
    g = chain(12, cost=100.0, size=10)  # copying 10 B back at 1 GB/s costs 10 ns; recomputing a node 100
    for budget in (min_budget(g), min_budget(g) + 10, peak_bytes(g) // 2):
        alone = solve(g, budget, time_limit=30)
        both = solve(g, budget, time_limit=30, swap_gbps=1.0)
        assert alone.status == both.status == "optimal"
        assert both.overhead < alone.overhead and both.In.any() and both.Out.any()
        assert both.copy == 10.0 * (both.In.sum() + both.Out.sum())
        assert simulate_schedule(g, both.R, both.S, both.In, both.Out) == both.peak <= budget


def test_expensive_copies_change_nothing():
    g = chain(10, cost=1.0, size=10)  # a copy costs 1000 ns, a recomputation 1
    b = min_budget(g) + 10
    alone = solve(g, b, time_limit=30)
    slow = solve(g, b, time_limit=30, swap_gbps=0.01)
    assert slow.overhead == pytest.approx(alone.overhead) and not slow.In.any() and slow.copy == 0.0


def test_free_copies_out_are_not_charged():
    g = chain(12, cost=100.0, size=10)
    b = min_budget(g)
    paid = solve(g, b, time_limit=30, swap_gbps=1.0)
    free = solve(g, b, time_limit=30, swap_gbps=1.0, swap_out_free=True)
    assert free.overhead <= paid.overhead and free.copy == 10.0 * free.In.sum()


def test_the_checker_rejects_copies_that_cannot_happen():
    g = chain(4, cost=1.0, size=1)
    R, S = checkmate._checkpoint_all(g)
    n = g.n
    In, Out = np.zeros((n, n), dtype=bool), np.zeros((n, n), dtype=bool)
    In[3, 0] = True  # node 0 was never copied out
    with pytest.raises(ScheduleError, match="no copy"):
        simulate_schedule(g, R, S, In, Out)
    In[:] = False
    Out[1, 3] = True  # node 3 does not exist in stage 1
    with pytest.raises(ScheduleError, match="neither holds nor computes"):
        simulate_schedule(g, R, S, In, Out)


def test_offload_is_refused_beyond_the_direct_model():
    g = chain(DIRECT_MAX_NODES // 2 + 1)
    with pytest.raises(ValueError, match="offload is modelled up to"):
        solve(g, peak_bytes(g), swap_gbps=1.0)
