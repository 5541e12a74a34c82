"""Replay an operator log through the core runtime with a simulated clock and simulated memory.

The same ``Runtime`` and policies as the live front end run here; only the payloads are fake (a marker
object) and the clock advances by the logged op times instead of measured ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..core import DEFAULT_POLICY, BudgetError, Policy, Runtime, Storage, Tier
from .log import Call, Constant, Copy, Log, Mutate, Release

# NOTE [ Replaying a log ]
#
# The rules follow how the DTR authors' simulator read these logs (``shared/dtr-logs/README.md``), so
# that our overheads compare with theirs:
#
# 1. Names are references. A tensor lives while a name refers to it (CONSTANT or CALL result, COPY adds a
#    name, COPY_FROM rebinds one, RELEASE drops one); each tensor is a handle on one core ``Storage``.
# 2. A CALL result with ALIAS = i >= 0 is a view: a handle on the storage of ARGS[i], no bytes of its own;
#    its op time advances the clock but records no recipe (a view is rebuilt from its base for free).
# 3. A CONSTANT is a pinned storage (resident, never evicted, counted) created with a ``reserve`` so that
#    a budget below the constants is an ``oom``. Constants released by every name are freed.
# 4. A MUTATE is a pure op reading all its arguments that produces a new storage (same bytes) for each
#    mutated argument; the mutating name is rebound to it and its reference to the old version dropped.
#    A write to a pinned storage (a constant: a parameter updated by the optimizer, a BatchNorm running
#    statistic) gives a pinned new version, as live (NOTE [ In-place mutation ]: a mutation of a constant
#    is never replayed). The DTR authors' logs mutate only gradients, so this changes nothing there.
# 5. Before an op: its inputs are rematerialized (when evicted) and locked one after the other, in
#    argument order, then the outputs' bytes reserved. (Live, ``Runtime.acquire`` locks the resident
#    inputs before rematerializing any; the replay keeps the authors' order.) The op's time advances the
#    clock (``Runtime.ran``); rematerializations add their recipe's time.
# 6. Names still referring to a tensor when the log ends are the iteration's outputs: their storages are
#    rematerialized at the end, and that counts.
# 7. overhead = (logged op time + rematerialized op time) / logged op time. ``thrash``: the replay stopped
#    because overhead passed ``thrash_at`` (2.0); ``oom``: nothing was left to evict (``BudgetError``).
#    Search time is measured (wall clock) but not in the overhead.
# 8. With a host tier (``simulate(..., swap_gbps=B)``, NOTE [ Swapping ]), a copy costs bytes / B GB/s of log
#    time (the copy out too, unless ``swap_out_free``: it overlaps compute), and the overhead adds the copies:
#    (logged + recomputed + copy time) / logged. ``host_budget`` bounds the bytes held there.
# 9. ``iterations=n`` replays the log n times, as a training loop runs one iteration again: between passes the
#    outputs are made resident (rule 6), every name but a constant's is dropped, and the runtime is told of the
#    boundary (NOTE [ Iteration plans ] in core/plan.py); a CONSTANT whose name is still bound (a parameter, its
#    newest version after the optimizer's write) is not made again. The overhead divides by n x the logged time.

THRASH_AT = 2.0
_RESIDENT = True  # the fake payload of a resident storage


class _Fake:
    """The recipe of a logged op: returns one fake payload per output (``op`` is set once recorded)."""

    __slots__ = ("op",)

    def __init__(self) -> None:
        self.op: Any = None

    def __call__(self) -> list[bool]:
        return [_RESIDENT] * len(self.op.outputs)


class _Thrash(Exception):
    pass


@dataclass(frozen=True)
class Outcome:
    """One (log, policy, budget) replay."""

    policy: str
    ratio: float | None  # budget / no-eviction peak, when the budget was given as a ratio
    budget: int | None
    status: str  # "ok", "oom" or "thrash"
    overhead: float  # (op time + recomputed op time) / op time; at the point of stopping when not ok
    evictions: int
    drops: int
    rematerializations: int
    accesses: int  # policy metadata accesses: candidates scored by the eviction search
    peak_bytes: int
    ops: int
    wall_seconds: float
    search_seconds: float
    error: str = ""
    swaps_out: int = 0  # copies to the host tier (rule 8)
    swaps_in: int = 0
    swap_gbps: float | None = None
    planned: int = 0  # iterations that followed their plan to the end (rule 9; NOTE [ Iteration plans ])
    diverged: int = 0  # iterations that left it
    per_iteration: tuple[float, ...] = ()  # with iterations > 1: each whole iteration's overhead (its op time's)
    ahead: int = 0  # values a plan brought back ahead of their reader (NOTE [ Iteration plans ] 7)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Replay:
    """Drives a ``Runtime`` from a ``Log`` (see NOTE [ Replaying a log ])."""

    def __init__(self, log: Log, rt: Runtime, thrash_at: float | None = THRASH_AT, live_order: bool = False,
                 pinned_ops: str = "", iterations: int = 1) -> None:
        if iterations < 1:
            raise ValueError(f"torch_dtr: iterations must be >= 1, got {iterations}")
        self.iterations = iterations
        self.log = log
        self.pinned_ops = pinned_ops  # a name prefix: those ops' outputs are never recomputed
        self.rt = rt
        self.live_order = live_order  # inputs brought back as the live runtime does (resident ones locked first)
        self.base_ns = log.op_time_ns() * iterations
        self.thrash_ns = None if thrash_at is None else (thrash_at - 1.0) * self.base_ns
        self.names: dict[str, Storage] = {}  # name -> the storage its tensor lives on
        self.spent: list[tuple[float, float]] = []  # each whole pass's op cost and recomputation and copy cost (9)
        self.k = 0  # index of the instruction being replayed (listeners of "op" events read it)
        if self.thrash_ns is not None:
            limit = self.thrash_ns

            def on_event(kind: str, _s: Storage | None) -> None:  # stops a cascade of recomputations in one op
                if kind in ("remat", "swapin") and rt.remat_cost + rt.swap_cost > limit:
                    raise _Thrash()

            rt.listen(on_event)

    # ------------------------------------------------------------------ references
    def _bind(self, name: str, s: Storage) -> None:
        old = self.names.get(name)
        self.rt.add_ref(s)
        self.names[name] = s
        if old is not None:  # the prototype's logs reuse no names, but a rebind must not leak
            self.rt.drop_ref(old)

    def _storage(self, name: str) -> Storage:
        s = self.names.get(name)
        if s is None:
            raise KeyError(f"torch_dtr: log {self.log.source}: tensor {name!r} is used but was never defined "
                           f"(or was released by all its names)")
        while s.forward is not None:  # handles on an old version count on the newest (core new_version)
            s = s.forward
        return s

    # ------------------------------------------------------------------ ops
    def _prepare(self, args: tuple[str, ...]) -> list[Storage]:
        """The op's distinct input storages, made resident and locked in order (``Runtime.acquire``, rule 5),
        or ``live_order``: as the live runtime does (resident ones locked first, one plan for the rest)."""
        ins = list(dict.fromkeys(self._storage(a) for a in args))
        self.rt.acquire(ins, resident_first=self.live_order)
        return ins

    def _ran(self, ins: list[Storage], ins_: Call | Mutate, recipe: bool) -> Any:
        """Tell the runtime the op ran; a fake recipe when ``recipe`` (else the op only advances the clock)."""
        fake = _Fake() if recipe else None
        op = self.rt.ran(ins, ins_.time_ns, fake, ins_.name)
        if fake is not None:
            fake.op = op
        return op

    def _call(self, ins_: Call) -> None:
        rt = self.rt
        ins = self._prepare(ins_.args)
        outs = []
        try:
            fresh = [r for r in ins_.results if r.alias < 0]
            rt.reserve(sum(r.nbytes for r in fresh), ins_.name)
            # only views: no recipe; ``pinned_ops``: ops whose outputs are pinned (NOTE [ Partition replay ] 3)
            op = self._ran(ins, ins_, bool(fresh) and not (self.pinned_ops and ins_.name.startswith(self.pinned_ops)))
            for r in ins_.results:
                s = rt.output(op, r.nbytes, _RESIDENT) if r.alias < 0 else self._storage(ins_.args[r.alias])
                outs.append((r.name, s))
        finally:
            rt.release(ins)
        for name, s in outs:  # after unlocking: a reference dropped here may evict (NOTE [ Lifetimes ] 3)
            self._bind(name, s)
        rt.ahead()

    def _mutate(self, ins_: Mutate) -> None:
        rt = self.rt
        ins = self._prepare(ins_.args)
        try:
            written = list(dict.fromkeys(self._storage(ins_.args[i]) for i in ins_.mutated))
            rt.reserve(sum(s.nbytes for s in written), ins_.name)
            # every write to a pinned storage: nothing to replay (NOTE 4)
            op = self._ran(ins, ins_, any(not s.pinned for s in written))
            news = {s: rt.output(None if s.pinned else op, s.nbytes, _RESIDENT) for s in written}
            rebind = [(ins_.args[i], news[self._storage(ins_.args[i])]) for i in dict.fromkeys(ins_.mutated)]
        finally:
            rt.release(ins)
        for name, s in rebind:  # after unlocking, so that the old version can be dropped
            self._bind(name, s)
        rt.ahead()

    def _constant(self, ins_: Constant) -> None:
        rt = self.rt
        if ins_.name in self.names:  # a later pass: the constant lives on (rule 9)
            return
        rt.reserve(ins_.nbytes, f"constant {ins_.name}")
        s = rt.output(None, ins_.nbytes, _RESIDENT)
        self._bind(ins_.name, s)

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Replay the measured iteration (``iterations`` times, rule 9); raises ``BudgetError`` (oom) or ``_Thrash``."""
        constants = {ins.name for ins in self.log.instrs if type(ins) is Constant}
        rt = self.rt
        for i in range(self.iterations):
            if i:
                for name in [n for n in self.names if n not in constants]:
                    rt.drop_ref(self.names.pop(name))
            spent = rt.remat_cost + rt.swap_cost
            self._pass()
            self.spent.append((self.base_ns / self.iterations, rt.remat_cost + rt.swap_cost - spent))
            rt.boundary()

    def _pass(self) -> None:
        rt, names = self.rt, self.names
        instrs = self.log.instrs
        thrash_ns = self.thrash_ns
        for k in range(self.log.start, len(instrs)):
            ins = instrs[k]
            self.k = k
            t = type(ins)
            if t is Call:
                self._call(ins)
            elif t is Release:
                s = names.pop(ins.name, None)
                if s is not None:
                    rt.drop_ref(s)
                continue
            elif t is Copy:
                s = names.get(ins.src)
                if s is not None:
                    self._bind(ins.dst, s)
                elif ins.rebind:
                    old = names.pop(ins.dst, None)
                    if old is not None:
                        rt.drop_ref(old)
                continue
            elif t is Mutate:
                self._mutate(ins)
            elif t is Constant:
                self._constant(ins)
                continue
            if thrash_ns is not None and rt.remat_cost + rt.swap_cost > thrash_ns:
                raise _Thrash()
            if rt.listeners:
                rt.emit("op", None)
        # outputs of the iteration must be resident at the end (NOTE 6)
        for s in list(dict.fromkeys(names.values())):
            while s.forward is not None:
                s = s.forward
            if not s.released:
                rt.get(s)
        if thrash_ns is not None and rt.remat_cost + rt.swap_cost > thrash_ns:
            raise _Thrash()


def no_eviction_peak(log: Log) -> int:
    """Peak tracked bytes (constants included) of the log replayed with no budget."""
    rt = Runtime(None)
    Replay(log, rt, thrash_at=None).run()
    return rt.memory.peak


def simulate(log: Log, policy: str | Policy = DEFAULT_POLICY, *, ratio: float | None = None, budget: int | None = None,
             peak: int | None = None, thrash_at: float | None = THRASH_AT, live_order: bool = False,
             swap_gbps: float | None = None, host_budget: int | None = None, swap_out_free: bool = False,
             pinned_ops: str = "", iterations: int = 1, **runtime_options: Any) -> Outcome:
    """Replay ``log`` under ``budget`` bytes, or ``ratio`` x its no-eviction peak (``peak`` if known).
    ``live_order``: bring inputs back as the live runtime does instead of as the DTR authors' simulator did.
    ``swap_gbps``: a host tier with this bandwidth (GB/s; rule 8), holding at most ``host_budget`` bytes.
    ``iterations``: the log replayed so many times, a boundary between passes (rule 9)."""
    budget = budget_for(ratio, budget, lambda: peak if peak is not None else no_eviction_peak(log), "simulate")
    if swap_gbps is not None:
        if not swap_gbps > 0:
            raise ValueError(f"torch_dtr: swap_gbps must be > 0 (GB/s), got {swap_gbps}; e.g. 12 for PCIe 3.0 x16")
        runtime_options["tier"] = Tier(host_budget, bandwidth=swap_gbps, out_free=swap_out_free)  # GB/s = B/ns
    rt = Runtime(budget, policy, **runtime_options)
    rp = Replay(log, rt, thrash_at, live_order, pinned_ops, iterations)
    return outcome(rp, rt, rp.base_ns, ratio, budget, swap_gbps)


def budget_for(ratio: float | None, budget: int | None, peak: Callable[[], int], fn: str) -> int | None:
    """The budget of a replay given exactly one of ``ratio`` (x ``peak()``) and ``budget`` (bytes)."""
    if (ratio is None) == (budget is None):
        raise ValueError(f"torch_dtr: give exactly one of ratio= (e.g. 0.5) or budget= (bytes) to {fn}()")
    if ratio is not None:
        if not 0 < ratio:
            raise ValueError(f"torch_dtr: ratio must be > 0, got {ratio}; e.g. ratio=0.5")
        return int(ratio * peak())
    return budget


def outcome(rp: Any, rt: Runtime, base: float, ratio: float | None, budget: int | None,
            swap_gbps: float | None = None) -> Outcome:
    """Run the replay ``rp`` (of a log or a trace) on ``rt`` and say how it went; ``base``: the op cost that
    recomputation is measured against (rule 7)."""
    status, error = "ok", ""
    t0 = time.perf_counter()
    try:
        rp.run()
    except BudgetError as e:
        status, error = "oom", str(e)
    except _Thrash:
        status = "thrash"
    wall = time.perf_counter() - t0
    base = base or 1
    spent = getattr(rp, "spent", ())  # per iteration: (op cost, recomputation and copy cost)
    return Outcome(
        policy=rt.policy.name, ratio=ratio, budget=budget, status=status,
        overhead=(base + rt.remat_cost + rt.swap_cost) / base, evictions=rt.evictions, drops=rt.drops,
        rematerializations=rt.rematerializations, accesses=rt.scored, peak_bytes=rt.memory.peak, ops=rt.ops,
        wall_seconds=wall, search_seconds=rt.search_seconds, error=error,
        swaps_out=rt.tier.outs if rt.tier else 0, swaps_in=rt.tier.ins if rt.tier else 0, swap_gbps=swap_gbps,
        planned=rt.iterations.planned, diverged=rt.iterations.diverged,
        ahead=rt.aheads,
        per_iteration=tuple((one + c) / one for one, c in spent if one > 0) if len(spent) > 1 else (),
    )
