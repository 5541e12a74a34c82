"""Traces: what the live core was told during a recorded stretch of a program, and its replay at any budget.

    torch_dtr.enable(trace="step.trace")   # (the compiled front end) ... one iteration ... torch_dtr.disable()
    simulate_trace(read_trace("step.trace"), ratio=0.5)

Torch-free, as all of ``sim/``: the compiled front end writes a trace (``Writer``), this module reads and
replays it through the same ``Feed`` and ``Runtime`` the live session runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..core import DEFAULT_POLICY, Policy, Runtime, Storage
from ..core.feed import Feed
from .replay import THRASH_AT, Outcome, _Thrash, budget_for, outcome

# NOTE [ Traces ]
#
# 1. What: every call the compiled front end's session makes into the core while a trace is on, as JSON lines,
#    storages named by the core's own numbers (``Storage.sid``), constants by their key:
#    ``["B", ins, need, name, dead, consts, writes, plain, views]`` before an op (``Feed.before``);
#    ``["R", name, cost, ins, nbytes, recipe, read, wrote, dead, plain, views, outs]`` after it (``Feed.ran``;
#    ``wrote``: [old, mode, whether a payload came] or null; ``outs``: the sids the core gave the outputs;
#    ``recipe`` on a write kept in place: whether a version of it would have one, rule 5);
#    ``["Q", views]`` queued ops told by the session; ``["D", sids]`` handle deaths it told; ``["K", gone]``
#    constants that died ([key, bytes] each); ``["W", keys, name]`` a write to constants recipes read;
#    ``["P", sids]`` storages pinned (outputs without strided storage, ``unwrap``); ``["L", sids]`` locks given back
#    after an op raised; ``["S"]`` an iteration ended (an optimizer step: NOTE [ Iteration plans ] in core/plan.py).
#    A header line gives the session's options (policy, banishing depth) and the trace's format.
# 2. While tracing, the kernel asks the core ahead of every managed op (front.cpp, ``g_trace``): each op's
#    reservation (its predicted output bytes) is in the trace, and every death is told at the earliest point the
#    kernel can tell it. A live session under a budget tells the core less often (NOTE [ Native front end ] 10):
#    it skips ``before`` when the op's inputs are resident and its bytes fit, and tells deaths and queued ops with
#    its next call. Its decisions are the same: the core decides only inside ``before`` (``reserve``, bringing
#    inputs back) and inside ``ran`` when a prediction fell short, and every call tells first what happened
#    since the last one, in order; an ``acquire`` and a ``reserve`` that fits change nothing. So one trace,
#    recorded without a budget, replays at any budget to the evictions and recomputations a live session at that
#    budget makes on the same stretch of the same program (tests/sim/test_trace.py checks it live).
# 3. Replay: a ``Feed`` over a ``Runtime`` with the session's options; payloads are markers, recipes return one
#    marker per output, constants are counted as the session counts them (a key first seen). overhead =
#    (op cost + recomputed op cost) / op cost, in the core's modelled seconds, the costs the live session used;
#    ``thrash`` and ``oom`` as NOTE [ Replaying a log ] 7 says.
# 4. What it does not replay: a device's allocator (what plain ops allocate, out-of-memory retries: recorded
#    as ``plain`` bytes but not replayed), the host tier, tenants (one session's calls only).
# 5. A write kept in place while tracing (a gradient summed in place by autograd) may be kept as a version with a
#    recipe under a budget, whose recipe keeps what it reads: the traced session's kernel says where a version
#    would have one (``recipe`` true on a write kept in place), and the replay gives it one where its core keeps
#    a version. Before it did, the replay freed values the live run kept, and an LSTM cell's loop failed live just
#    above the smallest budget the replay found; now tests/sim/test_trace.py finds the live session training at
#    that budget and failing 4 KiB below it. What a replay of the traced steps cannot say is how the steps after
#    them go: they start from another memory state (at the smallest budget of their first two steps ResNet-50 and
#    a Mixtral failed at the third, 2026-11-29: ``python benchmarks/learned_budget.py --margin 0``), hence
#    ``MARGIN`` in a learned budget.

FORMAT = "torch-dtr trace 1"
_FIELDS = {"B": 9, "R": 12, "Q": 2, "D": 2, "K": 2, "W": 3, "P": 2, "L": 2, "S": 1}  # each row kind's length (rule 1)


class TraceError(ValueError):
    """A trace that cannot be read or replayed: the message names the file, the line and what is wrong."""


class Writer:
    """Writes a session's calls into the core (rule 1) to ``path``, and keeps them in ``rows`` (up to ``keep`` rows,
    then ``rows`` is None: NOTE [ Learned budgets ] 1 in native/session.py); ``close()`` at the end."""

    def __init__(self, path: str | Path | None, options: dict[str, Any], keep: int = 0) -> None:
        self.path = None if path is None else Path(path)
        self.file: TextIO | None = None if self.path is None else self.path.open("w")
        self.options = options
        self.keep = keep
        self.rows: list[Any] | None = [] if keep else None
        self.line({"format": FORMAT, **options})

    def line(self, row: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row, separators=(",", ":")))
            self.file.write("\n")
        rows = self.rows
        if rows is not None and type(row) is list:
            rows.append(row)
            if len(rows) >= self.keep:
                self.rows_kept()
                self.rows = None

    def rows_kept(self) -> None:
        """Called once when ``keep`` rows were kept (``rows`` still holds them; None from then on)."""

    def trace(self, upto: int | None = None) -> Trace | None:
        """The rows kept (the first ``upto``) as a ``Trace``; None when more were written than it keeps."""
        if self.rows is None:
            return None
        return Trace(str(self.path or "<this session>"), dict(self.options), self.rows[:upto])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    # one method per call (rule 1); storages come as core ``Storage`` objects
    def before(self, ins: list[Storage], need: int, name: str, dead: list[Storage], consts: list[tuple[Any, int, int]],
               writes: list[Storage], plain: int, views: Any) -> None:
        self.line(["B", _sids(ins), need, name, _sids(dead), [[k, n] for _t, k, n in consts], _sids(writes), plain,
                   _views(views)])

    def ran(self, name: str, cost: float, ins: list[Storage], nbytes: list[int], recipe: bool, read: list[int],
            wrote: tuple[Storage, str, Any] | None, dead: list[Storage], plain: int, views: Any,
            outs: list[Storage]) -> None:
        w = None if wrote is None else [wrote[0].sid, wrote[1], wrote[2] is not None]
        self.line(["R", name, cost, _sids(ins), list(nbytes), recipe, list(read), w, _sids(dead), plain, _views(views),
                   _sids(outs)])

    def queued(self, views: Any) -> None:
        self.line(["Q", _views(views)])

    def dropped(self, dead: Iterable[Storage]) -> None:
        self.line(["D", _sids(dead)])

    def constants_died(self, gone: Iterable[tuple[int, int]]) -> None:
        self.line(["K", [[k, n] for k, n in gone]])

    def written(self, keys: list[int], name: str) -> None:
        self.line(["W", list(keys), name])

    def pinned(self, storages: Iterable[Storage]) -> None:
        self.line(["P", _sids(storages)])

    def released(self, held: Iterable[Storage]) -> None:
        self.line(["L", _sids(held)])

    def boundary(self) -> None:
        self.line(["S"])


def _sids(storages: Iterable[Storage] | None) -> list[int]:
    return [s.sid for s in storages] if storages else []


def _views(views: Any) -> list[Any]:
    return [[_sids(ins), name] for ins, name in views] if views else []


@dataclass
class Trace:
    """A read trace: its header's options and its rows (rule 1)."""

    source: str
    options: dict[str, Any]
    rows: list[list[Any]] = field(default_factory=list)

    def op_cost(self) -> float:
        """The modelled seconds of the traced ops (what recomputation is measured against)."""
        return sum(r[2] for r in self.rows if r[0] == "R")

    def ops(self) -> int:
        return sum(1 for r in self.rows if r[0] == "R")


def read_trace(path: str | Path) -> Trace:
    """Read a trace written by ``Writer``; ``TraceError`` (the file, the line, what was expected) when it is not
    one or a line is malformed (a truncated file: its last line)."""
    p = Path(path)
    with p.open() as f:
        first = f.readline()
        try:
            head = json.loads(first)
        except json.JSONDecodeError:
            head = None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise TraceError(f"torch_dtr: {p} is not a torch-dtr trace (its first line should name {FORMAT!r}); "
                             f"traces come from torch_dtr.enable(trace=...) or `torch-dtr record`")
        rows = []
        for n, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"torch_dtr: {p}:{n}: not a JSON row ({e}); the file may be truncated") from None
            if not (isinstance(row, list) and row and isinstance(row[0], str) and row[0] in _FIELDS
                    and len(row) == _FIELDS[row[0]]):
                raise TraceError(f"torch_dtr: {p}:{n}: expected a row [kind, ...] with kind one of {sorted(_FIELDS)} "
                                 f"and its fields (B: 9, R: 12, W: 3, S: 1, the others 2), got {line.strip()[:120]!r}")
            if row[0] == "R" and (isinstance(row[2], bool) or not isinstance(row[2], (int, float))
                                  or not 0 <= row[2] < float("inf")):
                raise TraceError(f"torch_dtr: {p}:{n}: an op's cost (field 3) must be a number of seconds >= 0, got "
                                 f"{row[2]!r}")
            rows.append(row)
    options = {k: v for k, v in head.items() if k != "format"}
    return Trace(str(p), options, rows)


class _Recipe:
    """A traced op's recipe: one marker per output (``op`` set once the core made it)."""

    __slots__ = ("op",)

    def __init__(self) -> None:
        self.op: Any = None

    def __call__(self, *_lend: Any) -> list[bool]:
        return [True] * len(self.op.outputs)


class TraceReplay:
    """Drives a ``Feed`` from a ``Trace`` (rule 3)."""

    def __init__(self, trace: Trace, rt: Runtime, thrash_at: float | None = THRASH_AT) -> None:
        self.trace = trace
        self.rt = rt
        self.feed = feed = Feed(rt, False)
        feed.see = self._see
        self.storages: dict[int, Storage] = {}  # the trace's sid -> the replay's storage
        self.consts: dict[int, int] = {}  # a constant's key -> bytes counted (as native Session.consts)
        self.base = trace.op_cost()
        self.held: Any = None
        # per iteration (``["S"]`` rows): its ops' cost and its recomputation and copy cost (Outcome.per_iteration)
        self.spent: list[tuple[float, float]] = []
        self.cost = self.mark = 0.0
        if thrash_at is not None:
            limit = (thrash_at - 1.0) * self.base

            def on_event(kind: str, _s: Storage | None) -> None:  # stops a cascade of recomputations in one op
                if kind in ("remat", "swapin") and rt.remat_cost + rt.swap_cost > limit:
                    raise _Thrash()

            rt.listen(on_event)

    def _see(self, _t: Any, key: int, nbytes: int, where: str) -> None:
        if key not in self.consts:
            self.rt.add_constant(nbytes, where)
            self.consts[key] = nbytes

    def _s(self, sids: list[int]) -> list[Storage]:
        """The replay's storages for the trace's numbers; a handle on a value written in place names its newest
        version (``Storage.forward``), as the live handles do."""
        st = self.storages
        out = []
        for i in sids:
            s = st[i]
            while s.forward is not None:
                s = s.forward
            out.append(s)
        return out

    def _views(self, views: list[Any]) -> list[tuple[list[Storage], str]]:
        return [(self._s(ins), name) for ins, name in views]

    def run(self) -> None:
        """Replay every row; raises ``BudgetError`` (oom) or ``_Thrash``; ``TraceError`` for a row that does not
        fit the trace (a storage never made, a field of the wrong type)."""
        for n, row in enumerate(self.trace.rows):
            try:
                self._row(row)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, AssertionError, ArithmeticError) as e:
                if isinstance(e, TraceError):
                    raise
                # (an InternalError, an AssertionError, is the core refusing a sequence no session makes)
                raise TraceError(f"torch_dtr: {self.trace.source}: row {n + 1} ({row[0]}) does not fit the trace: "
                                 f"{type(e).__name__}: {e}") from e

    def _row(self, row: list[Any]) -> None:
        rt, feed = self.rt, self.feed
        kind = row[0]
        if kind == "B":
            _, ins, need, name, dead, consts, writes, plain, views = row
            self.held = feed.before(self._s(ins), need, name, self._s(dead), [(None, k, n) for k, n in consts],
                                    self._s(writes), 0, self._views(views))
        elif kind == "R":
            self._ran(row)
        elif kind == "Q":
            feed.queued(self._views(row[1]))
        elif kind == "D":
            for s in self._s(row[1]):
                rt.drop_ref(s)
        elif kind == "K":
            for key, nbytes in row[1]:
                if self.consts.pop(key, None) is not None:
                    rt.remove_constant(nbytes)
                feed.readers.pop(key, None)
        elif kind == "W":
            feed.written(row[1], row[2])
        elif kind == "P":
            for s in self._s(row[1]):
                if not s.resident:
                    rt.rematerialize(s)
                rt.pin(s)
        elif kind == "S":
            spent = rt.remat_cost + rt.swap_cost
            self.spent.append((self.cost, spent - self.mark))
            self.cost, self.mark = 0.0, spent
            rt.boundary()
        elif kind == "L":
            held, self.held = self.held, None
            if held is not None:
                rt.release(held[0] if isinstance(held, tuple) else held)

    def _ran(self, row: list[Any]) -> None:
        _, name, cost, ins, nbytes, recipe, read, wrote, dead, plain, views, outs = row
        self.cost += cost
        held, self.held = self.held, None
        w = None
        old: Storage | None = None
        versioned = False  # the traced write made a new version (its number comes last in ``outs``)
        if wrote is not None:
            versioned = wrote[1] in ("version", "copy")
            mode = wrote[1]
            if isinstance(held, tuple):  # how the replay's core keeps the write: under another budget it may choose
                held, mode = held        # otherwise than the traced session did (a value banished), as live would
            (old,) = self._s([wrote[0]])
            w = (old, mode, True if mode == "copy" else None)
        fake = _Recipe() if recipe else None
        made, _room = self.feed.ran(name, cost, self._s(ins), nbytes, [True] * len(nbytes), fake, held, read, w,
                                    self._s(dead), 0, self._views(views))
        n = len(nbytes)
        if len(outs) - versioned != n or len(made) < n:
            raise ValueError(f"torch_dtr: trace {self.trace.source}: {name} made {len(made)} storages in the replay "
                             f"where the live core made {len(outs)}")
        for sid, s in zip(outs[:n], made[:n], strict=True):
            self.storages[sid] = s
        if versioned and old is not None:  # the traced version: the replay's, or the value written (kept in place)
            self.storages[outs[-1]] = made[-1] if len(made) > n else old
        if fake is not None and made:
            fake.op = made[0].op


def trace_runtime(trace: Trace, budget: int | None, policy: str | Policy | None = None,
                  **runtime_options: Any) -> Runtime:
    """A core with the traced session's options (its policy, banishing depth and smallest victim, unless given) at
    ``budget``, for a replay of ``trace``."""
    o = trace.options
    runtime_options.setdefault("banish_depth", o.get("banish_depth", 2))
    runtime_options.setdefault("evict_minimum", o.get("evict_minimum", 0))
    return Runtime(budget, policy or o.get("policy", DEFAULT_POLICY), lazy_tracking=True, **runtime_options)


def simulate_trace(trace: Trace, policy: str | Policy | None = None, *, ratio: float | None = None,
                   budget: int | None = None, peak: int | None = None, thrash_at: float | None = THRASH_AT,
                   **runtime_options: Any) -> Outcome:
    """Replay ``trace`` under ``budget`` bytes, or ``ratio`` x its no-eviction peak (``peak`` if known), with the
    traced session's policy and banishing depth unless given."""
    budget = budget_for(ratio, budget, lambda: peak if peak is not None else trace_peak(trace), "simulate_trace")
    rt = trace_runtime(trace, budget, policy, **runtime_options)
    rp = TraceReplay(trace, rt, thrash_at)
    return outcome(rp, rt, rp.base, ratio, budget)


def trace_peak(trace: Trace) -> int:
    """Peak tracked bytes (constants included) of the trace replayed without a budget."""
    rt = trace_runtime(trace, None)
    TraceReplay(trace, rt, None).run()
    return rt.memory.peak


def smallest_trace_budget(trace: Trace, policy: str | Policy | None = None, *, max_overhead: float | None = THRASH_AT,
                          tolerance: int | None = None) -> tuple[int, Outcome]:
    """The smallest budget at which ``trace`` trains, by bisection between the single-op floor (below it no schedule
    runs) and the no-eviction peak: a budget that trains (its outcome returned) with one ``tolerance`` bytes below
    it that does not (default: a thousandth of the peak). ``max_overhead``: only a replay whose overhead stays
    within it counts as training (None: any). Feasibility is not monotonic in the budget for a dynamic policy, so a
    smaller budget may train too; the one found is where the replay, and so the live session (rule 2), trains."""
    if max_overhead is not None and not max_overhead >= 1:
        raise ValueError(f"torch_dtr: max_overhead must be >= 1 (a multiple of one pass), got {max_overhead!r}")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 1):
        raise ValueError(f"torch_dtr: tolerance must be an int >= 1 (bytes), got {tolerance!r}")
    rt = trace_runtime(trace, None, policy)
    TraceReplay(trace, rt, None).run()
    peak, floor = rt.memory.peak, rt.floor
    tol = tolerance if tolerance is not None else max(1, peak // 1000)
    best = simulate_trace(trace, policy, budget=peak, thrash_at=max_overhead)
    lo, hi = max(0, floor - 1), peak
    while hi - lo > tol:
        mid = (lo + hi) // 2
        o = simulate_trace(trace, policy, budget=mid, thrash_at=max_overhead)
        if o.status == "ok":
            hi, best = mid, o
        else:
            lo = mid
    return hi, best


MARGIN = 0.05  # a learned budget's room above the smallest the traced steps train at: for the steps after them (rule 5)


def learned_budget(trace: Trace) -> int:
    """The budget to train ``trace``'s stretch at (rule 5): the smallest at which its replay trains within 2x one
    pass (``smallest_trace_budget``), raised by ``MARGIN`` where the replay trains there too."""
    n, _ = smallest_trace_budget(trace)
    m = math.ceil(n * (1 + MARGIN))
    return m if simulate_trace(trace, budget=m).status == "ok" else n
