"""The two replaceable parts of the runtime: how memory is counted, and what happens to a victim."""

from __future__ import annotations

from .records import Storage

# NOTE [ Budget accounting ]
#
# 1. Tracked bytes = bytes of resident managed storages + bytes of constant storages the front end has
#    seen as op inputs; each storage is counted once, whatever number of views point into it.
# 2. The check runs BEFORE an op runs, with the bytes of its outputs (inferred ahead by the front end)
#    included: ``Runtime.reserve(n)`` evicts until ``tracked + n <= budget``.
# 3. The guarantee: ``tracked`` never exceeds the budget after any op (peak included), or the runtime
#    raises ``BudgetError`` before running the op. Where the front end cannot know an output's size
#    before running (data-dependent shapes), it reserves an upper bound.
# 4. An optional ``extra_usage()`` callback lets a front end add a real allocator's count (CUDA):
#    eviction then also continues while that count + n would pass the budget.
# 5. Tensors without a strided storage (sparse layouts) are not managed and not counted: the eager front
#    end computes them eagerly and never evicts them.


class Memory:
    """Counts tracked bytes and their peak. Replace it to model an address space (fragmentation)."""

    __slots__ = ("tracked", "peak", "constants")

    def __init__(self) -> None:
        self.tracked = 0
        self.peak = 0
        self.constants = 0  # the part of ``tracked`` that is constants

    def alloc(self, s: Storage) -> None:
        self.tracked += s.nbytes
        if self.tracked > self.peak:
            self.peak = self.tracked

    def free(self, s: Storage) -> None:
        self.tracked -= s.nbytes

    def add_constant(self, nbytes: int) -> None:
        self.constants += nbytes
        self.tracked += nbytes
        if self.tracked > self.peak:
            self.peak = self.tracked

    def remove_constant(self, nbytes: int) -> None:
        self.constants -= nbytes
        self.tracked -= nbytes


class Drop:
    """Victim handling of plain DTR: forget the value; the recipe recomputes it on the next use.

    A swapping tier would replace it: copy the payload to a slower tier here, and bring it back instead of
    recomputing it.
    """

    def evict(self, s: Storage) -> None:
        s.payload = None
