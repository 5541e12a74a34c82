"""A traced iteration's allocations at a budget, and the arena a plan needs for them (NOTE [ Planned allocation ]).

    arena_for_trace(read_trace("step.trace"), ratio=0.5)   # -> ArenaOutcome(max_live, planned, first_fit, ...)

The trace is replayed (sim/trace.py) through a ``Memory`` that writes down when each managed storage is
allocated (made by an op, recomputed) and freed (evicted, released): each such span is one request. Constants
(parameters, inputs) live outside the arena and are left out, as a planned allocator leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import Storage
from ..core.arena import Request, check, first_fit, max_live, plan
from ..core.errors import BudgetError
from ..core.memory import Memory
from .replay import THRASH_AT, budget_for
from .trace import Trace, TraceReplay, _Thrash, trace_peak, trace_runtime


class Recording(Memory):
    """Counts as ``Memory`` does, and keeps each storage's allocation spans as ``Request``s (event numbers). A
    write that made a new version in the old one's buffer (``Runtime.new_version`` without a copy) moves the
    bytes without an alloc or a free: the span goes on until the version holding the buffer is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0
        self.open: dict[Any, tuple[int, int, Storage]] = {}  # sid (or a moved buffer's key) -> (start, bytes, s)
        self.moved = 0
        self.requests: list[Request] = []
        self.managed_peak = 0  # the most managed bytes resident at once, as the runtime counted them

    def alloc(self, s: Storage) -> None:
        super().alloc(s)
        self.t += 1
        if s.sid in self.open:  # its buffer went to a newer version, which frees it later
            self.moved += 1
            self.open[("moved", self.moved)] = self.open.pop(s.sid)
        self.open[s.sid] = (self.t, s.nbytes, s)
        self.managed_peak = max(self.managed_peak, self.tracked - self.constants)

    def free(self, s: Storage) -> None:
        super().free(s)
        self.t += 1
        key = s.sid if s.sid in self.open else self._holder(s)
        start, nbytes, _ = self.open.pop(key)
        self.requests.append(Request(start, self.t, nbytes))

    def _holder(self, s: Storage) -> Any:
        """The open span whose buffer moved to ``s``: of the storages whose newer versions include ``s``, the
        nearest (an older one's own buffer went elsewhere: it was copied, or freed and made again)."""
        best, near = None, None
        for key, (_start, _n, o) in self.open.items():
            x, d = o.forward, 1
            while x is not None and x is not s:
                x, d = x.forward, d + 1
            if x is s and (near is None or d < near):
                best, near = key, d
        if best is None:
            raise KeyError(f"torch_dtr: {s} freed without an allocation")
        return best

    def close(self) -> list[Request]:
        """Every request, those still live at the end ending one event after the last."""
        end = self.t + 1
        return self.requests + [Request(start, end, n) for start, n, _s in self.open.values()]


@dataclass(frozen=True)
class ArenaOutcome:
    status: str  # "ok", or why the replay stopped ("oom", "thrash"): the arena is then of what ran
    budget: int | None
    requests: int
    max_live: int  # the most managed bytes live at once: no arena is smaller
    planned: int  # the arena NOTE [ Planned allocation ] 2 plans
    first_fit: int  # the arena an allocator without a plan needs (rule 4)


def arena_for_trace(trace: Trace, *, ratio: float | None = None, budget: int | None = None,
                    policy: str | None = None, thrash_at: float | None = THRASH_AT) -> ArenaOutcome:
    """Replay ``trace`` at ``budget`` (or ``ratio`` x its peak; neither: no budget) and plan its requests."""
    if ratio is not None or budget is not None:
        budget = budget_for(ratio, budget, lambda: trace_peak(trace), "arena_for_trace")
    mem = Recording()
    rt = trace_runtime(trace, budget, policy, memory=mem)
    status = "ok"
    try:
        TraceReplay(trace, rt, thrash_at).run()
    except _Thrash:
        status = "thrash"
    except BudgetError:  # nothing left to evict
        status = "oom"
    requests = mem.close()
    live = max_live(requests)
    if live != mem.managed_peak:  # (the spans must add up to the runtime's own count at every event)
        raise AssertionError(f"torch_dtr: the requests of {trace.source} peak at {live} B live where the runtime "
                             f"counted {mem.managed_peak} B")
    planned = plan(requests)
    check(requests, planned)
    return ArenaOutcome(status, budget, len(requests), live, planned.size, first_fit(requests).size)


def describe(o: ArenaOutcome) -> dict[str, Any]:
    return {"status": o.status, "budget": o.budget, "requests": o.requests, "max_live": o.max_live,
            "planned": o.planned, "first_fit": o.first_fit,
            "planned_ratio": o.planned / o.max_live if o.max_live else 1.0,
            "first_fit_ratio": o.first_fit / o.max_live if o.max_live else 1.0}
