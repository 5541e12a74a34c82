"""Device specifics of the front end: out-of-memory retry and kernel timing on CUDA."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..core import Op, Runtime
from .rng import RngState

# NOTE [ CUDA ]
#
# 1. Budget: on CUDA the runtime also reads the caching allocator's count
#    (``torch.cuda.memory_allocated``, ``Runtime.extra_usage``): eviction continues while either the
#    tracked bytes or the allocator's bytes, plus the op's outputs, would pass the budget.
# 2. Out of memory: when the allocator still raises ``torch.OutOfMemoryError`` for an op or a
#    recomputation (fragmentation, memory the runtime does not see), the front end evicts by the policy
#    (``Runtime.evict_some``) at least the bytes the op asked for, restores the random state the op
#    started from, and runs it again; once nothing is left to evict, the error propagates.
# 3. Timing: kernels run asynchronously, so a host clock around the call measures the launch only. Each
#    op records a pair of CUDA events; their elapsed time replaces the launch time as the op's cost when
#    the end event has completed, read lazily before the next eviction decision, never synchronizing.
#    An op whose outputs already sit in an evicted (union-find) component keeps its estimate, so that
#    component sums stay consistent.
#
# No GPU was available while this was written: points 2 and 3 are exercised on CPU only through their
# code paths' absence (``Front.cuda`` is False there). See docs/design.md.

_MIN_EVICT = 1 << 20  # evict at least 1 MiB per retry: the allocator rounds and fragments


def retry_on_oom(rt: Runtime, run: Callable[[], Any], need: int, rng: RngState | None) -> Any:
    """``run()``; on ``OutOfMemoryError`` evict by the policy and try again until nothing is left."""
    while True:
        try:
            return run()
        except torch.OutOfMemoryError:
            if rt.evict_some(max(need, _MIN_EVICT)) == 0:
                raise
        if rng is not None:
            rng.restore()


class CudaTimer:
    """Measures op costs with CUDA events, read without synchronizing (NOTE [ CUDA ] 3)."""

    def __init__(self) -> None:
        self.pending: deque[tuple[Op, torch.cuda.Event, torch.cuda.Event]] = deque()

    @staticmethod
    def start() -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, op: Op | None, start: torch.cuda.Event) -> None:
        if op is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((op, start, end))

    def resolve(self, rt: Runtime) -> None:
        pending = self.pending
        while pending:
            op, a, b = pending[0]
            if not b.query():  # events on one stream complete in order
                return
            pending.popleft()
            rt.set_cost(op, a.elapsed_time(b) / 1e3)
