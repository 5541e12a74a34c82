"""Trackers: what a policy's ``extra`` feature needs to know about evicted storages, kept up to date.

A policy names the kind of ``extra`` its score reads (``Policy.extra``); the runtime builds the tracker
registered for that kind (``TRACKERS``) and calls it at three points, so a new kind of feature is added by
registering a tracker, never by editing the runtime:

- ``evicted(s)``: ``s`` was just evicted (by the policy, or dropped when its last handle died);
- ``restored(s)``: ``s`` is no longer evicted: rematerialized, or released for good;
- ``extra(s)``: the feature of the resident candidate ``s``, passed to the policy's score.

A tracker keeps its per-storage state in ``Storage.aux`` (one slot, owned by the runtime's one tracker).

Kinds (the policies that use them are in ``policies.py``):

- ``""``: no feature (0.0);
- ``"uf"``: summed cost of the evicted components adjacent to ``s``, through union-find (h_DTR^eq of the
  DTR paper: cheap, approximate because components are never split);
- ``"exact"``: summed cost of the evicted neighbourhood e*(s), by a graph walk (h_DTR);
- ``"ancestors"``: summed cost of the evicted ancestors that rematerializing ``s`` would recompute (MSPS);
- ``"chain"``: a ``Chain`` of three O(neighbours) estimates, NOTE [ Evicted chains ] below;
- ``"comp"``: what ``"exact"`` computes, kept incrementally: NOTE [ Exact components ] below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .records import Storage

try:  # only the compiled core reads it (NOTE [ Compiled core ]); interpreted, it is a no-op
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with mypy

    def mypyc_attr(*_args: object, **_kw: object) -> Any:  # type: ignore  # noqa: PGH003
        return lambda cls: cls

# NOTE [ Evicted chains ]
#
# The "chain" tracker keeps, on each evicted storage, three estimates about the evicted paths through it
# (paths along recipe edges whose storages are all evicted):
#   up:   storages on the longest such path ending at it (its recipe's evicted inputs, theirs, ...);
#   down: storages on the longest such path starting at it (evicted users' outputs, theirs, ...);
#   path: summed recipe cost along the costliest path up (what recomputing it runs at least).
# 1. They are set when the storage is evicted, from its evicted neighbours' values, and pushed one step to
#    those neighbours (an evicted user's output now has this one above it, an evicted input this one
#    below it). So an eviction and a candidate's score both cost O(neighbours), never O(graph).
# 2. They are estimates: a value further than one step from a later eviction is not updated (lengths and
#    costs can be low), and a rematerialization updates nothing (they can be high until the storage is
#    evicted again). A storage never evicted reads as (1, 1, its own cost); one made non-resident by an
#    in-place write keeps the values it had.
# 3. The policy uses them to see (a) what bringing a candidate back costs beyond its own recipe, which the
#    union-find neighbourhood blurs once components grow, and (b) how long a chain of evicted storages the
#    eviction would make: a long chain is recomputed by a deep cascade that can run out of budget halfway.


class UFNode:
    """A union-find set of evicted storages and the summed compute cost of its members."""

    __slots__ = ("parent", "cost")

    def __init__(self, cost: float = 0.0) -> None:
        self.parent: UFNode = self
        self.cost = cost

    def find(self) -> UFNode:
        root = self
        while root.parent is not root:
            root = root.parent
        node = self
        while node.parent is not root:  # path compression
            node.parent, node = root, node.parent
        return root

    def union(self, other: UFNode) -> UFNode:
        a, b = self.find(), other.find()
        if a is b:
            return a
        b.parent = a
        a.cost += b.cost
        return a


class Chain(NamedTuple):
    """The ``extra`` of the ``"chain"`` kind (NOTE [ Evicted chains ])."""

    nbhd: float  # union-find evicted-neighbourhood cost, as the "uf" kind
    path: float  # recipe cost along the costliest evicted path above the candidate (0: no input evicted)
    length: int  # storages on the longest evicted chain through the candidate once it is evicted (>= 1)


class Links:
    """A storage's state in the union-find and chain trackers (``Storage.aux``)."""

    __slots__ = ("uf", "up", "down", "path")

    def __init__(self, cost: float) -> None:
        self.uf: UFNode | None = None  # its set while evicted
        self.up = 1
        self.down = 1
        self.path = cost


def _evicted(s: Storage) -> bool:
    """Evicted and recomputed when needed (a swapped storage comes back by a copy: NOTE [ Swapping ] 3)."""
    return not s.resident and not s.released and s.host is None


@mypyc_attr(allow_interpreted_subclasses=True)  # front ends subclass it
class Tracker:
    """No feature: every candidate's ``extra`` is 0."""

    scores = False  # whether ``extra`` says anything (the runtime skips the call otherwise)

    def evicted(self, s: Storage) -> None:
        pass

    def restored(self, s: Storage) -> None:
        pass

    def superseded(self, s: Storage) -> None:
        """An in-place write made ``s`` (its old version) non-resident without an eviction; recipes may still
        read it (then it is recomputed like an evicted value)."""

    def extra(self, s: Storage) -> Any:
        return 0.0

    def grouped(self, s: Storage) -> bool:
        """Whether ``s``'s cost is summed into state the tracker keeps (then it must not change)."""
        return False


class UnionFind(Tracker):
    scores = True

    @staticmethod
    def links(s: Storage) -> Links:
        a = s.aux
        if a is None:
            a = s.aux = Links(s.cost)
        return a

    @staticmethod
    def node(s: Storage) -> UFNode | None:
        """``s``'s union-find node while it is evicted (``None`` otherwise)."""
        return s.aux.uf if s.aux is not None else None

    def evicted(self, s: Storage) -> None:
        node = self.links(s).uf = UFNode(s.cost)
        for n in s.neighbours():
            a = n.aux
            if a is not None and a.uf is not None and _evicted(n):
                node.union(a.uf)

    def restored(self, s: Storage) -> None:
        a = s.aux
        if a is not None and a.uf is not None:  # its cost leaves its set (not split: h_DTR^eq's approximation)
            a.uf.find().cost -= s.cost
            a.uf = None

    def extra(self, s: Storage) -> Any:
        # the distinct sets of the evicted neighbours (``s.neighbours()``: recipe inputs, then readers'
        # outputs), summed in the order first seen (not a set of objects hashed by address: the float sum then
        # adds in the same order in every run, so near-ties break the same way; docs/determinism.md). Written
        # out, with no set built for the common zero or one neighbouring set: the eviction search calls this
        # for most candidates (the shared LSTM log at 0.3: 187,000 calls).
        first = None
        more: dict[UFNode, None] | None = None
        op = s.op
        groups: Any = [op.inputs] if op is not None else []
        groups.extend(c.outputs for c in s.children)
        for group in groups:
            for n in group:
                a = n.aux
                if a is None or a.uf is None or n.resident or n.released:
                    continue
                r = a.uf
                if r.parent is not r:
                    r = r.find()
                if first is None:
                    first = r
                elif r is not first:
                    if more is None:
                        more = {first: None}
                    more[r] = None
        if first is None:
            return 0
        if more is None:
            return 0 + first.cost
        return sum(r.cost for r in more)

    def grouped(self, s: Storage) -> bool:
        return s.aux is not None and s.aux.uf is not None


class ChainTracker(UnionFind):
    """Union-find plus the chain estimates (NOTE [ Evicted chains ])."""

    def evicted(self, s: Storage) -> None:
        super().evicted(s)
        up = down = 0
        path = 0.0
        i: Any  # (links and storages in turn: one type for the compiled core)
        o: Any
        lo: Any
        op = s.op
        links = self.links
        ins = [links(i) for i in op.inputs if _evicted(i)] if op is not None else []
        outs = [(o, links(o)) for c in s.children for o in c.outputs if _evicted(o)]
        for i in ins:
            up = max(up, i.up)
            path = max(path, i.path)
        for _, o in outs:
            down = max(down, o.down)
        me: Any = s.aux
        me.up, me.down = up + 1, down + 1
        me.path = s.cost + path
        for o, lo in outs:
            lo.up = max(lo.up, up + 2)
            lo.path = max(lo.path, o.cost + me.path)
        for i in ins:
            i.down = max(i.down, down + 2)

    def extra(self, s: Storage) -> Chain:
        roots: dict[UFNode, None] = {}  # ordered, as in UnionFind.extra
        up = down = 0
        path = 0.0
        op = s.op
        if op is not None:
            for i in op.inputs:
                if _evicted(i):
                    a = i.aux
                    if a is None:  # never evicted (an in-place write's old version): (1, 1, its cost)
                        up, path = max(up, 1), max(path, i.cost)
                        continue
                    up = max(up, a.up)
                    path = max(path, a.path)
                    if a.uf is not None:
                        roots[a.uf.find()] = None
        for c in s.children:
            for o in c.outputs:
                if _evicted(o):
                    a = o.aux
                    if a is None:
                        down = max(down, 1)
                        continue
                    down = max(down, a.down)
                    if a.uf is not None:
                        roots[a.uf.find()] = None
        return Chain(sum(r.cost for r in roots), path, up + down + 1)


def evicted_component(start: Sequence[Storage], up_only: bool = False) -> set[Storage]:
    """The evicted storages reachable from ``start`` through evicted storages (recipe inputs only: ``up_only``)."""
    seen: set[Storage] = set()
    work = [n for n in start if _evicted(n)]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        nxt = (n.op.inputs if n.op else ()) if up_only else n.neighbours()
        work.extend(m for m in nxt if _evicted(m) and m not in seen)
    return seen


class Exact(Tracker):
    scores = True

    def extra(self, s: Storage) -> Any:
        return sum(n.cost for n in evicted_component(s.neighbours()))


class Ancestors(Tracker):
    scores = True

    def extra(self, s: Storage) -> Any:
        return sum(n.cost for n in evicted_component(s.op.inputs if s.op else (), up_only=True))


# NOTE [ Exact components ]
#
# 1. Union-find never splits a set when a member is rematerialized (h_DTR^eq's approximation): after a forward
#    pass most evicted values sit in one merged set, every candidate next to it looks as expensive, and
#    staleness alone decides. The exact walk of h_DTR tells them apart but walks the component for every
#    candidate: on the bench's LSTM loop at 50% of its peak the search took 6.2 s per step instead of 0.17 s
#    (docs/decisions.md, Union-find against exact neighbourhoods).
# 2. ``Components`` keeps the exact components instead: an eviction merges the components next to the
#    evicted storage (the smaller relabelled into the largest); a rematerialization (or release) removes
#    the storage and, if two or more of its evicted neighbours were in its component, walks from each of
#    them in turn, a node at a time, merging walks that meet. A group of walks that runs out of nodes is a
#    part cut off: it becomes a new component; once at most one group can still grow, it keeps the old
#    component. So a split costs about the size of the parts cut off, and ``extra`` is O(neighbours).
# 3. Members are the evicted storages and the old versions of in-place writes that recipes still read
#    (``Tracker.superseded``; they are recomputed like evicted values). Union-find leaves old versions out;
#    leaving them out here too made the bench's LSTM loop (four in-place activations per step) recompute
#    1,904 times in a step at 50% instead of exact h_DTR's 1,589; with them, the two choose alike on all
#    three bench workloads. ``full_check`` in the core tests compares every component with a fresh walk
#    after every step of the random programs.


class Component:
    """A connected set of evicted storages (the ``"comp"`` kind) and the summed cost of its members."""

    __slots__ = ("members", "cost")

    def __init__(self) -> None:
        self.members: dict[Storage, None] = {}  # ordered: sums and walks go the same way in every run
        self.cost = 0.0


class Components(Tracker):
    """Exact evicted neighbourhoods kept incrementally (NOTE [ Exact components ]): what ``"exact"`` computes
    by a walk per candidate, here merged on eviction and split on rematerialization, so that scoring is
    O(degree) as with union-find. Old versions of in-place writes that recipes read are members too."""

    scores = True

    def evicted(self, s: Storage) -> None:
        comps: dict[Component, None] = {}
        for n in s.neighbours():
            c = n.aux
            if c is not None and not n.resident:
                comps[c] = None
        if not comps:
            big = Component()
        else:
            big = max(comps, key=lambda c: len(c.members))  # the first of the largest: deterministic
            for c in comps:
                if c is not big:
                    for m in c.members:
                        m.aux = big
                    big.members.update(c.members)
                    big.cost += c.cost
        big.members[s] = None
        big.cost += s.cost
        s.aux = big

    def superseded(self, s: Storage) -> None:
        if s.deps:  # an old version that recipes read is recomputed when needed: part of the neighbourhood
            self.evicted(s)

    def restored(self, s: Storage) -> None:
        c = s.aux
        if c is None:
            return
        s.aux = None
        del c.members[s]
        c.cost -= s.cost
        near = list(dict.fromkeys(n for n in s.neighbours() if n.aux is c))
        if len(near) < 2:  # s was a leaf of its component (or alone): the rest stays connected
            if not c.members:
                c.cost = 0.0
            return
        # one walk per evicted neighbour, a node at a time in turn; walks that meet merge. A group of walks
        # that runs out of nodes is a part cut off from the rest; once at most one group can still grow,
        # it keeps ``c``. So the walks cost about the size of the parts cut off, not of the component.
        k = len(near)
        group = list(range(k))
        seen: dict[Storage, int] = {n: i for i, n in enumerate(near)}
        fronts: list[list[Storage]] = [[n] for n in near]
        parts: list[list[Storage]] = [[n] for n in near]

        def root(i: int) -> int:
            while group[i] != i:
                group[i] = group[group[i]]
                i = group[i]
            return i

        while True:
            open_ = [r for r in range(k) if group[r] == r and fronts[r]]
            if len(open_) <= 1:
                break
            for r in open_:
                r = root(r)
                if not fronts[r]:
                    continue
                n = fronts[r].pop()
                for m in n.neighbours():
                    if m.aux is not c:
                        continue
                    j = seen.get(m)
                    if j is None:
                        seen[m] = r
                        parts[r].append(m)
                        fronts[r].append(m)
                        continue
                    rj = root(j)
                    if rj != r:  # the walks met: one group, one frontier
                        group[rj] = r
                        fronts[r].extend(fronts[rj])
                        parts[r].extend(parts[rj])
                        fronts[rj], parts[rj] = [], []
        roots = [r for r in range(k) if group[r] == r]
        open_ = [r for r in roots if fronts[r]]
        keep = open_[0] if open_ else max(roots, key=lambda r: len(parts[r]))  # the first of the largest
        for r in roots:
            if r == keep:
                continue
            part = Component()
            for n in parts[r]:
                n.aux = part
                part.members[n] = None
                part.cost += n.cost
                del c.members[n]
            c.cost -= part.cost
        if not c.members:
            c.cost = 0.0

    def extra(self, s: Storage) -> Any:
        return comp_extra(s)

    def grouped(self, s: Storage) -> bool:
        return s.aux is not None


def comp_extra(s: Storage) -> float:
    """``Components.extra``: the summed cost of the distinct components of ``s``'s evicted neighbours (recipe
    inputs, then readers' outputs), added in the order first seen. A typed function that builds no list of
    the neighbours (and none at all where fewer than two components border ``s``): the eviction search calls
    it for most candidates (``eviction.scored_victim``)."""
    first: Component | None = None
    more: list[Component] | None = None
    op = s.op
    ins: Sequence[Storage] = op.inputs if op is not None else ()
    children = s.children
    for i in range(-1, len(children)):
        group = ins if i < 0 else children[i].outputs
        for n in group:
            c: Component | None = n.aux
            if c is None or n.resident:
                continue
            if first is None:
                first = c
            elif c is not first:
                if more is None:
                    more = [first, c]
                elif c not in more:
                    more.append(c)
    if first is None:
        return 0.0
    if more is None:
        return first.cost
    total = 0.0
    for c in more:
        total += c.cost
    return total


TRACKERS: dict[str, Callable[[], Tracker]] = {
    "": Tracker, "uf": UnionFind, "exact": Exact, "ancestors": Ancestors, "chain": ChainTracker,
    "comp": Components,
}


def register_tracker(kind: str, make: Callable[[], Tracker]) -> None:
    """Add a kind of ``extra`` feature; policies then name it in ``Policy.extra``."""
    TRACKERS[kind] = make
