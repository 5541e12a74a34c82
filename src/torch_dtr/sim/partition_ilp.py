"""The exact partition plan of a small graph: an integer program over strategies and placements (HiGHS).

# NOTE [ Partition ILP ]
#
# 1. Variables: x[k, s] = 1 when op k runs strategy s; y[g, p] = 1 when constant group g (the batch, a
#    parameter with its optimizer states) is placed p; z[t, v, p, q] = 1 when version v of tensor t, placed
#    p, is converted to q (once, NOTE [ Placements ] 4). Each op one strategy, each group one placement;
#    z >= (t placed p) + x[k, s] - 1 for every reader k whose strategy s wants t as q.
# 2. An op that writes a tensor in place must want it in its placement: x[k, s] <= (t placed as s wants).
# 3. Objective: the step time of ``Planner.cost`` (shares of op times, batch norm's all-reduces, the
#    conversions' collectives).
# 4. Memory, with a budget: at every op, the storages alive then under their placements plus every copy of
#    a version between its first and its last possible reader stay within the budget. Copies are counted
#    over the span of every reader that could want them, so the program is conservative there; the plan it
#    returns is then costed and replayed like any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..core.partition import ANY, P, Place, Plan, Planner, R
from ..deps import need

_WHAT = "the exact partition plan (an ILP)"


@dataclass(frozen=True)
class Solution:
    plan: Plan | None
    status: str  # "optimal", "time limit" (the best found), "infeasible" or "too large"
    objective: float | None  # modelled step time, seconds
    variables: int
    seconds: float


def solve(planner: Planner, budget: int | None, time_limit: float = 60.0, max_nodes: int = 2000) -> Solution:
    """NOTE [ Partition ILP ]."""
    np = need("numpy", "sim", _WHAT)
    opt = need("scipy.optimize", "sim", _WHAT)
    sparse = need("scipy.sparse", "sim", _WHAT)
    g, link = planner.graph, planner.link
    ts, nodes = g.tensors, g.nodes
    t0 = time.perf_counter()
    if len(nodes) > max_nodes:
        return Solution(None, "too large", None, 0, 0.0)
    cost: list[float] = []

    def var(c: float) -> int:
        cost.append(c)
        return len(cost) - 1

    x = [[var(n.time * s.frac + (link.cost(P, R, s.sync) if s.sync else 0.0)) for s in ss]
         for n, ss in zip(nodes, planner.strats, strict=True)]
    groups: dict[int, int] = {}  # constant -> its group's representative
    for i, t in enumerate(ts):
        if t.const and t.base == i:
            groups[i] = planner.groups.get(i, (i,))[0]
    y: dict[int, dict[Place, int]] = {}
    for rep in set(groups.values()):
        shape = ts[rep].shape
        opts = [R] + [d for d, s in enumerate(shape) if link.devices > 1 and s > 1 and s % link.devices == 0]
        y[rep] = {p: var(0.0) for p in opts}
    have: dict[int, dict[Place, list[int]]] = {}  # tensor -> placement -> variables that give it
    for rep_of, rep in groups.items():
        have[rep_of] = {p: [v] for p, v in y[rep].items()}
    for k, (n, ss) in enumerate(zip(nodes, planner.strats, strict=True)):
        for j, o in enumerate(n.outs):
            h = have.setdefault(o, {})
            for c, s in enumerate(ss):
                h.setdefault(s.outs[j], []).append(x[k][c])
    rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, low, high)
    for xs in x:
        rows.append(({v: 1.0 for v in xs}, 1.0, 1.0))
    for ps in y.values():
        rows.append(({v: 1.0 for v in ps.values()}, 1.0, 1.0))
    # readers: (tensor, version, wanted) -> [(k, strategy, variable)]; writes (rule 2)
    version: dict[int, int] = {}
    readers: dict[tuple[int, int, Place], list[int]] = {}
    span: dict[tuple[int, int], list[int]] = {}
    for k, (n, ss) in enumerate(zip(nodes, planner.strats, strict=True)):
        for c, s in enumerate(ss):
            for i, t in enumerate(n.ins):
                want = s.ins[i]
                if want == ANY:
                    continue
                if i in n.writes:
                    row = {x[k][c]: 1.0}
                    for v in have.get(t, {}).get(want, []):
                        row[v] = row.get(v, 0.0) - 1.0
                    rows.append((row, -float("inf"), 0.0))
                    continue
                key = (t, version.get(ts[t].base, 0), want)
                readers.setdefault(key, []).append(x[k][c])
                sp = span.setdefault(key[:2], [k, k])
                sp[1] = k
        for i in n.writes:
            b = ts[n.ins[i]].base
            version[b] = version.get(b, 0) + 1
    copies: list[tuple[int, int, int, int]] = []  # (variable, bytes per device, first, last)
    for (t, v, want), xs in readers.items():
        for p, hv in have.get(t, {}).items():
            if not link.kind(p, want):
                continue
            z = var(link.cost(p, want, ts[t].nbytes))
            first, last = span[(t, v)]
            copies.append((z, link.per_device(ts[t], want), first, last))
            for xv in set(xs):
                row = {z: -1.0, xv: 1.0}
                for h in hv:
                    row[h] = row.get(h, 0.0) + 1.0
                rows.append((row, -float("inf"), 1.0))
    if budget is not None:
        _memory(planner, have, copies, rows, budget)
    n_var = len(cost)
    data, ri, ci, lo, hi = [], [], [], [], []
    for r, (coef, a, b) in enumerate(rows):
        for v, c in coef.items():
            ri.append(r)
            ci.append(v)
            data.append(c)
        lo.append(a)
        hi.append(b)
    A = sparse.coo_matrix((data, (ri, ci)), shape=(len(rows), n_var)).tocsr()
    res = opt.milp(np.array(cost), integrality=np.ones(n_var), bounds=opt.Bounds(0, 1),
                   constraints=opt.LinearConstraint(A, np.array(lo), np.array(hi)),
                   options={"time_limit": time_limit, "disp": False})
    secs = time.perf_counter() - t0
    if res.x is None:
        return Solution(None, "infeasible" if res.status == 2 else f"no solution ({res.message})", None, n_var, secs)
    sol = res.x
    choice = tuple(max(range(len(xs)), key=lambda c: sol[xs[c]]) for xs in x)
    consts: dict[int, Place] = {}
    for t, rep in groups.items():
        consts[t] = max(y[rep], key=lambda p: sol[y[rep][p]])
    status = "optimal" if res.status == 0 else "time limit"
    # partial outputs reduced at once: the same collectives, so the same step time (NOTE [ Partition plans ] 6)
    return Solution(planner.settle(Plan(choice, consts, "ilp")), status, float(res.fun), n_var, secs)


def _memory(planner: Planner, have: dict[int, dict[Place, list[int]]], copies: list[tuple[int, int, int, int]],
            rows: list[tuple[dict[int, float], float, float]], budget: int) -> None:
    """NOTE [ Partition ILP ] 4: one row per op."""
    g, link = planner.graph, planner.link
    ts = g.tensors
    alive: dict[int, None] = {}
    by_first: dict[int, list[tuple[int, int, int]]] = {}
    for z, nbytes, first, last in copies:
        by_first.setdefault(first, []).append((z, nbytes, last))
    open_copies: list[tuple[int, int, int]] = []
    for k, n in enumerate(g.nodes):
        for t in n.news:
            alive[t] = None
        for o, v in zip(n.outs, n.views, strict=True):
            if v < 0:
                alive[o] = None
        open_copies = [c for c in open_copies if c[2] >= k] + by_first.get(k, [])
        row: dict[int, float] = {}
        for b in alive:
            for p, vs in have.get(b, {}).items():
                nb = link.per_device(ts[b], p)
                for v in vs:
                    row[v] = row.get(v, 0.0) + nb
        for z, nbytes, _ in open_copies:
            row[z] = row.get(z, 0.0) + nbytes
        rows.append((row, -float("inf"), float(budget)))
        for t in n.frees:
            alive.pop(t, None)
