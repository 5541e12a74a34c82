"""Plans: a strategy for every op and a placement for every constant of a traced iteration; what a plan costs;
the fixed strategies users choose by hand; and the planner that searches between them. No torch.

# NOTE [ Partition plans ]
#
# 1. A plan fixes each op's strategy (NOTE [ Partition strategies ]) and each constant's placement; every
#    other tensor's placement follows from the op that makes it. Step time per device = the ops' time
#    times their strategies' shares + the collectives of the conversions (NOTE [ Placements ] 3, 4) +
#    batch norm's all-reduces. Memory per device: the storages under their placements plus the converted
#    copies, swept over the iteration as the log frees them; without eviction (``Cost.peak``).
# 2. ``propagate`` turns constant placements into a plan: op by op, in program order, the strategy with
#    the least time given its inputs' placements so far (conversions included), each byte of its outputs
#    per device weighing as much as a byte sent over the link (memory is what partitioning is for). A
#    constant without a placement takes the one its first reader's strategy asks for, and passes it to the
#    optimizer states of its group (``groups``).
# 3. Fixed strategies: data parallel (the batch, constants that are neither written nor read as weights,
#    sharded on dimension 0; the state, parameters and optimizer states, replicated), fully sharded (the
#    same, with every parameter group sharded on dimension 0: gathered where an op reads it whole,
#    gradients reduce-scattered; buffers that their own op writes, batch norm's statistics, stay R) and
#    tensor parallel (the batch replicated; the 2-D parameters that matrix products read, in order of
#    first use, alternately column- and row-parallel as in Megatron; the rest placed by their first
#    reader). A fixed plan's ops take the least time alone and never slice a replicated tensor (the work
#    splits where the batch or a weight is sharded, as users set it up).
# 4. ``Planner.search`` (the heuristic that scales): from the best fixed plan, coordinate descent over the
#    placement of each constant group (the batch and each parameter group: R or sharded on any dimension D
#    divides), each candidate propagated and costed, keeping a change when the objective falls; the
#    objective is the step time while the peak fits the budget, plus a penalty per byte over it
#    (``objective``; the simulator replays the best plans through the DTR runtime at the budget).
#    Then three rounds of look-ahead: propagate again, each output paying its conversion to the placement
#    its readers wanted in the last plan (``hints``).
# 5. Then ``refine``: one op at a time, the strategy whose local change (its time share, its inputs'
#    conversions, its outputs' readers' conversions) shortens the step most, never growing its outputs'
#    bytes per device; kept only if the whole plan's objective falls.
# 6. ``settle`` (every plan ends with it): a partial output whose readers, through views that keep it
#    partial, all want one placement is reduced right after the op that makes it, and the views re-placed
#    to match; the partial storage is freed at once (as DDP's and FSDP's gradient hooks reduce a gradient as
#    soon as it is complete), where a reader-side conversion would hold it until its last name is dropped
#    (a gradient: the end of the step). The collective is the same one, so the step time is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .graph import ANY, Graph, Link, P, Place, R
from .rules import POINTWISE, Strategy, base, strategies


@dataclass(frozen=True)
class Plan:
    choice: tuple[int, ...]  # per node: the index of its strategy in ``Planner.strats[k]``
    consts: dict[int, Place] = field(default_factory=dict)  # constant -> placement
    name: str = ""
    reduce: dict[int, Place] = field(default_factory=dict)  # partial output -> its placement once reduced (rule 6)


@dataclass(frozen=True)
class Cost:
    compute: float  # seconds per device
    comm: float  # seconds of collectives per device
    collectives: int
    comm_bytes: int  # bytes converted (whole tensors)
    peak: int  # bytes per device, no eviction

    @property
    def time(self) -> float:
        return self.compute + self.comm


class Planner:
    """Strategies and costs of one graph on one ``Link``."""

    def __init__(self, graph: Graph, link: Link) -> None:
        self.graph, self.link = graph, link
        ts = graph.tensors
        self.strats: list[list[Strategy]] = [
            strategies(n.name, [ts[i].shape for i in n.ins], [ts[o].shape for o in n.outs], n.views, link.devices)
            for n in graph.nodes]
        self.groups = _groups(graph)
        self.readers: dict[int, list[tuple[int, int]]] = {}  # tensor -> (node, input index)
        for k, n in enumerate(graph.nodes):
            for i, t in enumerate(n.ins):
                self.readers.setdefault(t, []).append((k, i))

    # ------------------------------------------------------------------ cost
    def placements(self, plan: Plan) -> list[Place]:
        place = [R] * len(self.graph.tensors)
        for t, p in plan.consts.items():
            place[t] = p
        for n, ss, c in zip(self.graph.nodes, self.strats, plan.choice, strict=True):
            for o, p in zip(n.outs, ss[c].outs, strict=True):
                place[o] = plan.reduce.get(o, p)
        return place

    def conversions(self, plan: Plan) -> tuple[list[Place], list[list[tuple[int, Place, tuple[int, int, Place]]]],
                                              dict[tuple[int, int, Place], int]]:
        """Placements, per node the collectives its inputs need ((tensor, wanted placement, copy key)),
        and each copy's last reader (NOTE [ Placements ] 4)."""
        ts, link = self.graph.tensors, self.link
        place = [R] * len(ts)
        for t, p in plan.consts.items():
            place[t] = p
        version: dict[int, int] = {}
        needs: list[list[tuple[int, Place, tuple[int, int, Place]]]] = []
        last: dict[tuple[int, int, Place], int] = {}
        for k, (n, ss, c) in enumerate(zip(self.graph.nodes, self.strats, plan.choice, strict=True)):
            s = ss[c]
            mine = []
            for i, t in enumerate(n.ins):
                want = s.ins[i]
                if want == ANY or not link.kind(place[t], want):
                    continue
                key = (t, version.get(ts[t].base, 0), want)
                mine.append((t, want, key))
                if i not in n.writes:
                    last[key] = k
            needs.append(mine)
            for o, p in zip(n.outs, s.outs, strict=True):
                place[o] = plan.reduce.get(o, p)
            for i in n.writes:
                b = ts[n.ins[i]].base
                version[b] = version.get(b, 0) + 1
        return place, needs, last

    def cost(self, plan: Plan) -> Cost:
        ts, link, nodes = self.graph.tensors, self.link, self.graph.nodes
        place, needs, last = self.conversions(plan)
        # placements as they were when each node ran: replay forward (a tensor's placement never changes)
        compute = comm = 0.0
        count = nbytes = 0
        cur = peak = 0
        live: dict[tuple[int, int, Place], int] = {}
        ends: dict[int, list[tuple[int, int, Place]]] = {}
        for key, k in last.items():
            ends.setdefault(k, []).append(key)
        for k, n in enumerate(nodes):
            s = self.strats[k][plan.choice[k]]
            compute += n.time * s.frac
            if s.sync:
                comm += link.cost(P, R, s.sync)
                count += 1
            for t in n.news:
                cur += link.per_device(ts[t], place[t])
            for t, want, key in needs[k]:
                if key in live:
                    continue
                tt = ts[t]
                c = link.cost(place[t], want, tt.nbytes)
                if key not in last:  # a written input: converted there and back, no copy kept
                    c += link.cost(want, place[t], tt.nbytes)
                else:
                    live[key] = link.per_device(tt, want)
                    cur += live[key]
                comm += c
                count += 1
                nbytes += tt.nbytes
            for o, v in zip(n.outs, n.views, strict=True):
                if v < 0:
                    q = plan.reduce.get(o)
                    if q is None:
                        cur += link.per_device(ts[o], place[o])
                        continue
                    full = link.per_device(ts[o], P)  # made partial, reduced at once (rule 6)
                    peak = max(peak, cur + full + link.per_device(ts[o], q))
                    cur += link.per_device(ts[o], q)
                    comm += link.cost(P, q, ts[o].nbytes)
                    count += 1
                    nbytes += ts[o].nbytes
            peak = max(peak, cur)
            for key in ends.get(k, ()):
                cur -= live.pop(key, 0)
            for t in n.frees:
                cur -= link.per_device(ts[t], place[t])
        return Cost(compute, comm, count, nbytes, peak)

    # ------------------------------------------------------------------ plans
    def propagate(self, consts: dict[int, Place | None], name: str = "", hints: dict[int, Place] | None = None,
                  slices: bool = True, held: float = 1.0) -> Plan:
        """NOTE [ Partition plans ] 2: the least-time strategy op by op, given the constants' placements; with
        ``hints`` (tensor -> the placement its readers want), a strategy also pays the conversion of each
        output to its hint. Without ``slices``, no op shards a replicated tensor it reads (tensor parallel:
        the work splits only where a parameter is sharded). ``held``: what a byte of output per device weighs,
        in bytes sent (0: least time alone)."""
        ts, link, nodes = self.graph.tensors, self.link, self.graph.nodes
        place: list[Place | None] = [None] * len(ts)
        fixed: dict[int, Place] = {}
        for t, p in consts.items():
            if p is not None:
                place[t] = fixed[t] = p
        choice: list[int] = []
        pending: dict[int, tuple[int, int, int]] = {}  # view of an unplaced constant -> (node, input, output)

        def settle(t: int, p: Place) -> None:
            """Place ``t`` (an unplaced constant, or a view of one: its view op's strategy is chosen now)."""
            if t in pending:
                k, i, j = pending.pop(t)
                ss = self.strats[k]
                c = next((c for c, s in enumerate(ss) if s.outs[j] == p), 0)
                choice[k] = c
                settle(nodes[k].ins[i], ss[c].ins[i] if ss[c].ins[i] != ANY else R)
                for o, q in zip(nodes[k].outs, ss[c].outs, strict=True):
                    place[o] = q
                    pending.pop(o, None)
            elif place[t] is None:
                for u in self.groups.get(t, (t,)):
                    if place[u] is None:
                        place[u] = fixed[u] = p

        for k, n in enumerate(nodes):
            ss = self.strats[k]
            if n.outs and all(v >= 0 for v in n.views) and len(ss) > 1 and place[n.ins[n.views[0]]] is None:
                choice.append(0)  # a view of a constant not placed yet: its reader decides
                for j, o in enumerate(n.outs):
                    pending[o] = (k, n.views[0], j)
                continue
            best, best_key = 0, (float("inf"), 0)
            for j, s in enumerate(ss):
                t_cost = n.time * s.frac
                ok = True
                for i, t in enumerate(n.ins):
                    have, want = place[t], s.ins[i]
                    if have is None or want == ANY:
                        continue
                    if (i in n.writes and want != have) or (not slices and have == R and want >= 0):
                        ok = False
                        break
                    t_cost += link.cost(have, want, ts[t].nbytes)
                if not ok:
                    continue
                if hints:
                    for o, p in zip(n.outs, s.outs, strict=True):
                        h = hints.get(o)
                        if h is not None:
                            t_cost += link.cost(p, h, ts[o].nbytes)
                mem = sum(link.per_device(ts[o], p) for o, p in zip(n.outs, s.outs, strict=True))
                key = (t_cost + held * mem / link.bw, mem)
                if key < best_key:
                    best, best_key = j, key
            s = ss[best]
            choice.append(best)
            for i, t in enumerate(n.ins):
                if place[t] is None:  # a constant's first reader places it, and its group with it
                    settle(t, s.ins[i] if s.ins[i] != ANY else R)
            for o, p in zip(n.outs, s.outs, strict=True):
                place[o] = p
        for t in list(pending):  # views nobody read
            if t in pending:
                settle(t, R)
        return self.settle(Plan(tuple(choice), fixed, name))

    def settle(self, plan: Plan) -> Plan:
        """NOTE [ Partition plans ] 6: each partial output that every reader (through views that keep it
        partial) wants in one placement is reduced right after the op that makes it."""
        ts, nodes, link = self.graph.tensors, self.graph.nodes, self.link
        readers = self.readers
        choice = list(plan.choice)
        reduce: dict[int, Place] = {}
        for k, n in enumerate(nodes):
            s = self.strats[k][choice[k]]
            for j, o in enumerate(n.outs):
                if s.outs[j] != P or n.views[j] >= 0:
                    continue
                chain: set[int] = set()
                finals: set[tuple[int, Place]] = set()
                ok, stack = True, [o]
                while stack and ok:
                    t = stack.pop()
                    for k2, i2 in readers.get(t, ()):
                        n2, s2 = nodes[k2], self.strats[k2][choice[k2]]
                        w = s2.ins[i2]
                        if (n2.outs and all(v == i2 for v in n2.views) and w == P and all(p == P for p in s2.outs)
                                and all(ts[x].nbytes == ts[o].nbytes for x in n2.outs)):
                            chain.add(k2)
                            stack.extend(n2.outs)
                        elif i2 in n2.writes or w in (P, ANY):
                            ok = False
                            break
                        else:
                            finals.add((t, w))
                if not ok or not finals:
                    continue
                shape = ts[o].shape
                for q in [R] + [d for d, m in enumerate(shape) if m > 1 and m % link.devices == 0]:
                    got: dict[int, Place] = {o: q}
                    picks: dict[int, int] = {}
                    for k2 in sorted(chain):
                        n2 = nodes[k2]
                        pin = got.get(n2.ins[n2.views[0]])
                        c2 = next((c for c, s2 in enumerate(self.strats[k2]) if s2.ins[n2.views[0]] == pin), None)
                        if c2 is None:
                            break
                        picks[k2] = c2
                        for x, p2 in zip(n2.outs, self.strats[k2][c2].outs, strict=True):
                            got[x] = p2
                    else:
                        if all(got.get(t) == w for t, w in finals):
                            for k2, c2 in picks.items():
                                choice[k2] = c2
                            reduce[o] = q
                            break
        return Plan(tuple(choice), plan.consts, plan.name, reduce)

    def data(self) -> list[int]:
        return [i for i, t in enumerate(self.graph.tensors) if t.const and not t.state and t.base == i]

    def state_groups(self) -> list[tuple[int, ...]]:
        seen: set[int] = set()
        res = []
        for i, t in enumerate(self.graph.tensors):
            if t.const and t.state and t.base == i and i not in seen:
                g = self.groups.get(i, (i,))
                seen.update(g)
                res.append(g)
        return res

    def _sharded0(self, t: int) -> Place:
        s = self.graph.tensors[t].shape
        d = self.link.devices
        return 0 if d > 1 and s and s[0] > 1 and s[0] % d == 0 else R

    def fixed(self, kind: str) -> Plan:
        """NOTE [ Partition plans ] 3: ``dp``, ``fsdp`` or ``tp``."""
        consts: dict[int, Place | None] = {}
        for t in self.data():
            consts[t] = R if kind == "tp" else self._sharded0(t)
        if kind not in ("dp", "fsdp", "tp"):
            raise ValueError(f"torch_dtr: unknown partition strategy {kind!r}; expected dp, fsdp or tp")
        ts = self.graph.tensors
        for g in self.state_groups():
            # a buffer that its own op writes (batch norm's statistics) is never sharded by hand
            buffer = len(g) == 1 and ts[g[0]].written
            for t in g:
                consts[t] = R if kind == "dp" or buffer else self._sharded0(g[0]) if kind == "fsdp" else None
        if kind == "tp" and self.link.devices > 1:  # Megatron's pairs: column-, then row-parallel
            for n, (w, transposed) in enumerate(self.matmul_weights()):
                col = n % 2 == 0
                d = (0 if transposed else 1) if col else (1 if transposed else 0)
                if self.graph.tensors[w].shape[d] % self.link.devices == 0:
                    for t in self.groups.get(w, (w,)):
                        consts[t] = d
        return self.propagate(consts, kind, slices=False, held=0.0)

    def matmul_weights(self) -> list[tuple[int, bool]]:
        """2-D written constants read as a matrix product's right operand, in order of first use, and whether
        they are read transposed (through an odd number of transposes)."""
        ts, nodes = self.graph.tensors, self.graph.nodes
        src: dict[int, tuple[int, bool]] = {}  # view -> (its constant, transposed)
        for i, t in enumerate(ts):
            if t.const and t.state and t.base == i and len(t.shape) == 2:
                src[i] = (i, False)
        seen: dict[int, bool] = {}
        for n in nodes:
            b = base(n.name)
            if n.outs and all(v >= 0 for v in n.views):
                for o, v in zip(n.outs, n.views, strict=True):
                    if n.ins[v] in src and len(ts[o].shape) == 2:
                        c, tr = src[n.ins[v]]
                        src[o] = (c, tr ^ (b in ("t", "transpose", "permute")))
            elif b in ("mm", "addmm"):
                w = n.ins[-1]
                if w in src and src[w][0] not in seen:
                    seen[src[w][0]] = src[w][1]
        return list(seen.items())

    def objective(self, budget: int | None) -> Callable[[Cost], float]:
        def f(c: Cost) -> float:
            over = 0 if budget is None else max(0, c.peak - budget)
            return c.time * (1.0 + 4.0 * over / budget) if budget else c.time

        return f

    def search(self, budget: int | None, start: Plan | None = None, passes: int = 2,
               objective: Callable[[Cost], float] | None = None) -> Plan:
        """NOTE [ Partition plans ] 4: the best fixed plan improved by moving one constant group at a time."""
        obj = objective or self.objective(budget)
        fixed = [self.fixed(k) for k in ("dp", "fsdp", "tp")]
        plan = start or min(fixed, key=lambda p: obj(self.cost(p)))
        best = obj(self.cost(plan))
        consts: dict[int, Place | None] = dict(plan.consts)
        units = [(t,) for t in self.data()] + self.state_groups()
        for _ in range(passes):
            moved = False
            for g in units:
                shape = self.graph.tensors[g[0]].shape
                opts: list[Place] = [R] + [d for d, s in enumerate(shape) if s > 1 and s % self.link.devices == 0]
                now = consts.get(g[0])
                for p in opts:
                    if p == now:
                        continue
                    trial = dict(consts)
                    for t in g:
                        trial[t] = p
                    cand = self.propagate(trial, "dtp")
                    v = obj(self.cost(cand))
                    if v < best - 1e-12:
                        best, plan, consts, now, moved = v, cand, trial, p, True
            if not moved:
                break
        for _ in range(3):  # look ahead: each output pays its conversion to what its readers wanted last time
            cand = self.propagate(dict(plan.consts), "dtp", self.hints(plan))
            v = obj(self.cost(cand))
            if v >= best - 1e-12:
                break
            best, plan = v, cand
        refined = self.refine(plan)
        if obj(self.cost(refined)) < best:
            plan = refined
        return Plan(plan.choice, plan.consts, "dtp", plan.reduce)

    def hints(self, plan: Plan) -> dict[int, Place]:
        """Tensor -> the placement its first reader that asks for one wants under ``plan``."""
        res: dict[int, Place] = {}
        for n, ss, c in zip(self.graph.nodes, self.strats, plan.choice, strict=True):
            for t, w in zip(n.ins, ss[c].ins, strict=True):
                if w != ANY and t not in res:
                    res[t] = w
        return res

    def refine(self, plan: Plan, passes: int = 3) -> Plan:
        """NOTE [ Partition plans ] 5: moves of one op's strategy that shorten the step, by their local change
        (its share of time, the conversions its inputs need and those its outputs' readers need), output bytes
        per device never grown."""
        ts, link, nodes = self.graph.tensors, self.link, self.graph.nodes
        version: list[list[int]] = []  # per node, per input: the version of its base then
        readers = self.readers
        ver: dict[int, int] = {}
        for n in nodes:
            version.append([ver.get(ts[t].base, 0) for t in n.ins])
            for i in n.writes:
                b = ts[n.ins[i]].base
                ver[b] = ver.get(b, 0) + 1
        choice = list(plan.choice)
        place = self.placements(plan)
        count: dict[tuple[int, int, Place], int] = {}  # conversion key -> readers wanting it

        def want(k: int, i: int) -> Place:
            return self.strats[k][choice[k]].ins[i]

        for k, n in enumerate(nodes):
            for i, t in enumerate(n.ins):
                key = (t, version[k][i], want(k, i))
                count[key] = count.get(key, 0) + 1

        def edge(have: Place, w: Place, nbytes: int, written: bool) -> float:
            if w == ANY:
                return 0.0
            c = link.cost(have, w, nbytes)
            return c + link.cost(w, have, nbytes) if written and c else c

        for _ in range(passes):
            moved = False
            for k, n in enumerate(nodes):
                ss = self.strats[k]
                if len(ss) < 2:
                    continue
                cur = ss[choice[k]]
                mem0 = sum(link.per_device(ts[o], p) for o, p in zip(n.outs, cur.outs, strict=True))
                best_d, best_c = -1e-12, -1
                for c, s in enumerate(ss):
                    if c == choice[k]:
                        continue
                    if any(s.ins[i] != place[n.ins[i]] and s.ins[i] != ANY for i in n.writes):
                        continue
                    if sum(link.per_device(ts[o], p) for o, p in zip(n.outs, s.outs, strict=True)) > mem0:
                        continue
                    d = n.time * (s.frac - cur.frac)
                    d += (link.cost(P, R, s.sync) if s.sync else 0.0) - (link.cost(P, R, cur.sync) if cur.sync else 0.0)
                    for i, t in enumerate(n.ins):
                        w0, w1 = cur.ins[i], s.ins[i]
                        if w0 == w1 or i in n.writes:
                            continue
                        nb = ts[t].nbytes
                        if count.get((t, version[k][i], w0), 0) == 1:
                            d -= edge(place[t], w0, nb, False)
                        if count.get((t, version[k][i], w1), 0) == 0:
                            d += edge(place[t], w1, nb, False)
                    for o, p0, p1 in zip(n.outs, cur.outs, s.outs, strict=True):
                        if p0 == p1:
                            continue
                        seen = set()
                        for k2, i2 in readers.get(o, ()):
                            key = (version[k2][i2], want(k2, i2), i2 in nodes[k2].writes)
                            if key in seen:
                                continue
                            seen.add(key)
                            nb = ts[o].nbytes
                            d += edge(p1, key[1], nb, key[2]) - edge(p0, key[1], nb, key[2])
                    if d < best_d:
                        best_d, best_c = d, c
                if best_c < 0:
                    continue
                for i, t in enumerate(n.ins):
                    count[(t, version[k][i], cur.ins[i])] -= 1
                    key = (t, version[k][i], ss[best_c].ins[i])
                    count[key] = count.get(key, 0) + 1
                choice[k] = best_c
                for o, p in zip(n.outs, ss[best_c].outs, strict=True):
                    place[o] = p
                moved = True
            if not moved:
                break
        return self.settle(Plan(tuple(choice), plan.consts, plan.name))


def _groups(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Written constants that the optimizer updates together (a parameter and its states): joined where a
    pointwise op or write reads them, directly or through pointwise results of them, with equal shapes."""
    ts = graph.tensors
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    roots: dict[int, frozenset[int]] = {}
    for i, t in enumerate(ts):
        if t.const and t.written and t.base == i:
            roots[i] = frozenset((i,))
    for n in graph.nodes:
        if base(n.name) not in POINTWISE or not n.ins:
            continue
        shape = ts[n.ins[0]].shape
        rs = set()
        for t in n.ins:
            if ts[t].shape == shape:
                rs |= roots.get(t, frozenset())
        if not rs:
            continue
        first = find(next(iter(rs)))
        for r in rs:
            parent[find(r)] = first
        for o in n.outs:
            if ts[o].shape == shape:
                roots[o] = frozenset(rs)
    groups: dict[int, list[int]] = {}
    for i in roots:
        if ts[i].const:
            groups.setdefault(find(i), []).append(i)
    return {t: tuple(g) for g in groups.values() for t in g}
