"""The two replaceable parts of the runtime: how memory is counted, and what happens to a dropped victim."""

from __future__ import annotations

from typing import Any

from .records import Storage

try:  # only the compiled core reads it (NOTE [ Compiled core ]); interpreted, it is a no-op
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with mypy

    def mypyc_attr(*_args: object, **_kw: object) -> Any:  # type: ignore  # noqa: PGH003
        return lambda cls: cls

# NOTE [ Budget accounting ]
#
# 1. Tracked bytes = bytes of resident managed storages + bytes of constant storages the front end has
#    seen as op inputs; each storage is counted once, whatever number of views point into it.
# 2. The check runs BEFORE an op runs, with the bytes of its outputs (inferred ahead by the front end)
#    included: ``Runtime.reserve(n)`` evicts until ``tracked + n <= budget``.
# 3. The guarantee: ``tracked`` never exceeds the budget after any op (peak included), or the runtime
#    raises ``BudgetError`` before running the op. Where the front end cannot know an output's size
#    before running (data-dependent shapes), it reserves an upper bound.
# 4. On a device with an allocator of its own (CUDA), a budget bounds what that allocator has handed out in
#    the process, whoever asked for it (``torch.cuda.memory_allocated``): ``used = tracked + outside``, where
#    ``outside`` is the device's bytes that the runtime does not track (parameters no managed op has read yet,
#    optimizer state, plain tensors, workspaces, allocator rounding). The front end learns it from the
#    allocator rarely (``Runtime.sync``), never per op: NOTE [ Device memory ] in ``eager/device.py``. With
#    no device (the CPU, replays of operator logs), ``outside`` stays 0 and the budget bounds tracked bytes.
# 5. Tensors without a strided storage (sparse layouts) are not managed and not counted: the eager front
#    end computes them eagerly and never evicts them.
# 6. Between two syncs the count can miss device bytes (a block the allocator did not split, a kernel's scratch
#    memory, a plain tensor still holding a released storage's memory). When a sync finds the allocator's
#    peak above the budget, the excess is added to ``Runtime.headroom`` (at most a quarter of the budget),
#    which ``reserve`` keeps free from then on: the budget is kept, after a first excess that is measured (said
#    once in a warning, and in ``Stats.excess_bytes``). What front ends reserve ahead so that it does not happen:
#    plain ops' outputs, and scratch memory where the device can measure it (NOTE [ Scratch memory ]).


@mypyc_attr(allow_interpreted_subclasses=True)  # front ends subclass it
class Memory:
    """Counts tracked bytes and their peak. Replace it to model an address space (fragmentation)."""

    __slots__ = ("tracked", "peak", "constants", "outside")

    def __init__(self) -> None:
        self.tracked = 0
        self.peak = 0  # the largest ``tracked + outside`` seen
        self.constants = 0  # the part of ``tracked`` that is constants
        self.outside = 0  # the device's bytes in use that are not tracked (rule 4), as last learned

    def alloc(self, s: Storage) -> None:
        self.tracked += s.nbytes
        if self.tracked + self.outside > self.peak:
            self.peak = self.tracked + self.outside

    def set_outside(self, nbytes: int) -> None:
        self.outside = nbytes
        if self.tracked + nbytes > self.peak:
            self.peak = self.tracked + nbytes

    def free(self, s: Storage) -> None:
        self.tracked -= s.nbytes

    def add_constant(self, nbytes: int) -> None:
        self.constants += nbytes
        self.tracked += nbytes
        if self.tracked + self.outside > self.peak:
            self.peak = self.tracked + self.outside

    def remove_constant(self, nbytes: int) -> None:
        self.constants -= nbytes
        self.tracked -= nbytes


class Drop:
    """Victim handling of plain DTR: forget the value; the recipe recomputes it on the next use. (Copying a
    victim to host memory instead is the runtime's choice, with a ``Tier``: NOTE [ Swapping ].)"""

    def evict(self, s: Storage) -> None:
        s.payload = None
