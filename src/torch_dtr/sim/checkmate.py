"""The exact optimum baseline: Checkmate's MILP (Jain et al., MLSys 2020) solved with HiGHS. Imports no torch.

A ``Graph`` is a DAG in topological order (node i reads ``deps[i]``, all < i). A schedule has stages
t = 0..n-1; stage t computes node t (``R[t,t] = 1``) and may recompute earlier nodes first, in index order.
``R[t,i]``: node i is (re)computed in stage t (i <= t). ``S[t,i]``: node i is resident entering stage t
(i < t); row ``S[n]`` is what is resident after the last stage and must hold every ``keep`` node.

Memory rule (the solver's model and ``simulate_schedule`` follow it; constants are always held):

* computing node k in stage t needs k's deps resident; while it runs, memory is ``const_bytes + size[k]``
  plus every value that is still needed: a value i < k whose some user j >= k is computed in stage t,
  or that is checkpointed into stage t+1 (``S[t+1,i]``), plus values i > k held from before (``S[t,i]``);
* so a value is freed right after its last use in a stage unless it is checkpointed into the next one;
* that peak must stay within the budget at every computation of every stage.

In the MILP "still needed" is a continuous variable bounded below by each of its reasons (an OR); it may
only overstate memory, so every integral solution is safe, and it is exact at the optimum. The memory of
an event is one row over all values (O(n^3) nonzeros, which HiGHS solves many times faster) up to
``DIRECT_MAX_NODES`` nodes, and a running sum along the stage beyond (O(n (n + edges)) nonzeros).
Like Checkmate, the optimum is over schedules that run each stage in index order.

Offload (``solve(..., swap_gbps=B)``, POFO's and torchtitan's third choice per value): ``In[t,i]`` copies node i
back from host memory at the start of stage t (it then counts as held, like ``S[t,i]``), which needs a copy
made by an earlier ``Out[t',i]`` (a copy out of a value resident in stage t'); copies cost bytes / B ns
(copies out free with ``swap_out_free``), host memory is unbounded. Up to ``DIRECT_MAX_NODES`` nodes only.
"""

from __future__ import annotations

import bisect
import math
import numbers
import time
from dataclasses import dataclass, field

from ..deps import need
from . import log as L

_WHAT = "the exact baseline (Checkmate's ILP, torch_dtr.sim.checkmate)"
np = need("numpy", "sim", _WHAT)
_optimize = need("scipy.optimize", "sim", _WHAT)
Bounds, LinearConstraint, milp = _optimize.Bounds, _optimize.LinearConstraint, _optimize.milp
coo_matrix = need("scipy.sparse", "sim", _WHAT).coo_matrix

__all__ = ["Graph", "ScheduleError", "Solution", "chain", "graph_from_log", "min_budget", "peak_bytes",
           "simulate_schedule", "smallest_budget", "solve"]


class ScheduleError(ValueError):
    """A schedule that breaks the model: a missing dependency, an impossible checkpoint or a lost output."""


@dataclass(frozen=True)
class Graph:
    """Node i costs ``cost[i]`` ns, holds ``size[i]`` bytes and reads ``deps[i]`` (sorted, distinct, all < i).
    ``keep`` nodes must be resident when the schedule ends; ``const_bytes`` is held throughout and counts
    against the budget."""

    cost: tuple[float, ...]
    size: tuple[int, ...]
    deps: tuple[tuple[int, ...], ...]
    keep: frozenset[int] = frozenset()
    const_bytes: int = 0
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.cost)
        if len(self.size) != n or len(self.deps) != n or (self.names and len(self.names) != n):
            raise ValueError(f"Graph: cost, size, deps (and names, if given) need one entry per node; got "
                             f"{n}, {len(self.size)}, {len(self.deps)}, {len(self.names)}")
        for i in range(n):
            if not (math.isfinite(self.cost[i]) and self.cost[i] >= 0):
                raise ValueError(f"Graph: cost[{i}] must be a finite number >= 0, got {self.cost[i]!r}")
            if int(self.size[i]) != self.size[i] or self.size[i] < 0:
                raise ValueError(f"Graph: size[{i}] must be an integer >= 0 (bytes), got {self.size[i]!r}")
            d = self.deps[i]
            if list(d) != sorted(set(d)) or (d and (d[0] < 0 or d[-1] >= i)):
                raise ValueError(f"Graph: deps[{i}] must be sorted distinct node indices below {i} (topological "
                                 f"order), got {d!r}")
        bad = sorted(k for k in self.keep if not 0 <= k < n)
        if bad:
            raise ValueError(f"Graph: keep names nodes {bad} outside 0..{n - 1}")
        if self.const_bytes < 0:
            raise ValueError(f"Graph: const_bytes must be >= 0, got {self.const_bytes}")

    @property
    def n(self) -> int:
        return len(self.cost)

    def users(self) -> list[list[int]]:
        """users()[i]: the nodes that read node i, ascending."""
        us: list[list[int]] = [[] for _ in range(self.n)]
        for j, d in enumerate(self.deps):
            for i in d:
                us[i].append(j)
        return us


def chain(n: int, cost: float = 1.0, size: int = 1, *, backward: bool = True) -> Graph:
    """A linear network. ``backward=False``: the bare chain f0 -> f1 -> ... (n nodes, keep the last; it
    needs only 2 sizes of memory). ``backward=True`` (default): the training graph of Chen et al. and
    Checkmate, 2n nodes: forward f0..f{n-1}, then gradients g{n-1}..g0 with g{n-1} reading f{n-1} and g{i}
    reading g{i+1} and f{i}; keep = {g0}. Without eviction it peaks at n + 1 sizes."""
    if n < 1:
        raise ValueError(f"chain: n must be >= 1, got {n}")
    deps: list[tuple[int, ...]] = [() if i == 0 else (i - 1,) for i in range(n)]
    names = [f"f{i}" for i in range(n)]
    if backward:
        for i in reversed(range(n)):  # g_i is node 2n-1-i
            deps.append((n - 1,) if i == n - 1 else (i, len(deps) - 1))
            names.append(f"g{i}")
    m = len(deps)
    return Graph((float(cost),) * m, (size,) * m, tuple(deps), frozenset({m - 1}), 0, tuple(names))


def graph_from_log(log: L.Log, max_ops: int | None = None, *, split_outputs: bool = False) -> Graph:
    """One node per CALL or MUTATE of ``log.measured``, in log order.

    A CALL's own-storage results (ALIAS -1) form one node whose size is the sum of their bytes; a view result
    (ALIAS >= 0) shares its base's storage and node. A CALL without an own-storage result (only views, or
    no result) makes no node and its time is dropped (views are metadata ops; recomputing the base does
    not rerun them). Merging ties small outputs to big ones (batch norm's saved mean to its output, a weight
    gradient to the input gradient); ``split_outputs=True`` instead makes the largest result a node (the
    op's time) and the other nonzero results a second node of cost 0 reading the op's args and the first
    node, so it is computed with the same memory and needs the op rerun; zero-byte extra results are then
    untracked (like constants of 0 bytes).

    A MUTATE is a node reading all of its args; it gives each mutated tensor a new storage of the same
    bytes (counted once per distinct storage); every name of that tensor (COPY references) sees the new
    version, other views of the old storage do not. Constants (CONSTANT lines, and whatever the log made
    before START and still names at START) are not nodes: each storage's bytes count once in
    ``const_bytes``; a name never seen counts 0.
    ``keep``: the nodes whose storage some name still references when the replay ends. With ``max_ops`` the
    replay ends just before the instruction whose node(s) would pass ``max_ops`` nodes (trailing COPY and
    RELEASE lines included), so ``keep`` is what the program still references there (activations saved for later)."""
    if max_ops is not None and max_ops < 1:
        raise ValueError(f"graph_from_log: max_ops must be >= 1 or None, got {max_ops}")
    if not isinstance(log, L.Log):
        raise ValueError(f"graph_from_log: needs a Log (from log.read or log.parse), got {type(log).__name__}")
    owner: list[int] = []  # storage id -> node (-1: constant)
    nbytes: list[int] = []
    tensor: list[int] = []  # tensor id -> current storage id
    names: dict[str, int] = {}  # name -> tensor id
    counted: set[int] = set()  # constant storages whose bytes count
    cost: list[float] = []
    size: list[int] = []
    deps: list[tuple[int, ...]] = []
    ops: list[str] = []

    def new_tensor(node: int, b: int) -> int:
        owner.append(node)
        nbytes.append(b)
        tensor.append(len(owner) - 1)
        return len(tensor) - 1

    def arg_nodes(args: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(sorted({owner[tensor[names[a]]] for a in args if a in names} - {-1}))

    for pos, ins in enumerate(log.instrs):
        measured = pos >= log.start
        if pos == log.start:
            counted.update(tensor[t] for t in names.values())
        kind = type(ins)
        if kind is L.Constant:
            names[ins.name] = new_tensor(-1, ins.nbytes)
            if measured:
                counted.add(tensor[names[ins.name]])
        elif kind is L.Call:
            own = [r for r in ins.results if r.alias < 0]
            node_of = dict.fromkeys((r.name for r in own), -1)
            if measured and own:
                groups = [own]  # merged: one node; split: the largest result, then the others
                if split_outputs:
                    big = max(own, key=lambda r: r.nbytes)
                    groups = [[big], [r for r in own if r is not big and r.nbytes]]
                groups = [g for g in groups if g]
                if max_ops is not None and len(cost) + len(groups) > max_ops:
                    break
                args = arg_nodes(ins.args)
                for g in groups:
                    node_of.update((r.name, len(cost)) for r in g)
                    deps.append(args if g is groups[0] else tuple(sorted({*args, len(cost) - 1})))
                    cost.append(float(ins.time_ns) if g is groups[0] else 0.0)
                    size.append(sum(r.nbytes for r in g))
                    ops.append(ins.name)
            for r in ins.results:
                if r.alias < 0:
                    names[r.name] = new_tensor(node_of[r.name], r.nbytes)
                elif ins.args[r.alias] in names:
                    tensor.append(tensor[names[ins.args[r.alias]]])
                    names[r.name] = len(tensor) - 1
        elif kind is L.Mutate and measured:
            node = len(cost)
            if max_ops is not None and node >= max_ops:
                break
            deps.append(arg_nodes(ins.args))
            fresh: dict[int, int] = {}  # old storage -> new storage
            for t in {names[ins.args[i]] for i in ins.mutated if ins.args[i] in names}:
                old = tensor[t]
                if old not in fresh:
                    owner.append(node)
                    nbytes.append(nbytes[old])
                    fresh[old] = len(owner) - 1
                tensor[t] = fresh[old]
            cost.append(float(ins.time_ns))
            size.append(sum(nbytes[s] for s in fresh.values()))
            ops.append(ins.name)
        elif kind is L.Copy and ins.src in names:
            names[ins.dst] = names[ins.src]
        elif kind is L.Release:
            names.pop(ins.name, None)
    if log.start >= len(log.instrs):
        counted.update(tensor[t] for t in names.values())
    keep = frozenset(owner[tensor[t]] for t in names.values()) - {-1}
    return Graph(tuple(cost), tuple(size), tuple(deps), keep, sum(nbytes[s] for s in counted), tuple(ops))


# ------------------------------------------------------------------------------------------- checking
def simulate_schedule(graph: Graph, R: np.ndarray, S: np.ndarray, In: np.ndarray | None = None,
                      Out: np.ndarray | None = None) -> int:
    """Replay a schedule under the memory rule; return its peak bytes (``const_bytes`` included).

    ``R``: (n, n) booleans, ``R[t, i]`` = compute node i in stage t; ``S``: (n+1, n), ``S[t, i]`` = node i is
    resident entering stage t; optional ``In``/``Out``: (n, n), copy node i back at the start of stage t / out
    during stage t (offload). Raises ``ScheduleError`` if a stage does not compute its own node, computes a
    later one, reads a value that is not resident, checkpoints a value it does not hold, copies back a value
    with no copy or out a value it does not hold, or ends without a keep node. Independent of the MILP: it
    frees each value after its last use in the stage (a value held only to be copied out, at the stage's
    start)."""
    n = graph.n
    R, S = np.asarray(R, dtype=bool), np.asarray(S, dtype=bool)
    if R.shape != (n, n) or S.shape != (n + 1, n):
        raise ValueError(f"simulate_schedule: R must be ({n}, {n}) and S ({n + 1}, {n}); got {R.shape}, {S.shape}")
    In = np.zeros((n, n), dtype=bool) if In is None else np.asarray(In, dtype=bool)
    Out = np.zeros((n, n), dtype=bool) if Out is None else np.asarray(Out, dtype=bool)
    if In.shape != (n, n) or Out.shape != (n, n):
        raise ValueError(f"simulate_schedule: In and Out must be ({n}, {n}); got {In.shape}, {Out.shape}")
    if S[0].any():
        raise ScheduleError(f"stage 0 starts with nodes {np.flatnonzero(S[0]).tolist()} resident; nothing exists yet")
    peak = graph.const_bytes
    host: set[int] = set()  # nodes with a copy in host memory
    for t in range(n):
        bad = [int(i) for i in np.flatnonzero(In[t]) if i not in host or S[t, i]]
        if bad:
            raise ScheduleError(f"stage {t} copies back nodes {bad} that have no copy (or are held already)")
        held = S[t] | In[t]
        if not R[t, t] or R[t, t + 1:].any():
            raise ScheduleError(f"stage {t} must compute node {t} and nothing later; it computes "
                                f"{np.flatnonzero(R[t]).tolist()}")
        last = {}  # value -> last event in this stage that reads it
        for k in np.flatnonzero(R[t]):
            for i in graph.deps[k]:
                last[i] = k
        nxt = S[t + 1]
        live = {int(i) for i in np.flatnonzero(held) if i in last or nxt[i]}
        mem = graph.const_bytes + sum(graph.size[i] for i in live)
        outs = [int(i) for i in np.flatnonzero(Out[t])]
        bad = [i for i in outs if not (held[i] or R[t, i])]
        if bad:
            raise ScheduleError(f"stage {t} copies out nodes {bad} that it neither holds nor computes")
        peak = max(peak, mem + sum(graph.size[i] for i in outs if held[i] and i not in live))  # copied, then freed
        host.update(outs)
        for k in map(int, np.flatnonzero(R[t])):
            missing = [i for i in graph.deps[k] if i not in live]
            if missing:
                raise ScheduleError(f"stage {t} computes node {k} but its inputs {missing} are not resident")
            if k not in live:
                live.add(k)
                mem += graph.size[k]
            peak = max(peak, mem)
            for i in (*graph.deps[k], k):
                if i in live and last.get(i, -1) <= k and not nxt[i]:
                    live.discard(i)
                    mem -= graph.size[i]
        lost = [int(i) for i in np.flatnonzero(nxt) if i not in live]
        if lost:
            raise ScheduleError(f"stage {t} checkpoints nodes {lost} into stage {t + 1} but does not hold them")
    lost = sorted(k for k in graph.keep if not S[n, k])
    if lost:
        raise ScheduleError(f"keep nodes {lost} are not resident at the end")
    return peak


def _checkpoint_all(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The no-eviction schedule: compute each node once, hold it until its last use (or the end if kept)."""
    n, us = graph.n, graph.users()
    end = [n if i in graph.keep else (us[i][-1] if us[i] else i) for i in range(n)]
    R, S = np.eye(n, dtype=bool), np.zeros((n + 1, n), dtype=bool)
    for i in range(n):
        S[i + 1 : end[i] + 1, i] = True
    return R, S


def peak_bytes(graph: Graph) -> int:
    """Peak memory (constants included) of running the graph once without eviction, under the memory rule."""
    return simulate_schedule(graph, *_checkpoint_all(graph)) if graph.n else graph.const_bytes


def min_budget(graph: Graph) -> int:
    """A lower bound on any feasible budget: computing node k needs its inputs and output at once, and the
    last computation also holds every keep node."""
    need = [graph.size[k] + sum(graph.size[i] for i in graph.deps[k]) for k in range(graph.n)]
    if graph.n:
        last = graph.keep | set(graph.deps[-1]) | {graph.n - 1}
        need.append(sum(graph.size[i] for i in last))
    return graph.const_bytes + max(need, default=0)


# -------------------------------------------------------------------------------------------- solving
@dataclass(frozen=True)
class Solution:
    """``status``: "optimal", "feasible" (time limit hit with an incumbent), "infeasible", "timeout" (no
    incumbent) or "lp" (relaxation). ``compute``: ns of the schedule (sum of R * cost; the LP objective for
    "lp"; inf without a schedule); ``overhead`` = compute / base; ``lower_bound``: the solver's dual bound as
    an overhead; ``gap``: relative MIP gap. ``R``/``S``/``peak``: the schedule and its replayed peak bytes."""

    status: str
    compute: float
    base: float
    overhead: float
    lower_bound: float
    gap: float
    seconds: float
    budget: int
    peak: int | None = None
    R: np.ndarray | None = field(default=None, repr=False, compare=False)
    S: np.ndarray | None = field(default=None, repr=False, compare=False)
    In: np.ndarray | None = field(default=None, repr=False, compare=False)  # offload: copies back, copies out
    Out: np.ndarray | None = field(default=None, repr=False, compare=False)
    copy: float = 0.0  # ns of copies in ``compute``


DIRECT_MAX_NODES = 200  # up to here each event's memory is one row (~n^3/3 nonzeros); beyond, a running sum


def _model(graph: Graph, budget: int, offload: tuple[list[float], list[float]] | None = None) -> tuple:
    """The MILP as ``milp`` arguments, the integrality, the columns of R, S, In and Out, and the cost scale.
    Columns: R, S (binary), P ("still needed", continuous), for graphs over ``DIRECT_MAX_NODES`` U (memory);
    with ``offload`` (ns per copy back and out, per node) In, Out and H (a copy exists entering stage t)."""
    n, direct = graph.n, graph.n <= DIRECT_MAX_NODES
    if offload is not None and not direct:
        raise ValueError(f"solve: offload is modelled up to {DIRECT_MAX_NODES} nodes; this graph has {n}")
    chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    cscale = max(max(graph.cost), 1e-12)
    mscale = float(max(max(graph.size), 1))
    size = [s / mscale for s in graph.size]
    us, keep = graph.users(), graph.keep
    reach = [n if i in keep else i for i in range(n)]  # last stage in which node i can matter
    for i in reversed(range(n)):
        reach[i] = max([reach[i], *(reach[j] for j in us[i])])
    lb, ub, integer = [], [], []  # column bounds and integrality

    def add(lo: float, hi: float, is_int: bool) -> int:
        lb.append(lo)
        ub.append(hi)
        integer.append(int(is_int))
        return len(lb) - 1

    Ri = [[add(1.0 if i == t else 0.0, 1.0 if i == t or reach[i] >= t else 0.0, True) for i in range(t + 1)]
          for t in range(n)]
    Si = [[add(1.0 if t == n and i in keep else 0.0, 1.0 if reach[i] >= t else 0.0, True) for i in range(t)]
          for t in range(n + 1)]
    Ii: list[list[int]] = [[] for _ in range(n)]
    Oi: list[list[int]] = [[] for _ in range(n)]
    Hi: list[list[int]] = [[] for _ in range(n)]
    if offload is not None:
        Ii = [[add(0.0, 1.0 if reach[i] >= t else 0.0, True) for i in range(t)] for t in range(n)]
        Oi = [[add(0.0, 1.0 if reach[i] > t else 0.0, True) for i in range(t + 1)] for t in range(n)]
        Hi = [[add(0.0, 1.0, True) for i in range(t)] for t in range(n)]
    rows, cols, vals, rlo, rhi = [], [], [], [], []  # the constraint matrix (COO) and row bounds

    def row(terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(rlo)
        for c, a in terms:
            rows.append(r)
            cols.append(c)
            vals.append(a)
        rlo.append(lo)
        rhi.append(hi)

    cap = (budget - graph.const_bytes) / mscale
    for t in range(n):
        R, S, Sn, In = Ri[t], Si[t], Si[t + 1], Ii[t]
        for i in range(t + 1):  # correctness: computing i needs each dep computed earlier, held or copied back
            for j in graph.deps[i]:
                row([(R[i], 1.0), (R[j], -1.0), (S[j], -1.0), *([(In[j], -1.0)] if In else ())], -math.inf, 0.0)
        for i in range(t):  # a checkpoint into stage t+1 must be held, copied back or computed in stage t
            row([(Sn[i], 1.0), (R[i], -1.0), (S[i], -1.0), *([(In[i], -1.0)] if In else ())], -math.inf, 0.0)
        if offload is not None:
            Out, H = Oi[t], Hi[t]
            for i in range(t):
                row([(In[i], 1.0), (H[i], -1.0)], -math.inf, 0.0)  # a copy back needs a copy
                row([(S[i], 1.0), (In[i], 1.0)], -math.inf, 1.0)  # held or copied back, not both
                row([(Out[i], 1.0), (R[i], -1.0), (S[i], -1.0), (In[i], -1.0)], -math.inf, 0.0)  # out: resident
            if t + 1 < n:  # a copy exists entering stage t+1 if it existed or stage t made it
                Hn = Hi[t + 1]
                for i in range(t):
                    row([(Hn[i], 1.0), (H[i], -1.0), (Out[i], -1.0)], -math.inf, 0.0)
                row([(Hn[t], 1.0), (Out[t], -1.0)], -math.inf, 0.0)
        need: list[list[int]] = []  # need[i][a]: i is still needed at its a-th user in stage t (or later)
        for i in range(t + 1):
            users = us[i][: bisect.bisect_right(us[i], t)]
            P = [add(0.0, 1.0, False) for _ in users]
            for a, j in enumerate(users):  # P[a] >= R[user a], P[a] >= P[a+1], last P >= S[t+1, i]
                row([(R[j], 1.0), (P[a], -1.0)], -math.inf, 0.0)
                row([(P[a + 1] if a + 1 < len(P) else Sn[i], 1.0), (P[a], -1.0)], -math.inf, 0.0)
            need.append([*P, Sn[i]])

        def needed_at(i: int, k: int, need: list[list[int]] = need) -> int:  # "value i < k still needed at k"
            return need[i][bisect.bisect_left(us[i], k, hi=len(need[i]) - 1)]

        if direct:  # one row per event over every value: O(t^2) nonzeros, but HiGHS solves it far faster
            r0 = len(rlo)
            for i in range(t + 1):
                ks = np.arange(i + 1, t + 1)  # events after i: "still needed" (a P, or S[t+1, i])
                a = np.searchsorted(us[i][: len(need[i]) - 1], ks)
                chunks.append((r0 + ks, np.asarray(need[i])[a], np.full(len(ks), size[i])))
                if 0 < i < t:  # events before i: held from an earlier stage (or copied back)
                    chunks.append((r0 + np.arange(i), np.full(i, S[i]), np.full(i, size[i])))
                    if In:
                        chunks.append((r0 + np.arange(i), np.full(i, In[i]), np.full(i, size[i])))
            chunks.append((r0 + np.arange(t + 1), np.asarray(R), np.asarray(size[: t + 1])))
            rlo.extend([-math.inf] * (t + 1))
            rhi.extend([cap] * (t + 1))
            continue
        # U[k] = memory at event k as a running sum, one equality per event: O(t + edges) nonzeros
        U = [add(-math.inf, cap, False) for _ in range(t + 1)]
        row([(U[0], 1.0), (R[0], -size[0])] + [(S[i], -size[i]) for i in range(1, t)], 0.0, 0.0)
        for k in range(1, t + 1):
            terms = [(U[k], 1.0), (U[k - 1], -1.0), (needed_at(k - 1, k), -size[k - 1]), (R[k - 1], size[k - 1]),
                     (R[k], -size[k])]
            if k < t:
                terms.append((S[k], size[k]))
            for i in graph.deps[k - 1]:
                terms += [(needed_at(i, k), -size[i]), (needed_at(i, k - 1), size[i])]
            row(terms, 0.0, 0.0)
    nv = len(lb)
    c = np.zeros(nv)
    for t in range(n):
        c[Ri[t]] = np.asarray(graph.cost[: t + 1]) / cscale
        if offload is not None:
            c[Ii[t]] = np.asarray(offload[0][:t]) / cscale
            c[Oi[t]] = np.asarray(offload[1][: t + 1]) / cscale
    rows_, cols_, vals_ = (np.concatenate([np.asarray(x, dtype=float if j == 2 else np.int64), *(c[j] for c in chunks)])
                           for j, x in enumerate((rows, cols, vals)))
    A = coo_matrix((vals_, (rows_, cols_)), shape=(len(rlo), nv)).tocsr()
    return ({"c": c, "bounds": Bounds(lb, ub), "constraints": LinearConstraint(A, rlo, rhi)}, np.asarray(integer),
            Ri, Si, Ii, Oi, cscale)


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0, relax: bool = False,
          gap: float | None = None, swap_gbps: float | None = None, swap_out_free: bool = False) -> Solution:
    """Minimize total compute (sum of R[t,i] * cost[i]) under ``budget_bytes`` (constants included) with
    ``scipy.optimize.milp`` (HiGHS). ``relax=True`` solves the LP relaxation, a lower bound on the optimum.
    ``gap``: stop at this relative MIP gap (1.0: at the first schedule found, for feasibility questions).
    ``swap_gbps``: values may also be copied to host memory and back at this bandwidth (GB/s = bytes/ns), the
    copies' time added to ``compute`` (copies out free with ``swap_out_free``)."""
    if not isinstance(graph, Graph) or graph.n == 0:
        raise ValueError(f"solve: needs a Graph with at least one node, got {graph!r}")
    if not (isinstance(budget_bytes, numbers.Real) and math.isfinite(budget_bytes)) or budget_bytes < 0:
        raise ValueError(f"solve: budget_bytes must be a finite number of bytes >= 0, got {budget_bytes!r}")
    if not (isinstance(time_limit, numbers.Real) and time_limit > 0 and math.isfinite(time_limit)):
        raise ValueError(f"solve: time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    if swap_gbps is not None and not (isinstance(swap_gbps, numbers.Real) and swap_gbps > 0):
        raise ValueError(f"solve: swap_gbps must be a bandwidth in GB/s > 0, got {swap_gbps!r}")
    t0, n, budget = time.perf_counter(), graph.n, int(budget_bytes)
    base = float(sum(graph.cost))

    def result(status: str, compute: float = math.inf, bound: float = math.inf, gap: float = math.nan,
               R=None, S=None, In=None, Out=None, copy: float = 0.0) -> Solution:
        over = (compute / base if base else (1.0 if compute == 0 else math.inf))
        lower = (bound / base if base else (1.0 if bound == 0 else math.inf))
        peak = simulate_schedule(graph, R, S, In, Out) if R is not None else None
        if peak is not None and peak > budget:  # only HiGHS's feasibility tolerance could do this
            raise RuntimeError(f"solve: the schedule HiGHS returned peaks at {peak} bytes, over the budget of "
                               f"{budget}; retry with a budget a few bytes lower")
        return Solution(status, compute, base, over, lower, gap, time.perf_counter() - t0, budget, peak, R, S, In,
                        Out, copy)

    if budget < min_budget(graph):
        return result("infeasible")
    offload = None
    if swap_gbps is not None:
        cin = [s / swap_gbps for s in graph.size]
        offload = (cin, [0.0] * n if swap_out_free else cin)
    args, integer, Ri, Si, Ii, Oi, cscale = _model(graph, budget, offload)
    options = {"time_limit": float(time_limit), "disp": False}
    if gap is not None:
        options["mip_rel_gap"] = float(gap)
    res = milp(**args, integrality=0 * integer if relax else integer, options=options)
    if res.status == 2:
        return result("infeasible")
    if res.x is None:
        if res.status == 1:
            bound = getattr(res, "mip_dual_bound", None)
            return result("timeout", bound=bound * cscale if bound is not None else 0.0)
        raise RuntimeError(f"solve: HiGHS returned status {res.status}: {res.message}")
    if relax:
        return result("lp", compute=res.fun * cscale, bound=res.fun * cscale, gap=0.0)
    Rm, Sm = np.zeros((n, n), dtype=bool), np.zeros((n + 1, n), dtype=bool)
    for t, cols in enumerate(Ri):
        Rm[t, : t + 1] = res.x[cols] > 0.5
    for t, cols in enumerate(Si):
        Sm[t, :t] = res.x[cols] > 0.5
    compute = float(sum(graph.cost[i] for t, i in zip(*np.nonzero(Rm), strict=True)))
    Im = Om = None
    copy = 0.0
    if offload is not None:
        Im, Om = np.zeros((n, n), dtype=bool), np.zeros((n, n), dtype=bool)
        for t in range(n):
            Im[t, :t] = res.x[Ii[t]] > 0.5
            Om[t, : t + 1] = res.x[Oi[t]] > 0.5
        copy = float(sum(offload[0][i] for _, i in zip(*np.nonzero(Im), strict=True))
                     + sum(offload[1][i] for _, i in zip(*np.nonzero(Om), strict=True)))
        compute += copy
    bound = res.mip_dual_bound * cscale if res.mip_dual_bound is not None else compute
    return result("optimal" if res.status == 0 else "feasible", compute, min(bound, compute),
                  float(res.mip_gap or 0.0), Rm, Sm, Im, Om, copy)


def smallest_budget(graph: Graph, *, time_limit: float = 30.0, tolerance: int = 0,
                    max_overhead: float | None = None) -> tuple[int, bool]:
    """The smallest budget (bytes, constants included) at which a schedule exists, by bisection between
    ``min_budget`` (never enough minus one) and ``peak_bytes`` (always enough); feasibility is monotone in the
    budget. ``max_overhead``: only schedules computing at most that multiple of one pass count (each probe
    then solves for the optimum; without it, a probe stops at the first schedule HiGHS finds). Returns
    ``(budget, exact)``: the budget is within ``tolerance`` bytes above the smallest, and ``exact`` is False
    when a probe hit ``time_limit`` undecided (counted as infeasible: the budget is then only where a
    schedule was found, an upper bound)."""
    if not isinstance(tolerance, int) or tolerance < 0:
        raise ValueError(f"smallest_budget: tolerance must be an int >= 0 (bytes), got {tolerance!r}")
    if max_overhead is not None and not max_overhead >= 1:
        raise ValueError(f"smallest_budget: max_overhead must be >= 1 (a multiple of one pass), got {max_overhead!r}")
    lo, hi, exact = min_budget(graph) - 1, peak_bytes(graph), True
    while hi - lo > max(1, tolerance):
        mid = (lo + hi) // 2
        sol = solve(graph, mid, time_limit=time_limit, gap=1.0 if max_overhead is None else None)
        found = sol.status in ("optimal", "feasible")
        if found and (max_overhead is None or sol.overhead <= max_overhead * (1 + 1e-9)):
            hi = mid
            continue
        decided = sol.status in ("infeasible", "optimal") or (
            max_overhead is not None and sol.lower_bound > max_overhead * (1 + 1e-9))
        exact = exact and decided
        lo = mid
    return hi, exact
