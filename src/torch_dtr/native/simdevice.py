"""A simulated CUDA caching allocator over the CPU's memory, so that device-memory logic runs without a GPU.

    with SimulatedDevice(capacity="64MiB") as dev:      # every CPU block allocated from here on is counted
        model = Net()                                     # its parameters too
        torch_dtr.enable(budget="32MiB", device=dev)      # the budget bounds dev.allocated()
        ...
        torch_dtr.disable()
    dev.max_allocated(), dev.reserved(), dev.ooms

While it is entered, every block that PyTorch's CPU allocator hands out (whoever asks: an op's outputs, its
scratch memory, a factory, either front end) is also carved from simulated segments as PyTorch's CUDA caching
allocator carves it (NOTE [ Simulated allocator ]), and given back when the block is freed. An allocation that
does not fit in ``capacity`` raises ``torch.OutOfMemoryError`` with PyTorch's wording before the op computes
anything, as on CUDA. The allocator is the compiled front end's (simalloc.cpp, over front.cpp's CPU allocator),
so a SimulatedDevice needs it built; both front ends run on it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ..eager.device import GRANULE, SMALL, Device, Segment

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
# 5. ``expandable=True`` models expandable segments (as CUDACachingAllocator.cpp does it in 2.11): each pool has one
#    virtual range, mapped in pages (2 MiB in the small pool, 20 MiB in the large one). A request takes the best
#    fitting free block of its pool (rule 2), except that a free block of the range gives way to the next larger
#    one while that one could grow less (its size plus the unmapped range after it); blocks split as soon as
#    512 B remain, in either pool. When none fits, pages are mapped: at the lowest unmapped range (or the free
#    block just before it) where free and unmapped blocks together hold the request, only the pages it reaches.
#    A freed block merges with free neighbours and its pages stay mapped (reserved) until ``empty_cache`` or an
#    out-of-memory retry, which unmap the whole pages inside free blocks (a free block's edge pages stay). So
#    reserved bytes exceed allocated ones where freed holes are too small for later requests, as on a GPU.
#    It may be switched on at run time (as ``torch.cuda.memory._set_allocator_settings``): blocks made before
#    keep their segments, and their free blocks still serve requests.
# 6. ``scale`` multiplies every size above but the 512 B rounding (1 MiB, 2 MiB, 10 MiB, 20 MiB), so that
#    tests on small tensors meet the fragmentation that real programs meet on large ones.
# 7. What it counts: every block of PyTorch's CPU allocator while entered, an op's scratch memory included (as
#    CUDA's allocator counts a workspace), but the host tier's copies (``host_copies``: on a GPU they live in
#    host memory) and the random generator states the native front end keeps for replays (host tensors on a GPU).
#    Blocks allocated before it was entered count only through ``adopt``. One at a time per process.
# 8. It reports the most allocated during a stretch (``simalloc::window``), for NOTE [ Scratch memory ].
# 9. ``in_flight=n`` models the host tier's copies out on a side stream (NOTE [ Host copies ] 2): the copy is made
#    at once, but the device block it copies from stays allocated until the copy lands, which its event
#    (``eager.swap.Landing``) says at the tier's (n+1)-th poll, or at once when waited for. 0 (the default): copies
#    land as they are made.
# 10. ``planned=True`` models planned allocation (MegTaiChi's TMA; NOTE [ Planned allocation ] 5 in core/arena.py): the
#    blocks of each iteration (from one optimizer step to the next: ``stepped``) are recorded in order, with the bytes
#    of each and when it was allocated and freed. Once two iterations in a row made the same requests (the first steps
#    differ: the optimizer's state is made, the runtime's iteration plans settle), the first is planned as one period
#    of a cycle (NOTE [ Planned allocation ] 5) into one arena, which is reserved at once (after releasing the pools'
#    free cache, as ``empty_cache``), and followed from the next request on; where the program leaves it (counted), the
#    pools serve the rest as without a plan, the arena is given back at the iteration's end (or with its last block),
#    and a new plan waits for two iterations alike again. Blocks that live across the plan's cut or longer than an
#    iteration are the pools'. Layout-aware eviction is off on such a device: the victims it picks by address would
#    differ between the recorded iteration (blocks in the pools) and the next (blocks in the arena), and with them the
#    requests.


class SimulatedDevice(Device):
    """A CUDA-like caching allocator with a capacity, over the CPU (NOTE [ Simulated allocator ])."""

    name = "simulated"
    cheap_layout = True  # its own records (NOTE [ Layout-aware eviction ])

    def __init__(self, capacity: int | str | None = None, *, expandable: bool = False, scale: float = 1.0,
                 in_flight: int = 0, planned: bool = False) -> None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"torch_dtr: SimulatedDevice scale must be a number > 0, got {scale!r}")
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 0:
            raise ValueError(f"torch_dtr: SimulatedDevice in_flight must be an int >= 0 (polls until a copy out "
                             f"lands), got {in_flight!r}")
        self.in_flight = in_flight  # rule 9
        self.planned = bool(planned)  # rule 10
        if self.planned:  # (a victim chosen by the layout would differ once blocks sit at planned offsets: rule 10)
            self.cheap_layout = False

        def sized(n: int) -> int:
            return max(GRANULE, int(n * scale) // GRANULE * GRANULE)

        self.small = sized(SMALL)  # rule 1
        self._sizes = (self.small, sized(2 << 20), sized(20 << 20), sized(10 << 20), sized(2 << 20))  # rule 3
        from ..core.errors import parse_budget  # noqa: PLC0415

        self.capacity = parse_budget(capacity)
        self._expandable = expandable
        self.ext: Any = None  # the compiled front end's module while entered
        self._last = (0, 0, 0, 0, 0)  # the counts when it was exited
        self._plan_last = (0, 0, 0, 0)

    # ------------------------------------------------------------------ entering
    def __enter__(self) -> SimulatedDevice:
        from . import NativeUnavailable, load  # noqa: PLC0415

        try:
            ext = load()
        except NativeUnavailable as e:
            raise RuntimeError(f"torch_dtr: SimulatedDevice counts blocks in the compiled front end's CPU allocator, "
                               f"which could not be built here: {e}") from e
        # (raises where another one is entered: one at a time)
        ext.sim_start(-1 if self.capacity is None else self.capacity, self._expandable, *self._sizes, self.planned)
        ext.cpu_blocks_sim(True)
        self.ext = ext
        return self

    def __exit__(self, *exc: object) -> None:
        ext = self.ext
        if ext is None:
            return
        self._last = tuple(ext.sim_stats())
        self._plan_last = tuple(ext.sim_plan_stats())
        self._expandable = ext.sim_expandable()
        ext.sim_stop()
        ext.cpu_blocks_sim(False)
        self.ext = None

    def _stats(self) -> tuple[int, int, int, int, int]:
        return tuple(self.ext.sim_stats()) if self.ext is not None else self._last  # type: ignore[return-value]

    def _entered(self) -> Any:
        if self.ext is None:
            raise RuntimeError("torch_dtr: enter the SimulatedDevice first (`with SimulatedDevice(...) as dev:`)")
        return self.ext

    def ready(self) -> None:
        if self.ext is None:
            raise RuntimeError("torch_dtr: enter the SimulatedDevice before enabling with it (`with SimulatedDevice("
                               "...) as dev:`): it counts the blocks allocated while it is entered")

    # ------------------------------------------------------------------ Device
    def owns(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu"

    def usage(self) -> tuple[int, int]:
        a, peak, *_ = self._stats()
        return a, peak

    def reserved(self) -> int:
        return self._stats()[2]

    @property
    def peak_reserved(self) -> int:
        return self._stats()[3]

    @property
    def ooms(self) -> int:
        """Out-of-memory errors it raised."""
        return self._stats()[4]

    def max_allocated(self) -> int:
        return self._stats()[1]

    @property
    def expandable(self) -> bool:
        return bool(self.ext.sim_expandable()) if self.ext is not None else self._expandable

    def set_expandable(self, on: bool) -> bool | None:
        if self.ext is None:
            was, self._expandable = self._expandable, on
            return was
        return bool(self.ext.sim_set_expandable(on))

    def reset_peak(self) -> None:
        self._entered().sim_reset_peak()

    def segments(self) -> list[Segment]:
        return [(small, list(blocks)) for small, blocks in self.ext.sim_segments()] if self.ext is not None else []

    def locate(self, ptr: int) -> int:
        return int(self.ext.sim_locate(ptr)) if self.ext is not None and ptr else 0

    @contextlib.contextmanager
    def host_copies(self) -> Iterator[None]:
        """Blocks this thread allocates inside are host memory, not the device's (rule 7)."""
        if self.ext is None:
            yield
            return
        was = self.ext.sim_uncounted(True)
        try:
            yield
        finally:
            self.ext.sim_uncounted(was)

    def stepped(self) -> None:
        """Rule 10: an iteration ended. Where it did not follow its plan to the end, its requests are planned
        (NOTE [ Planned allocation ] in core/arena.py) and the next iteration follows that plan."""
        if self.ext is None or not self.planned:
            return
        followed, marks, requests = self.ext.sim_plan_boundary()
        if followed or len(marks) < 3:
            return
        (a, ea), (b, eb), (c, ec) = marks
        first, second = requests[: b - a], requests[b - a: c - a]
        # planned once two iterations in a row made the same requests: the same bytes, allocated at the same event
        # from their iteration's start, those of the first freed within it freed at the same event (the first
        # iterations differ: the optimizer's state is made, the runtime's iteration plans settle)
        if not first or len(first) != len(second):
            return
        for (z1, s1, e1), (z2, s2, e2) in zip(first, second, strict=True):
            if z1 != z2 or s1 - ea != s2 - eb or (0 <= e1 < eb and e2 - eb != e1 - ea):
                return
        from ..core.arena import periodic  # noqa: PLC0415

        n = len(first)
        sizes = [z for z, _s, _e in first]
        cyc = periodic(sizes, [s - ea for _z, s, _e in first], [e - ea if e >= 0 else -1 for _z, _s, e in first],
                       eb - ea)
        order = [*range(cyc.cut, n), *range(cyc.cut)]
        self.ext.sim_plan_set([sizes[i] for i in order], [cyc.offsets[i] for i in order], cyc.size, (n - cyc.cut) % n)

    @property
    def plan_stats(self) -> dict[str, int]:
        """Rule 10: iterations that followed their plan to the end, that left it; requests served from an arena;
        the arenas' bytes now."""
        st = tuple(self.ext.sim_plan_stats()) if self.ext is not None else self._plan_last
        return dict(zip(("followed", "diverged", "served", "arena_bytes"), st, strict=True))

    def empty_cache(self) -> None:
        """Release every segment that is entirely free (``torch.cuda.empty_cache``)."""
        self._entered().sim_empty_cache()

    # ------------------------------------------------------------------ the allocator itself (tests)
    def alloc(self, nbytes: int) -> tuple[int, int]:
        """A block of the simulated allocator alone, with no memory: (address, bytes counted as allocated)."""
        return tuple(self._entered().sim_alloc(int(nbytes)))  # type: ignore[return-value]

    def free(self, addr: int) -> None:
        """Free a block that ``alloc`` gave."""
        self._entered().sim_free(int(addr))

    def adopt(self, *tensors: Any) -> None:
        """Count tensors (or modules' parameters and buffers) allocated before the device was entered."""
        ext = self._entered()
        for t in tensors:
            if isinstance(t, torch.nn.Module):
                self.adopt(*t.parameters(), *t.buffers())
            elif isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type == "cpu":
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr and ext.sim_adopt(ptr, st.nbytes()):
                    weakref.finalize(st, ext.sim_forget, ptr)
