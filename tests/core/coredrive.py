"""Test helpers that drive ``torch_dtr.core`` through its driver verbs, as the front ends do. No torch here.

    d = Driver(budget, policy)
    c = d.const(nbytes, value)                         # a pinned constant with a handle
    x, y = d.op([c], cost, [8, 4], lambda v: [v + 1, v * 2])
    d.read(x)                                          # rematerializes when evicted
    d.tick(5)                                          # advances the clock by 5, touching nothing
    full_check(d.rt)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch_dtr.core import Chain, Runtime, Storage, UFNode
from torch_dtr.core.trackers import TRACKERS, Component, Links


class Driver:
    def __init__(self, budget: int | None, policy: Any = "dtr_eq", **kw: Any) -> None:
        self.rt = Runtime(budget, policy, **kw)
        self.events: list[tuple[str, Storage | None]] = []
        self.rt.listen(lambda kind, s: self.events.append((kind, s)))

    def const(self, nbytes: int, value: Any) -> Storage:
        rt = self.rt
        rt.reserve(nbytes)
        s = rt.output(None, nbytes, value)
        rt.add_ref(s)
        return s

    def op(self, inputs: Sequence[Storage], cost: float, sizes: Sequence[int],
           fn: Callable[..., Sequence[Any]], name: str = "") -> list[Storage]:
        """Run ``fn(*input payloads)`` (one payload per size) as a front end does; handles on the outputs."""
        rt = self.rt
        inputs = list(inputs)
        held = rt.acquire(inputs)
        try:
            rt.reserve(sum(sizes), name)

            def compute() -> Sequence[Any]:
                args = [s.payload for s in inputs]
                assert all(s.resident for s in inputs), f"compute() ran with a non-resident input: {inputs}"
                assert all(a is not None for a in args)
                out = list(fn(*args))
                assert len(out) == len(sizes)
                return out

            values = compute()
            op = rt.ran(inputs, cost, compute, name)
            outs = [rt.output(op, n, v) for n, v in zip(sizes, values, strict=True)]
            for o in outs:
                rt.add_ref(o)
        finally:
            rt.release(held)
        return outs

    def op1(self, inputs: Sequence[Storage], cost: float, nbytes: int, fn: Callable[..., Any],
            name: str = "") -> Storage:
        """A one-output op: ``fn`` returns the single payload."""
        (s,) = self.op(inputs, cost, [nbytes], lambda *a: [fn(*a)], name)
        return s

    def tick(self, cost: float) -> None:
        """Advance the clock by ``cost`` with a 0-byte op that reads nothing and whose output dies at once."""
        rt = self.rt
        rt.reserve(0)
        op = rt.ran([], cost, lambda: [0], "tick")
        s = rt.output(op, 0, 0)
        rt.add_ref(s)
        rt.drop_ref(s)
        assert s.released

    def read(self, s: Storage) -> Any:
        v = self.rt.get(s)
        assert s.resident
        return v

    def evicted(self, kind: str = "evict") -> list[Storage]:
        return [s for k, s in self.events if k == kind]


def uf(s: Storage) -> UFNode | None:
    """``s``'s union-find node while evicted (trackers ``uf`` and ``chain``), else None."""
    return s.aux.uf if isinstance(s.aux, Links) else None


def links(s: Storage) -> tuple[int, int, float]:
    """``(up, down, path)`` of the chain tracker's estimates on ``s`` (NOTE [ Evicted chains ])."""
    a = s.aux
    return (1, 1, s.cost) if a is None else (a.up, a.down, a.path)


def extra(rt: Runtime, s: Storage, kind: str) -> Any:
    """The feature of ``kind`` for candidate ``s``: the runtime's own tracker for the stateful kinds ("uf" also
    reads the union-find part of a "chain" tracker), a fresh one for the stateless kinds."""
    rt.track()  # NOTE [ Lazy tracking ]: a runtime made without a budget starts its tracker at its first choice
    if kind == "comp":
        assert rt.policy.extra == "comp", f"{rt.policy.name} keeps no exact components"
        return rt.tracker.extra(s)
    if kind in ("uf", "chain"):
        assert rt.policy.extra in ("uf", "chain"), f"{rt.policy.name} keeps no union-find sets"
        v = rt.tracker.extra(s)
        if kind == "uf" and isinstance(v, Chain):
            return v.nbhd
        return v
    return TRACKERS[kind]().extra(s)


def full_check(rt: Runtime) -> None:
    """``rt.check()`` plus bookkeeping that ``check`` does not look at."""
    rt.check()
    assert rt.candidate_bytes == sum(s.nbytes for s in rt.candidates)
    for s in rt.live:
        assert s.locks == 0, f"{s} still locked between ops"
        assert not s.released
        if s.resident:
            assert uf(s) is None, f"resident {s} still in a union-find set"
        if s.pinned:
            assert s.resident or s.forward is not None or (s.moves and s.host is not None), \
                f"pinned {s} is neither resident nor swapped"
    if rt.budget is not None:
        assert rt.memory.tracked <= rt.budget
        assert rt.memory.peak <= max(rt.budget, rt.peak_limit or 0)  # set_budget may have lowered it
    if not rt.tracking:  # NOTE [ Lazy tracking ]: nothing chose yet, so no tracker state at all
        assert all(s.aux is None for s in rt.live), "a tracker state before the first choice"
        return
    if rt.policy.extra == "uf":
        roots: dict[int, tuple[Any, float]] = {}
        for s in rt.live:
            if not s.resident and s.forward is None and s.host is None:  # evicted (not an old version, not swapped)
                assert uf(s) is not None, f"evicted {s} has no union-find node under {rt.policy.name}"
                r = uf(s).find()
                roots[id(r)] = (r, roots.get(id(r), (r, 0.0))[1] + s.cost)
        for r, members in roots.values():
            # the root holds at least the cost of its live evicted members (more only for released ones)
            assert r.cost >= members - 1e-9 * max(1.0, members), (r.cost, members)
    if rt.policy.extra == "comp":
        _check_components(rt)


def _check_components(rt: Runtime) -> None:
    """The ``"comp"`` tracker's components are exactly the connected sets of evicted storages it tracks."""
    tracked = [s for s in rt.live if isinstance(s.aux, Component)]
    for s in rt.live:
        if not s.resident and s.forward is None and s.host is None:
            assert isinstance(s.aux, Component), f"evicted {s} is in no component"
        if s.resident or s.host is not None:  # swapped: never tracked (NOTE [ Swapping ] 3)
            assert s.aux is None, f"resident {s} is still in a component"
    done: set[int] = set()
    for s in tracked:
        if s.sid in done:
            continue
        walk, seen = [s], {s}
        while walk:
            n = walk.pop()
            for m in n.neighbours():
                if isinstance(m.aux, Component) and not m.resident and m not in seen:
                    seen.add(m)
                    walk.append(m)
        c = s.aux
        assert set(c.members) == seen, f"component of {s}: {len(c.members)} members, connected set {len(seen)}"
        assert all(m.aux is c for m in seen)
        total = sum(m.cost for m in seen)
        assert abs(c.cost - total) <= 1e-9 * max(1.0, total), (c.cost, total)
        done.update(m.sid for m in seen)
