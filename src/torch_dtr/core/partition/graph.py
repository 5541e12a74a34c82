"""What the partition planner reads: one traced iteration as tensors and ops, and the placements of a tensor
across devices with what converting between them costs. Imports no torch.

# NOTE [ Placements ]
#
# 1. A tensor on D devices is replicated (``R``: every device holds it whole), sharded on dimension ``d``
#    (an int ``d >= 0``: device i holds the i-th of D equal slices along d) or partial (``P``: every device
#    holds a tensor of the full shape and the value is their sum). These are DTensor's ``Replicate``,
#    ``Shard(d)`` and ``Partial`` on a one-dimensional mesh. ``ANY`` in an op's requirements: the op reads
#    no values of that input, so it takes the input as it is (the planner and the ILP honour it; no rule
#    asks for it today: ``ones_like`` keeps its input's shard instead).
# 2. Bytes per device: R and P the whole tensor, a shard ceil(1/D) of it.
# 3. Converting costs a collective on a ring of D devices with link bandwidth ``bw`` (bytes/s) and a
#    latency ``alpha`` per collective (n: the tensor's bytes): shard -> R an all-gather,
#    alpha + (D-1)/D n/bw; P -> R an all-reduce, twice that; P -> shard a reduce-scatter, alpha + (D-1)/D n/bw;
#    shard d -> shard e an all-to-all, alpha + (D-1)/D^2 n/bw; R -> shard and R -> P are local (a slice;
#    zeros on all devices but one) and cost nothing, as does shard -> P.
# 4. A converted copy is a new tensor on each device (its bytes under the new placement). It is made
#    before the first op of the plan that needs it and freed after the last one, unless the tensor is
#    written in between: a write makes the copy stale, and the next op that needs it converts again.
"""

from __future__ import annotations

from dataclasses import dataclass

R = -1
P = -2
ANY = -3
Place = int  # R, P, ANY or a dimension >= 0


def show(p: Place) -> str:
    return {R: "R", P: "P", ANY: "*"}.get(p, f"S({p})")


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor of the iteration (a storage's owner, or a view of one)."""

    shape: tuple[int, ...]
    itemsize: float  # bytes per element
    base: int  # the tensor that owns the storage (itself unless a view)
    const: bool  # exists before the iteration: a parameter, an optimizer state, the input batch
    written: bool = False  # some op of the iteration writes it in place (state, not data)
    weight: bool = False  # read as a weight (a matrix product's right operand, a bias, a table, a norm's scale)

    @property
    def state(self) -> bool:
        """A constant that is model state (parameters, optimizer states, buffers), not the batch."""
        return self.written or self.weight

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return int(n * self.itemsize)


@dataclass(frozen=True, slots=True)
class Node:
    """One op of the iteration, in program order."""

    name: str  # aten name without the namespace: ``addmm.default``
    ins: tuple[int, ...]  # tensors read (and written, for ``writes``)
    outs: tuple[int, ...]  # tensors made, views included
    views: tuple[int, ...]  # per output: the index in ``ins`` whose storage it shares, or -1
    writes: tuple[int, ...]  # indices in ``ins`` written in place
    time: float  # seconds on one device, whole
    news: tuple[int, ...] = ()  # constants first read by this op (their storages exist from here)
    frees: tuple[int, ...] = ()  # storages (their owners) whose last reference is dropped after this op


@dataclass(frozen=True, slots=True)
class Graph:
    tensors: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    source: str = ""


@dataclass(frozen=True, slots=True)
class Link:
    """The devices and what joins them."""

    devices: int
    bw: float  # bytes per second per link
    alpha: float = 10e-6  # seconds per collective

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"torch_dtr: a partition needs at least 1 device, got {self.devices}")
        if self.bw <= 0:
            raise ValueError(f"torch_dtr: link bandwidth must be > 0 bytes/s, got {self.bw}")

    def per_device(self, t: Tensor, p: Place) -> int:
        n = t.nbytes
        return -(-n // self.devices) if p >= 0 else n

    def kind(self, have: Place, want: Place) -> str:
        """The collective that turns ``have`` into ``want`` ('' when local)."""
        if have == want or want == ANY or want == P or have == R or self.devices == 1:
            return ""
        if want == R:
            return "all_reduce" if have == P else "all_gather"
        return "reduce_scatter" if have == P else "all_to_all"

    def cost(self, have: Place, want: Place, nbytes: int) -> float:
        k = self.kind(have, want)
        if not k:
            return 0.0
        d = self.devices
        frac = (d - 1) / d
        if k == "all_reduce":
            return 2 * (self.alpha + frac * nbytes / self.bw)
        if k == "all_to_all":
            return self.alpha + frac * nbytes / d / self.bw
        return self.alpha + frac * nbytes / self.bw
