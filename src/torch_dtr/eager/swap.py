"""The host tier of a live session: evicted values copied to host memory and back (NOTE [ Swapping ] in
``core/swap.py``; NOTE [ Host copies ] here)."""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
from collections import deque
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..core import Storage, Tier
from ..core.errors import parse_budget

# NOTE [ Host copies ]
#
# 1. A copy is of the payload's whole storage, as bytes, and remembers the payload's dtype and geometry: the
#    value comes back as a tensor with the same offset, sizes and strides over a fresh storage, which is
#    all a recomputed payload is.
# 2. CUDA: the copy out runs on a side stream after the compute stream's work so far (the value may still
#    be being computed), into pinned host memory; the device tensor is kept alive until the copy's event
#    has completed, and its bytes count as in flight (``Tier.pending``) until then, so the budget holds
#    device memory with the copies in flight; ``settle`` polls the events, or waits for them when the
#    budget needs the bytes. The copy back runs on the compute stream, after that event, from pinned
#    memory (asynchronous; PyTorch keeps the pinned block until the copy has run). Copies out overlap
#    compute, so only copies back are charged (``Tier.out_free``).
# 3. The CPU (and ``SimulatedDevice``): plain synchronous copies into tensors that no dispatch mode sees (a
#    simulated device does not count them: ``Device.host_copies``); both directions are charged. A simulated
#    device with ``in_flight`` keeps each copy's device block as rule 2 does, until its simulated event lands. This
#    tier saves no RAM on the CPU: it exists so that every path of swapping runs in CI, with a host budget of its
#    own.
# 4. Modelled bandwidths (bytes per second of modelled cost, as NOTE [ Modelled costs ]): 25 GB/s to a GPU
#    (PCIe 4.0/5.0 x16 with pinned memory, rounded down), 2.5 GB/s on the CPU (a copy reads and writes each
#    byte at ``costs.RATES``' 5 GB/s). ``swap_gbps`` overrides them.
# 5. The host budget: ``host_budget`` bytes, by default half of the machine's physical memory.
# 6. Recomputing an op costs more than its modelled kernel: the runtime's Python path per op (35 us on these
#    2-core CPUs, about 80 us on an H200's host). The choice between copying and recomputing adds it to every
#    recipe it counts (``Tier.per_op``); the policy's scores and the clock do not.
# 7. A copy back allocates on the device, which may be full although the budget holds (fragmentation, a
#    device whose allocator runs out before the budget, or no budget at all: evictions on out-of-memory
#    only): it evicts and retries through the front end's ``device.OutOfMemory``, as an op or a recipe does.
# 8. Tenants (NOTE [ Tenants ]) share the session's host budget: each tenant's tier counts its copies into
#    one ``HostPool``, and a copy is made only where the pool has room (a tier frees its own spare copies
#    first, never another tenant's). First come, first served: shares divide the device budget only.

BANDWIDTH = {"cuda": 25e9, "cpu": 2.5e9}
# rule 6: what torch-dtr's Python path adds to each recomputed op (docs/dispatch.md, docs/benchmarks-cuda.md)
PER_OP = {"cuda": 80e-6, "cpu": 35e-6}
SIDE_STREAM = True  # rule 2: copies out on a side stream (False: on the compute stream, no copies in flight)


def default_host_budget() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): 8 GiB
        return 8 << 30


def tier_options(swap: bool | str, host_budget: int | str | None, swap_gbps: float | None, cuda: bool,
                 who: str = "torch_dtr") -> tuple[bool, int | None, float | None]:
    """``enable``'s host-tier arguments, checked: whether there is a tier, its host budget in bytes (rule 5) and
    its bandwidth in GB/s (None: the device's default, rule 4). ``cuda``: what ``swap="auto"``
    means. ``who`` names the front end in the messages."""
    if swap not in (True, False, "auto"):
        raise ValueError(f"{who}: swap must be True, False or 'auto' (on for CUDA devices), got {swap!r}")
    host = parse_budget(host_budget)
    if swap_gbps is not None and (isinstance(swap_gbps, bool) or not isinstance(swap_gbps, numbers.Real)
                                  or not swap_gbps > 0):
        raise ValueError(f"{who}: swap_gbps must be a bandwidth in GB/s > 0 (e.g. 25), got {swap_gbps!r}")
    if swap is False and (host_budget is not None or swap_gbps is not None):
        raise ValueError(f"{who}: host_budget and swap_gbps set the host tier, which is off: pass swap=True "
                         f"(or swap='auto') with them")
    on = cuda if swap == "auto" else bool(swap)
    if on and host is None:
        host = default_host_budget()
    return on, host, None if swap_gbps is None else float(swap_gbps)


def banish_default(swap: bool, budget: int | None, host: int | None, depth: int) -> int:
    """NOTE [ Swapping ] 8: a host tier that can hold what banishing would pin copies it out instead (depth 0);
    else ``depth``."""
    return 0 if swap and (budget is None or host is None or host >= budget) else depth


class HostPool:
    """The host budget the tiers of a session's tenants share (rule 8): bytes held by all of them."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.used = 0
        self.lock = threading.Lock()  # tenants run on threads of their own, each under its own front end's lock

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.used += nbytes


class Landing:
    """A simulated copy out's event (NOTE [ Simulated allocator ] 9): landed after ``polls`` queries, or once
    waited for."""

    __slots__ = ("left",)

    def __init__(self, polls: int) -> None:
        self.left = polls

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0

    def synchronize(self) -> None:
        self.left = -1


class HostTier(Tier):
    """Copies to host memory: pinned and asynchronous from CUDA, plain on the CPU (NOTE [ Host copies ])."""

    def __init__(self, cuda: bool, budget: int | None, bandwidth: float | None = None,
                 pool: HostPool | None = None) -> None:
        kind = "cuda" if cuda else "cpu"
        super().__init__(budget, bandwidth or BANDWIDTH[kind], out_free=cuda, per_op=PER_OP[kind])
        self.pool = pool if pool is not None else HostPool(budget)
        self.cuda = cuda
        self.stream: Any = None  # the side stream of copies out, made at the first one
        self.flight: deque[tuple[Any, torch.Tensor, int]] = deque()  # (event, device tensor kept alive, bytes)
        self.oom: Any = None  # the front end's device.OutOfMemory: a copy back that runs out evicts and retries
        self.device: Any = None  # the front end's Device (its host_copies() around copies)

    # rule 8: the pool's room, not this tier's alone
    def free_bytes(self) -> float:
        pool = self.pool
        return float("inf") if pool.budget is None else pool.budget - pool.used + self.spare_bytes

    def hold(self, s: Storage) -> None:
        pool = self.pool
        if pool.budget is not None:
            while pool.used + s.nbytes > pool.budget and self.spare:
                self.drop(next(iter(self.spare)))
        super().hold(s)
        pool.add(s.nbytes)

    def drop(self, s: Storage) -> None:
        n = s.nbytes
        super().drop(s)
        self.pool.add(-n)

    def copy_out(self, s: Storage) -> Any:
        p: torch.Tensor = s.payload
        with _disable_current_modes(), torch.no_grad():
            src = torch.empty(0, dtype=torch.uint8, device=p.device).set_(p.untyped_storage())
            host, event = self.copy_bytes_out(src, p, s.nbytes)
        return host, event, p.dtype, p.storage_offset(), tuple(p.size()), tuple(p.stride()), p.device

    def copy_in(self, s: Storage) -> Any:
        host, event, dtype, offset, size, stride, device = s.host

        def run() -> torch.Tensor:
            with torch.no_grad():
                flat = self.copy_bytes_in(host, event, device)
                return torch.empty(0, dtype=dtype, device=device).set_(flat.untyped_storage(), offset, size, stride)

        # rule 7: the device may be full although the budget holds
        return run() if self.oom is None else self.oom(run, s.nbytes, None)

    # the copies themselves, of a storage's bytes (also the native front end's: native/swap.py)
    def copy_bytes_out(self, src: torch.Tensor, keep: Any, nbytes: int) -> tuple[torch.Tensor, Any]:
        """A host copy of the bytes ``src`` (a uint8 tensor), and the event that says it landed (CUDA); ``keep``
        holds the device memory until then."""
        event = None
        if self.cuda and src.device.type == "cuda":
            host = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=True)
            if SIDE_STREAM:
                if self.stream is None:
                    self.stream = torch.cuda.Stream(src.device)
                self.stream.wait_stream(torch.cuda.current_stream(src.device))
                with torch.cuda.stream(self.stream):
                    host.copy_(src, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(self.stream)
                self.flight.append((event, keep, nbytes))
                self.pending += nbytes
            else:  # in the compute stream's order: the device block may be reused by what follows at once
                host.copy_(src, non_blocking=True)
        else:
            with self.device.host_copies() if self.device is not None else contextlib.nullcontext():
                host = src.clone()  # host memory (a simulated device counts CPU blocks: NOTE [ Simulated allocator ] 7)
            polls = getattr(self.device, "in_flight", 0)
            if polls:  # a simulated device's copies in flight (NOTE [ Simulated allocator ] 9): as on CUDA above
                event = Landing(polls)
                self.flight.append((event, keep, nbytes))
                self.pending += nbytes
        return host, event

    @staticmethod
    def copy_bytes_in(host: torch.Tensor, event: Any, device: torch.device) -> torch.Tensor:
        """The bytes of a host copy, back on ``device`` (a fresh allocation a simulated device counts:
        ``to(copy=True)`` below autograd is an alias op)."""
        if event is not None and device.type == "cuda":
            torch.cuda.current_stream(device).wait_event(event)
        flat = torch.empty(host.numel(), dtype=torch.uint8, device=device)
        flat.copy_(host, non_blocking=device.type == "cuda")
        return flat

    def settle(self, wait: bool) -> None:
        flight = self.flight
        while flight:
            event, _, nbytes = flight[0]
            if wait:
                event.synchronize()
            elif not event.query():
                break
            flight.popleft()
            self.pending -= nbytes
