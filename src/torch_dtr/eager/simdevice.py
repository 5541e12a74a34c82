"""A simulated CUDA caching allocator over CPU tensors, so that device-memory logic runs without a GPU.

    with SimulatedDevice(capacity="64MiB") as dev:      # every CPU storage made from here on is counted
        model = Net()                                     # its parameters too
        torch_dtr.enable(budget="32MiB", device=dev)      # the budget bounds dev.allocated()
        ...
        torch_dtr.disable()
    dev.max_allocated(), dev.reserved(), dev.ooms

It is a dispatch mode: every op's fresh output storages get a block, carved as PyTorch's CUDA caching
allocator carves them (NOTE [ Simulated allocator ]), and the block is freed when the storage dies. An
allocation that does not fit in ``capacity`` raises ``torch.OutOfMemoryError`` with PyTorch's wording, after
the op ran on the CPU (its outputs are dropped, as if it had never run; the random stream did advance,
which a retry must undo, as on CUDA).
"""

from __future__ import annotations

import bisect
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import fmt_bytes
from .device import GRANULE, SMALL, Device, Segment
from .funcinfo import info
from .recipe import flat_outputs
from .rng import RngState

# NOTE [ Simulated allocator ]
#
# The parts of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) that decide allocated
# and reserved bytes and out-of-memory, and nothing else (one stream, no events, no statistics history):
# 1. Sizes are rounded up to 512 B. Requests of at most 1 MiB come from the small pool, larger ones from
#    the large pool.
# 2. A request takes the smallest free block of its pool that fits (best fit; lowest address on a tie).
#    The block is split when what remains is at least 512 B (small pool) or more than 1 MiB (large pool);
#    otherwise the whole block is handed out and counted as allocated.
# 3. When no free block fits, a new segment is reserved: 2 MiB for the small pool, 20 MiB for requests
#    under 10 MiB, else the request rounded up to 2 MiB. If the capacity would be passed, every segment
#    that is entirely free is released first (as the allocator's ``release_cached_blocks``); if it still
#    does not fit, ``OutOfMemoryError``.
# 4. A freed block merges with free neighbours in its segment.
# 5. ``expandable=True`` models expandable segments: requests made while it is set come from one segment
#    that grows and shrinks by 2 MiB pages, without fragmentation: it reserves its allocated bytes rounded
#    up to pages (kept until ``empty_cache``, as mapped pages are), and a request fits when the other
#    segments plus the pages it needs are within the capacity. It may be switched on at run time (as
#    ``torch.cuda.memory._set_allocator_settings``): blocks made before keep their segments.
# 6. ``scale`` multiplies every size above but the 512 B rounding (1 MiB, 2 MiB, 10 MiB, 20 MiB), so that
#    tests on small tensors meet the fragmentation that real programs meet on large ones.
# What it cannot see: storages made with dispatch modes disabled, and memory an op uses internally.



class _Segment:
    __slots__ = ("addr", "size", "blocks", "small")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.blocks: list[list[Any]] = [[addr, size, False]]  # [address, bytes, allocated], address order


class SimulatedDevice(TorchDispatchMode, Device):
    """A CUDA-like caching allocator with a capacity, over the CPU (NOTE [ Simulated allocator ])."""

    name = "simulated"

    def __init__(self, capacity: int | str | None = None, *, expandable: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"torch_dtr: SimulatedDevice scale must be > 0, got {scale!r}")

        def sized(n: int) -> int:
            return max(GRANULE, int(n * scale) // GRANULE * GRANULE)

        self.small = sized(SMALL)  # rule 1
        self._small_segment, self._mid_segment = sized(2 << 20), sized(20 << 20)  # rule 3
        self._large, self._page = sized(10 << 20), sized(2 << 20)
        from .api import parse_budget  # noqa: PLC0415 - api imports the front end, which imports this module

        self.capacity = parse_budget(capacity)
        self.expandable = expandable
        self.segs: list[_Segment] = []
        self.live: dict[int, tuple[_Segment | None, int]] = {}  # storage address -> (segment, block address)
        self._sizes: dict[int, int] = {}  # expandable: block address -> bytes
        self.allocated_bytes = self.peak = self.reserved_bytes = self.peak_reserved = 0
        self._exp_allocated = self._exp_reserved = 0  # rule 5: the expandable segment's bytes
        self.ooms = 0
        self._next = 1 << 40  # simulated addresses: segments never overlap

    # ------------------------------------------------------------------ Device
    def owns(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu"

    def usage(self) -> tuple[int, int]:
        return self.allocated_bytes, self.peak

    def reserved(self) -> int:
        return self.reserved_bytes

    def max_allocated(self) -> int:
        return self.peak

    def set_expandable(self, on: bool) -> bool | None:
        was, self.expandable = self.expandable, on
        return was

    def reset_peak(self) -> None:
        self.peak, self.peak_reserved = self.allocated_bytes, self.reserved_bytes

    def segments(self) -> list[Segment]:
        return [(seg.small, [(a, n, u) for a, n, u in seg.blocks]) for seg in self.segs]

    def address(self, t: torch.Tensor) -> int | None:
        """The simulated address of ``t``'s storage (None: not allocated here)."""
        entry = self.live.get(t.untyped_storage().data_ptr())
        return None if entry is None else entry[1]

    # ------------------------------------------------------------------ the allocator
    def alloc(self, nbytes: int) -> tuple[_Segment | None, int, int]:
        """A block for ``nbytes``: (segment, address, bytes counted as allocated)."""
        size = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        if self.expandable:
            pages = -(-(self._exp_allocated + size) // self._page) * self._page
            if pages > self._exp_reserved:
                if self.capacity is not None and self.reserved_bytes - self._exp_reserved + pages > self.capacity:
                    self.empty_cache()
                    if self.reserved_bytes - self._exp_reserved + pages > self.capacity:
                        self._oom(size)
                self.reserved_bytes += pages - self._exp_reserved
                self._exp_reserved = pages
                self.peak_reserved = max(self.peak_reserved, self.reserved_bytes)
            self._exp_allocated += size
            addr, self._next = self._next, self._next + size
            return self._count(None, addr, size)
        small = size <= self.small
        fit = self._best_fit(small, size)
        if fit is None:
            if small:
                seg_size = self._small_segment
            else:
                seg_size = self._mid_segment if size < self._large else -(-size // self._page) * self._page
            if self.capacity is not None and self.reserved_bytes + seg_size > self.capacity:
                self.empty_cache()
                if self.reserved_bytes + seg_size > self.capacity:
                    self._oom(size)
            seg = _Segment(self._next, seg_size, small)
            self._next += seg_size + self._page
            self.segs.append(seg)
            self.reserved_bytes += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved_bytes)
            fit = (seg, 0)
        seg, k = fit
        addr, bsize, _ = seg.blocks[k]
        rest = bsize - size
        if rest >= GRANULE if seg.small else rest > self.small:
            seg.blocks[k:k + 1] = [[addr, size, True], [addr + size, rest, False]]
        else:
            seg.blocks[k][2] = True
            size = bsize
        return self._count(seg, addr, size)

    def _count(self, seg: _Segment | None, addr: int, size: int) -> tuple[_Segment | None, int, int]:
        self.allocated_bytes += size
        self.peak = max(self.peak, self.allocated_bytes)
        return seg, addr, size

    def _best_fit(self, small: bool, size: int) -> tuple[_Segment, int] | None:
        best = None
        for seg in self.segs:
            if seg.small != small:
                continue
            for k, (addr, n, used) in enumerate(seg.blocks):
                if not used and n >= size and (best is None or (n, addr) < best[0]):
                    best = ((n, addr), seg, k)
        return None if best is None else (best[1], best[2])

    def free(self, seg: _Segment | None, addr: int) -> None:
        if seg is None:  # expandable
            size = self._sizes.pop(addr)
            self.allocated_bytes -= size
            self._exp_allocated -= size
            return
        k = bisect.bisect_left([b[0] for b in seg.blocks], addr)
        block = seg.blocks[k]
        self.allocated_bytes -= block[1]
        block[2] = False
        if k + 1 < len(seg.blocks) and not seg.blocks[k + 1][2]:  # merge with the next
            block[1] += seg.blocks.pop(k + 1)[1]
        if k > 0 and not seg.blocks[k - 1][2]:  # and with the previous
            seg.blocks[k - 1][1] += seg.blocks.pop(k)[1]

    def empty_cache(self) -> None:
        """Release every segment that is entirely free (``torch.cuda.empty_cache``)."""
        keep = [s for s in self.segs if len(s.blocks) > 1 or s.blocks[0][2]]
        self.reserved_bytes -= sum(s.size for s in self.segs if s not in keep)
        self.segs = keep
        pages = -(-self._exp_allocated // self._page) * self._page  # unmap the expandable segment's free pages
        self.reserved_bytes -= self._exp_reserved - pages
        self._exp_reserved = pages

    def _oom(self, size: int) -> None:
        self.ooms += 1
        cap = self.capacity or 0
        raise torch.OutOfMemoryError(
            f"Simulated device out of memory. Tried to allocate {fmt_bytes(size)}. The simulated device has a "
            f"total capacity of {fmt_bytes(cap)}, of which {fmt_bytes(self.allocated_bytes)} is allocated by "
            f"PyTorch, and {fmt_bytes(self.reserved_bytes - self.allocated_bytes)} is reserved by PyTorch but "
            f"unallocated.")

    # ------------------------------------------------------------------ watching storages
    def adopt(self, *tensors: Any) -> None:
        """Count tensors (or modules' parameters and buffers) made before the simulator was entered."""
        for t in tensors:
            if isinstance(t, torch.nn.Module):
                self.adopt(*t.parameters(), *t.buffers())
            elif isinstance(t, torch.Tensor):
                self._watch([t])

    def _watch(self, outs: list[Any]) -> None:
        new = []
        seen = set()
        for o in outs:
            if not isinstance(o, torch.Tensor) or o.layout != torch.strided or o.device.type != "cpu":
                continue
            st = o.untyped_storage()
            ptr = st.data_ptr()
            if ptr == 0 or ptr in self.live or ptr in seen:
                continue
            seen.add(ptr)
            new.append((st, ptr))
        done = []
        try:
            for st, ptr in new:
                done.append((st, ptr, self.alloc(st.nbytes())))
        except torch.OutOfMemoryError:
            for _, _, (seg, addr, _) in done:
                self.free(seg, addr)
            raise
        for st, ptr, (seg, addr, size) in done:
            if seg is None:
                self._sizes[addr] = size
            self.live[ptr] = (seg, addr)
            weakref.finalize(st, self._died, ptr, seg, addr)

    def _died(self, ptr: int, seg: _Segment | None, addr: int) -> None:
        entry = self.live.get(ptr)
        if entry is not None and entry[1] == addr:
            del self.live[ptr]
            self.free(seg, addr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        fi = info(func)
        # on CUDA an allocation fails before the kernel draws: undo the draw of a random op that ran here
        rng = RngState.before(args, kwargs) if fi.random and fi.fresh and self.capacity is not None else None
        out = func(*args, **kwargs)
        if fi.fresh:
            try:
                self._watch(flat_outputs(out))
            except torch.OutOfMemoryError:
                del out  # as if the allocation had failed before the kernel
                if rng is not None:
                    rng.restore()
                raise
        return out
