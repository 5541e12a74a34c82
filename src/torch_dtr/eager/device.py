"""Device memory for the front end: what a budget bounds on a GPU, out-of-memory retry, kernel timing."""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core import Op, Runtime, Storage
from .rng import RngState

# NOTE [ Device memory ]
#
# 1. What a budget bounds. On a device whose allocator PyTorch keeps (CUDA), a budget bounds the bytes that
#    allocator has handed out in this process (``torch.cuda.memory_allocated``; its peak is
#    ``max_memory_allocated``), whoever asked for them: what users read, and what runs out. torch-dtr tracks
#    part of it (managed storages, constants its ops read); the rest is *outside* its reach: parameters and
#    buffers no managed op has read yet, optimizer state, inputs, plain tensors, the cuBLAS workspace,
#    allocator rounding. The runtime keeps ``tracked + outside`` within the budget (NOTE [ Budget
#    accounting ] 4) and a ``BudgetError`` names the outside part. On the CPU there is no allocator to ask:
#    the budget bounds tracked bytes, as before.
# 2. Never an allocator query per op. ``Device.allocated`` costs 30-360 us on an H100 (it builds PyTorch's
#    statistics dict), so the runtime learns ``outside`` from it every ``sync_every`` managed ops (64), before
#    it gives up with a ``BudgetError``, and after an out-of-memory retry. Between two queries what torch-dtr
#    allocates and frees is counted exactly (each storage rounded up to the allocator's 512 B blocks), and
#    the fresh outputs of plain ops on the device are reserved ahead as a managed op's are (their bytes
#    predicted; an optimizer's state on its first step evicts for itself, or raises a ``BudgetError`` before it
#    is allocated) and added to ``outside`` as they appear; their frees are seen at the next query, so the
#    count errs high. So does a pinned value's when its last handle dies (it may live on as an unwrapped
#    ``p.grad``). Both are guesses: a ``reserve`` that would evict for them queries first (``Runtime._dirty``;
#    without it the bench's LSTM loop on a device recomputed 40,360 ops in a step instead of 2,126).
# 3. What is guaranteed: ``tracked + outside`` as counted never passes the budget after an op. The
#    allocator's own count can pass it by what plain code allocated since the last query and did not return
#    through dispatch, and by an op's internal scratch memory, which the native front end reserves per call
#    signature where the device can measure it (NOTE [ Scratch memory ] in native/front.cpp: the simulated
#    device; not yet CUDA), and rule 6 of NOTE [ Budget accounting ] otherwise.
# 4. Out of memory, with or without a budget: PyTorch's allocator frees its cache and retries by itself
#    before it raises ``torch.OutOfMemoryError``. The front end then evicts (``OutOfMemory``): first, where
#    the device exposes its layout (``Device.segments``), the cheapest *window*, a run of adjacent blocks in
#    one segment, each free or held by an evictable storage, large enough for the request (evictions that
#    coalesce free memory, as MegEngine's and Coop's do: evicting by score alone frees scattered blocks that
#    a large request cannot use); then by the policy, until the request (at least 1 MiB) is freed. It
#    restores the op's random state, retries, and gives up (re-raising) when nothing is left to evict.
#    ``stats()`` counts ``oom_retries`` and ``oom_evicted_bytes``.
# 5. The out-of-memory-driven mode: no budget on CUDA. Nothing is evicted until the allocator fails; then
#    rule 4. Full speed until memory runs out, and the largest batches (docs/design.md, Device memory).
# 6. Fragmentation: a caching allocator's segments fill with blocks of every size, so evictions that free
#    scattered blocks leave reserved memory that a large request cannot use (an out-of-memory with 5 GiB
#    allocated and 7.9 GiB reserved, measured on an H100). ``enable()`` switches PyTorch's expandable
#    segments on for the session (``expandable_segments=None``, the default on CUDA, unless
#    ``PYTORCH_CUDA_ALLOC_CONF`` names the setting: the user decided) and back off at ``disable()``; blocks
#    allocated before keep their segments. ``expandable_segments=False`` leaves the allocator as it is.
#    A device capped at the budget (``torch.cuda.set_per_process_memory_fraction``; a ``SimulatedDevice``'s
#    capacity) holds no more than it: an allocation past it makes the allocator unmap its free pages, then rule
#    4 evicts and retries. On the simulated allocator at GPU-like page sizes every budget of the bench's models
#    that trains uncapped trains capped too, for up to 3x the recomputations (docs/fragmentation.md; the compiled
#    front end: the Python one ran out of memory on the LSTM loop). Not yet measured on CUDA.
# 7. Tested without a GPU: ``native/simdevice.SimulatedDevice`` is a caching allocator modelled after PyTorch's
#    (512 B rounding, 2 MiB and 20 MiB segments, best fit, splitting, a capacity that raises PyTorch's
#    ``OutOfMemoryError``) over the CPU allocator's blocks, behind the same ``Device`` interface.
# 8. Workspaces allocated inside ops: cuBLAS takes a workspace from PyTorch's allocator for each (handle,
#    stream) pair, handles are per thread, and autograd runs a CUDA backward on a thread of its own, so the
#    first matrix product of the first backward allocates one (32 MiB on Hopper) where no dispatch sees it.
#    Measured on an H100: the LSTM loop at 65% passed its budget by 12.0 MiB (the native front end) and 21.0
#    MiB (the Python one, on an H200), about one workspace less the room the core keeps between queries.
#    ``enable()`` with a budget runs ``Device.prepare()`` first: one small product forward and backward, so
#    both threads' workspaces exist and are counted as outside from the first query.
#
# NOTE [ Layout-aware eviction ]
#
# 1. Under a budget the policy's victims are scattered blocks: the allocated count falls, but a later request
#    larger than every hole the evictions left is served from new pages, so the device holds more than the
#    budget (reserved / budget 1.19-1.63 on the simulated allocator with expandable segments, 2026-11-29:
#    docs/fragmentation.md; 1.41-1.57 measured on an H200). MegTaiChi's answer: evict so that free memory
#    coalesces.
# 2. So where the device tells its layout cheaply (``Device.cheap_layout``), the first eviction that makes room
#    for an op evicts the cheapest window for the op's bytes first (rule 4 of Device memory's window: a run of
#    adjacent free or evictable blocks that holds them, the fewest bytes evicted), through the core's
#    ``Runtime.layout``; then the policy, as before. The window is asked once per ``reserve`` that must evict.
# 3. Measured on the simulated allocator with expandable segments (``python benchmarks/fragmentation.py``): the
#    bench's GPT-2 at 80% and 65% of plain's peak allocated bytes holds 1.05 and 1.04 x its budget instead of
#    1.19 and 1.22, for 9% and 26% more recomputations (at 50%: 1.22 instead of 1.26). The LSTM loop (1.63 at
#    65%) and ResNet-50 (1.12 at 80%) hardly change: their reserved bytes are each pool's own high-water mark
#    (small activations in the small pool, gradients and the optimizer's temporaries in the large one, whose
#    pages stay mapped), not holes. The window evicts by bytes, not by the policy's score.
# 4. Not on CUDA yet: PyTorch gives the layout only as a memory snapshot, milliseconds each; the simulated
#    device answers from its own records. A CUDA memory pool of torch-dtr's own (issue 52) would know it.
#
# NOTE [ CUDA timing ]
#
# Kernels run asynchronously, so a host clock around the call measures the launch only. With
# ``costs="time"`` each op records a pair of CUDA events; their elapsed time replaces the launch time as the
# op's cost when the end event has completed, read lazily before the next eviction decision, never
# synchronizing. An op whose outputs already sit in an evicted (union-find) component keeps its estimate, so
# that component sums stay consistent.

GRANULE = 512  # PyTorch's caching allocator rounds every block up to a multiple of this
MIN_EVICT = 1 << 20  # evict at least 1 MiB per retry: the allocator rounds and fragments
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

SMALL = 1 << 20  # requests up to this come from the allocator's small pool (its own segments)
Block = tuple[int, int, bool]  # (address, bytes, allocated)
Segment = tuple[bool, list[Block]]  # (small pool, blocks in address order)


class Device:
    """What the front end needs to know of a device's memory (NOTE [ Device memory ])."""

    name = "device"
    small = SMALL  # the allocator's small-pool limit
    cheap_layout = False  # ``segments()`` is cheap enough to ask at evictions under a budget (Layout-aware eviction)

    def owns(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in this device's memory."""
        raise NotImplementedError

    def allocated(self) -> int:
        """Bytes the allocator has handed out now (a query: never per op)."""
        return self.usage()[0]

    def usage(self) -> tuple[int, int]:
        """Bytes the allocator has handed out now, and at most since its peak was last reset (one query)."""
        raise NotImplementedError

    def reserved(self) -> int:
        raise NotImplementedError

    def max_allocated(self) -> int:
        raise NotImplementedError

    # what a compiled front end's session tells the device (no-ops but for ``CpuDevice``: NOTE [ The CPU as a device ])
    session_peak = False  # ``max_allocated`` is the session's own peak (``stats().peak_bytes`` reads it)

    def budget_set(self, budget: int | None) -> None:
        """The session's budget is now ``budget`` (None: none, or the session ended)."""

    def constant_seen(self, t: torch.Tensor, nbytes: int) -> int:
        """A constant of ``nbytes`` was counted; returns the bytes the device counts for it beside its own."""
        return 0

    def constant_gone(self, nbytes: int) -> None:
        """A constant for which ``constant_seen`` returned ``nbytes`` died."""

    def region_runs(self) -> None:
        """A compiled region was made or runs in the session."""

    def stepped(self) -> None:
        """An iteration of the program ended (an optimizer step; NOTE [ Iteration plans ])."""

    def segments(self) -> list[Segment]:
        """The allocator's layout: each segment's pool and blocks in address order (empty: unknown)."""
        return []

    def host_copies(self) -> contextlib.AbstractContextManager[None]:
        """Around the host tier's copies: what is allocated inside is not this device's memory (a simulated
        device's blocks are CPU blocks, as the copies are)."""
        return contextlib.nullcontext()

    def ready(self) -> None:
        """Raise where a session cannot follow this device yet (a SimulatedDevice not entered)."""

    def locate(self, ptr: int) -> int:
        """Where the block whose data starts at ``ptr`` lies in ``segments()``' addresses (0: not there)."""
        return ptr

    def set_expandable(self, on: bool) -> bool | None:
        """Switch expandable segments on or off for allocations from now on (rule 6); returns the setting it
        had, or None where the device has no such setting."""
        return None

    def prepare(self) -> None:
        """Before a budgeted session starts: make what the device's libraries allocate inside ops, once per
        thread, exist now, so that the allocator's count holds it from the first query (rule 8)."""

    @staticmethod
    def requested(err: BaseException) -> int:
        """The bytes a failed allocation asked for, read from PyTorch's message (0: not said)."""
        m = _TRIED.search(str(err))
        return int(float(m.group(1)) * _UNIT[m.group(2)]) if m else 0


class CudaDevice(Device):
    """One CUDA device, through PyTorch's caching allocator."""

    def __init__(self, index: int | None = None) -> None:
        self.index = torch.cuda.current_device() if index is None else index
        self.name = f"cuda:{self.index}"
        self._stats: Callable[[int], dict] | None = getattr(torch._C, "_cuda_memoryStats", None)

    def owns(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    def usage(self) -> tuple[int, int]:
        # the nested statistics straight from C, without torch.cuda.memory_stats's flattening and sorting
        if self._stats is not None:
            try:
                a = self._stats(self.index)["allocated_bytes"]["all"]
                return int(a["current"]), int(a["peak"])
            except (KeyError, TypeError, RuntimeError):
                self._stats = None
        return int(torch.cuda.memory_allocated(self.index)), int(torch.cuda.max_memory_allocated(self.index))

    def reserved(self) -> int:
        return int(torch.cuda.memory_reserved(self.index))

    def set_expandable(self, on: bool) -> bool | None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
        was = "expandable_segments:true" in conf.replace(" ", "").lower()
        # torch >= 2.11 deprecates torch.cuda.memory._set_allocator_settings for the accelerator-generic call
        setter = (getattr(torch._C, "_accelerator_setAllocatorSettings", None)
                  or torch.cuda.memory._set_allocator_settings)
        setter(f"expandable_segments:{on}")
        return was

    def max_allocated(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.index))

    def prepare(self) -> None:
        # rule 8: a matrix product forward (this thread) and backward (autograd's thread for this device)
        try:
            with torch.cuda.device(self.index), torch.enable_grad():
                a = torch.ones(8, 8, device=self.name, requires_grad=True)
                (torch.nn.functional.linear(a, a, a[0]) @ a).sum().backward()
        except RuntimeError:  # (deterministic mode without CUBLAS_WORKSPACE_CONFIG: the program's own product
            pass              # raises PyTorch's error, which says what to set)

    def segments(self) -> list[Segment]:
        try:  # torch >= 2.10: without the allocation history's stack traces (cheaper)
            snapshot = torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:
            snapshot = torch.cuda.memory_snapshot()
        out = []
        for seg in snapshot:
            if seg.get("device", self.index) != self.index:
                continue
            addr, blocks = int(seg["address"]), []
            for b in seg["blocks"]:
                size = int(b["size"])
                addr = int(b.get("address", addr))
                blocks.append((addr, size, b["state"] != "inactive"))
                addr += size
            out.append((seg.get("segment_type") == "small", blocks))
        return out


def window(segments: Sequence[Segment], evictable: dict[int, Storage], need: int,
           small: int = SMALL) -> list[Storage]:
    """What to evict so that the allocator can serve a request of ``need`` bytes, evicting the fewest bytes
    (NOTE [ Device memory ] 4): a run of adjacent blocks, each free or evictable (its address a key of
    ``evictable``), of at least ``need`` bytes in a segment of the request's pool (requests up to ``small``
    bytes have a pool of their own); else a whole segment that can be emptied, which the allocator then
    releases to reserve a new one. Empty when there is neither."""
    if need <= 0:
        return []
    best: tuple[int, list[Storage]] | None = None
    pool = need <= small
    for is_small, blocks in segments:
        if is_small != pool:
            continue
        lo, total, cost = 0, 0, 0
        for hi, (addr, size, used) in enumerate(blocks):
            s = evictable.get(addr) if used else None
            if used and s is None:  # a block nothing can free: restart after it
                lo, total, cost = hi + 1, 0, 0
                continue
            total += size
            cost += size if used else 0
            while total >= need:
                if best is None or cost < best[0]:
                    best = (cost, [evictable[a] for a, _, u in blocks[lo:hi + 1] if u])
                a, sz, u = blocks[lo]
                total -= sz
                cost -= sz if u else 0
                lo += 1
    if best is not None:
        return best[1]
    whole: tuple[int, int, list[Storage]] | None = None
    for _, blocks in segments:
        if all(not u or a in evictable for a, _, u in blocks):
            cost = sum(n for _, n, u in blocks if u)
            size = sum(n for _, n, _ in blocks)
            if cost and (whole is None or (cost, -size) < whole[:2]):
                whole = (cost, -size, [evictable[a] for a, _, u in blocks if u])
    return [] if whole is None else whole[2]


class OutOfMemory:
    """Runs an op (or a recomputation) and, when the device runs out of memory, evicts and retries
    (NOTE [ Device memory ] 4)."""

    def __init__(self, rt: Runtime, device: Device, address: Callable[[Any], int] | None = None) -> None:
        self.rt = rt
        self.device = device
        # a payload's address in the device's layout (0: none): by default a tensor's data pointer
        self.address = address or (lambda t: device.locate(t.untyped_storage().data_ptr()))

    def __call__(self, run: Callable[[], Any], need: int, rng: RngState | None) -> Any:
        while True:
            try:
                return run()
            except torch.OutOfMemoryError as e:
                if not self.evict(e, need):
                    raise
            if rng is not None:
                rng.restore()

    def evict(self, err: BaseException, need: int) -> bool:
        """Make room after ``err``: at least ``need``, the bytes the allocator was asked for, and 1 MiB.
        False when nothing was left to evict (the caller re-raises)."""
        asked = self.device.requested(err)
        first = self.victims(asked or need or MIN_EVICT)
        want = sum(s.nbytes for s in first) if first else max(need, asked, MIN_EVICT)
        return self.rt.out_of_memory(want, first) > 0

    def victims(self, need: int) -> list[Storage]:
        try:
            segments = self.device.segments()
        except RuntimeError:  # the layout is a help, not a need
            return []
        if not segments:
            return []
        by_ptr = {}
        address = self.address
        for s in self.rt.candidates:
            if not s.locks and s.payload is not None:
                a = address(s.payload)
                if a:
                    by_ptr[a] = s
        return window(segments, by_ptr, need, self.device.small)


class CudaTimer:
    """Measures op costs with CUDA events, read without synchronizing (NOTE [ CUDA timing ])."""

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
