"""The CPU as a device: a budget on what the process holds in tensors, not only on what torch-dtr tracks.

    torch_dtr.enable(budget="2GiB", device="cpu")   # or device=torch_dtr.CpuDevice()

# NOTE [ The CPU as a device ]
#
# 1. Without a device, a CPU budget bounds the bytes torch-dtr tracks: managed values and the constants (parameters,
#    inputs) that managed ops read. An optimizer's state, the gradients it reads and plain tensors lie outside it:
#    AdamW's two moments alone are twice the parameters (the bench's GPT-2 held 412 MiB over its base under a 209 MiB
#    budget, 178 MiB of them AdamW's state; docs/cpu-device.md).
# 2. With ``CpuDevice`` the budget bounds what CUDA's bounds (NOTE [ Device memory ]): every block the compiled front
#    end's CPU allocator (``Blocks``, NOTE [ Native front end ] 7) has handed out and not taken back, whoever asked
#    (managed ops, an optimizer's update, plain code, an op's scratch memory), plus the constants made before the
#    session (not the allocator's blocks) once a managed op reads them. The core learns what it does not track
#    from ``usage()`` as on CUDA (``Runtime.sync``), and plain ops' fresh outputs count at once (front.cpp,
#    ``g_count_plain`` 2: bytes as asked, no 512-byte rounding).
# 3. So the process's resident tensor memory stays near the budget: freed blocks the allocator keeps for reuse are
#    bounded by the most it handed out at once (rule 7 there), which the budget bounds. Not counted: the C heap
#    (the kernel's recipes: 8.6 MiB more than plain PyTorch's over one forward of the LSTM loop, 7,000 ops a step;
#    Python objects 1.3 MiB), a page of rounding on each block the C library maps for it alone, tensors made
#    before the session that no managed op reads, and what is no tensor memory: the pages of libraries' code a
#    step runs for the first time (11-18 MiB; plain PyTorch's 11-13) and torch-dtr's own modules, C++ extension
#    and session (about 11 MiB). Measured (docs/cpu-device.md): RSS over the base less those two, 0.88-0.89x the
#    budget on the bench's GPT-2, 0.94-0.96x on a transformer encoder, 0.99x on the LSTM loop (with them: 0.93x,
#    0.97-1.00x, 1.18-1.21x). Mapping each large block as pages of its own, counted whole, was tried (2026-11-30):
#    2-3 MiB less on the LSTM loop, but its steps 0-6% and GPT-2's 7-11% slower (page faults on fresh mappings
#    where the C library reuses its heap), so not kept.
# 4. The compiled front end only (the Python one does not install ``Blocks``); no host tier (its copies would be
#    CPU memory too, counted against the same budget); no learned budgets (NOTE [ Learned budgets ] 4).
# 5. ``stats().peak_bytes`` is the most counted at once since the session began (or ``reset_peak()``): the
#    allocator's own peak, closed each time the constants beside it change (``add_foreign``). The core's own count
#    adds plain ops' outputs at once but learns of their deaths only at its next query, so its peak can read above
#    what was ever held (the bench's GPT-2 under 600 MiB: 708 MiB by the core's count, 600 MiB held).
# 6. As on CUDA, what factory ops make (``torch.zeros_like`` in an optimizer's first step: AdamW's moments) and an
#    op's scratch memory reach the core's count only at its next query: alone, the count would let the first step
#    pass the budget by them (warned; kept free from then on, ``Runtime.headroom``). Rule 7 refuses it instead.
# 7. So the allocator's capacity is the budget less those constants (``cap``; lifted by ``disable()``): a block
#    beyond it raises PyTorch's OutOfMemoryError inside the op, and the op evicts and runs again, as on an
#    out-of-memory on CUDA (NOTE [ Native front end ] 8; ``stats().oom_retries``). A constant is counted after the
#    room for it is made (``Session._see``). With it no budget of docs/cpu-device.md was passed (by 8.4-48.3 MiB in
#    first steps without it), for 0-8 refusals, and a transformer encoder that raised a BudgetError under 560 MiB
#    without it trains there. A block asked for outside an op that can run again (a plain random op, Python code
#    between ops) raises the OutOfMemoryError to the program, naming the capacity. It binds only the threads whose
#    ops the session manages (front.cpp, ``g_blocks_cap_session``): a thread not ``attach()``ed allocates as
#    without torch-dtr, its blocks counted (rule 2).
# 8. Compiled regions (torch.compile with inductor) allocate in their kernels, forward and backward, outside any op
#    the session can run again: once a region is made under the session, the capacity is lifted for the rest of it
#    (``region_runs``), and the region's plan keeps its memory within the budget (NOTE [ Compiled regions under a
#    budget ], with the constants above in its measured peaks), as rule 6 counts the rest. So does a region made
#    before the session when it first runs in it (dynamo reuses its code for a new module; ``region.CALLED``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..eager.device import Device


class CpuDevice(Device):
    """The CPU's tensor memory as a device whose count the budget bounds (NOTE [ The CPU as a device ])."""

    name = "cpu"
    session_peak = True  # rule 5

    def __init__(self) -> None:
        self.ext: Any = None
        self.foreign = 0  # bytes of counted constants that are not the allocator's blocks (rule 2)
        self.budget: int | None = None  # what the allocator's capacity follows (rule 7)
        self._peak = 0  # the most counted (blocks and those constants) up to the last change of ``foreign``
        self.soft = False  # a compiled region was made: no capacity from then on (rule 8)

    def ready(self) -> None:
        from . import NativeUnavailable, load  # noqa: PLC0415

        try:
            self.ext = load()
        except NativeUnavailable as e:
            raise RuntimeError(f"torch_dtr: device='cpu' counts the compiled front end's CPU allocator, which could "
                               f"not be built here: {e}") from e
        self.foreign = 0
        self.soft = False
        self.reset_peak()

    def reset_peak(self) -> None:
        self._peak = 0
        self.ext.cpu_blocks_reset_peak()

    def budget_set(self, budget: int | None) -> None:
        self.cap(budget)

    def constant_seen(self, t: torch.Tensor, nbytes: int) -> int:
        if self.ext.cpu_blocks_owns(t):  # counted as a block already
            return 0
        self.add_foreign(nbytes)
        return nbytes

    def constant_gone(self, nbytes: int) -> None:
        self.add_foreign(-nbytes)

    def add_foreign(self, nbytes: int) -> None:
        """Constants beside the blocks were counted (``nbytes`` > 0) or died: the peak so far is closed at the old
        count (the allocator's own peak starts again), and the capacity follows (rule 7)."""
        _, peak = self.ext.cpu_blocks_usage()
        self._peak = max(self._peak, int(peak) + self.foreign)
        self.ext.cpu_blocks_reset_peak()
        self.foreign += nbytes
        self.recap()

    def cap(self, budget: int | None) -> None:
        """Rule 7: the allocator refuses a block that would take its count past ``budget`` (None: no capacity)."""
        self.budget = budget
        region = sys.modules.get("torch_dtr.inductor.region")  # regions made before may run in this session
        if region is not None:
            if budget is not None and self.region_runs not in region.CALLED:
                region.CALLED.append(self.region_runs)
            elif budget is None and self.region_runs in region.CALLED:
                region.CALLED.remove(self.region_runs)
        self.recap()

    def recap(self) -> None:
        """The capacity again, after the constants counted beside the blocks changed."""
        if self.ext is not None:
            off = self.budget is None or self.soft
            n = -1 if off else max(0, self.budget - self.foreign)  # type: ignore[operator]
            self.ext.cpu_blocks_capacity(n, session_only=True)

    def region_runs(self) -> None:
        """Rule 8: no capacity for the rest of the session (a compiled region was made or runs)."""
        if not self.soft and self.budget is not None:
            self.soft = True
            self.recap()

    def owns(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu"


    def usage(self) -> tuple[int, int]:
        now, peak = self.ext.cpu_blocks_usage()
        return int(now) + self.foreign, max(self._peak, int(peak) + self.foreign)

    def max_allocated(self) -> int:
        return self.usage()[1]

    def reserved(self) -> int:
        """Handed out and kept for reuse: what the allocator holds of the process's memory."""
        return int(self.ext.cpu_blocks_usage()[0]) + int(self.ext.cpu_blocks_kept()[0]) + self.foreign
