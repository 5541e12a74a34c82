"""The records the runtime keeps: storages (units of memory) and ops (recipes that compute them).

Words used everywhere in this package (the DTR paper's, as in simrd):

- *resident*: the storage's value is in memory and counted against the budget.
- *evicted*: the value was freed but the recipe is kept, so it can be *rematerialized* (recomputed).
- *locked*: an op in flight reads it; it may not be evicted until the op finishes.
- *pinned*: it cannot be recomputed (a constant, or the output of an op that cannot be replayed); it is
  never dropped. A pinned value that ``moves`` (nothing outside the runtime shares its memory) may still
  be swapped (NOTE [ Swapping ] 9).
- *released*: nothing can ever need it again (no handle and no live dependent recipe); it is freed for
  good and forgotten. (simrd calls this banishing.)
- *swapped*: evicted by copying it to the host tier (``host`` is set): it comes back by a copy, not its
  recipe (NOTE [ Swapping ] in ``swap.py``).
- *lost*: evicted, and its recipe can no longer run (an input changed: ``Runtime.invalidate``); reading it
  raises ``ConstantChangedError``.

A storage is the unit of eviction and of byte counting. Tensors (views) are a front-end notion: every
view of a storage is rebuilt from the storage's payload, so the core never sees them.

Invariants, checked by ``Runtime.check()`` in tests:

1. ``resident`` implies ``payload is not None`` and the bytes are counted once in ``Memory.tracked``.
2. ``released`` implies not resident, no handles (``refs == 0``) and no live dependents (``deps == 0``).
3. ``deps`` is the number of live ops (ops with at least one unreleased output) that read the storage.
4. A storage in ``Runtime.candidates`` is resident, not pinned and not released; one in ``Runtime.movable``
   (kept with a tier only) is resident, pinned, ``moves`` and not released. A pinned storage that is not
   resident is swapped and ``moves``, or released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class Storage:
    """One unit of memory that the runtime may evict and rematerialize as a whole."""

    __slots__ = (
        "sid", "nbytes", "op", "payload", "resident", "pinned", "locks", "refs", "deps",
        "last_access", "children", "aux", "released", "forward", "chain", "banished", "awaits", "host", "moves", "tag",
        "__weakref__",
    )  # fmt: skip

    def __init__(self, sid: int, nbytes: int, payload: Any, op: Op | None, pinned: bool) -> None:
        self.sid = sid
        self.nbytes = nbytes
        self.op = op  # the recipe that computes this storage; None when it cannot be recomputed
        self.payload = payload  # the front end's value (a plain tensor); None unless resident
        self.resident = True
        self.pinned = pinned
        self.locks = 0
        self.refs = 0  # live front-end handles (tensors, log names) that point here
        self.deps = 0  # live ops that read this storage (see invariant 3)
        self.last_access = 0.0
        self.children: list[Op] = []  # ops that read this storage
        self.aux: Any = None  # the policy's tracker keeps its state here (trackers.py)
        self.released = False
        self.forward: Storage | None = None  # newer version after an in-place write
        self.chain = 0  # once handle-less: the handle-less recipe chain ending here (NOTE [ Banishing ])
        self.banished = False  # pinned (and resident) because its recipe was banished
        self.awaits = False  # kept resident without handles for a reader's evicted output (NOTE [ Lifetimes ] 3)
        self.host: Any = None  # its copy in the host tier (NOTE [ Swapping ]); not resident + host: *swapped*
        self.moves = False  # pinned, but only the runtime holds its value: a tier may copy it out (Swapping 9)
        self.tag = -1  # which output of which iteration it is (NOTE [ Iteration plans ] in plan.py)

    @property
    def recomputable(self) -> bool:
        """Whether a recipe can bring it back (none: a pinned output; dropped: invalidated or banished)."""
        return self.op is not None and self.op.compute is not None

    @property
    def cost(self) -> float:
        return self.op.cost if self.op is not None else 0.0

    def neighbours(self) -> list[Storage]:
        """Storages adjacent in the compute graph: inputs of this storage's recipe and its users' outputs."""
        out = list(self.op.inputs) if self.op is not None else []
        for child in self.children:
            out.extend(child.outputs)
        return out

    def __repr__(self) -> str:
        state = ("released" if self.released else "resident" if self.resident
                 else "swapped" if self.host is not None else "evicted")
        flags = "".join(f",{f}" for f in ("pinned",) if self.pinned) + (f",locks={self.locks}" if self.locks else "")
        return f"Storage(#{self.sid}, {self.nbytes}B, {state}{flags}, refs={self.refs}, deps={self.deps})"


class Op:
    """A recipe: one call that computed ``outputs`` from ``inputs``, and how to run it again.

    ``compute()`` is supplied by the front end. It is called only when every input is resident and
    returns one payload per output (in order; the runtime ignores payloads of outputs that are already
    resident or released). ``writes``: inputs whose value the recipe writes in place into an output (an
    in-place op's old version, which it copies first); when the runtime knows that nothing else needs one
    of them, it calls ``compute(lend)`` instead, and the recipe may write into the storages of ``lend``
    without copying them (NOTE [ Planned rematerialization ] 6).
    """

    __slots__ = ("inputs", "outputs", "cost", "compute", "live", "name", "why", "writes", "scratch")

    def __init__(
        self,
        inputs: Sequence[Storage],
        cost: float,
        compute: Callable[..., Sequence[Any]] | None,
        name: str = "",
        writes: Sequence[Storage] = (),
    ) -> None:
        # distinct, in order (two, the most common count, without a dict)
        n = len(inputs)
        if n < 2:
            self.inputs: tuple[Storage, ...] = tuple(inputs)
        elif n == 2:
            a, b = inputs[0], inputs[1]
            self.inputs = (a, b) if a is not b else (a,)
        else:
            self.inputs = tuple(dict.fromkeys(inputs))
        self.outputs: list[Storage] = []
        self.cost = cost
        self.compute = compute
        self.live = 0  # outputs not yet released
        self.name = name
        self.why: str | None = None  # set by ``Runtime.invalidate``: why the recipe can no longer run
        self.writes: tuple[Storage, ...] = tuple(writes)
        self.scratch = 0  # bytes the recipe holds besides its outputs while it runs (a front end that measured them)

    def __repr__(self) -> str:
        return f"Op({self.name or '?'}, in={[s.sid for s in self.inputs]}, out={[s.sid for s in self.outputs]})"


def step_of(s: Storage) -> Any:
    """What brings the evicted ``s`` back: its copy (``s`` itself, when swapped) or its recipe."""
    return s if s.host is not None else s.op


def reads(s: Storage) -> Sequence[Storage]:
    """What a plan's step for ``s`` reads: its recipe's inputs, or nothing when it is copied back."""
    return () if s.host is not None else s.op.inputs  # type: ignore[union-attr]


class UnheldPlan:
    """A plan running without holding its values (NOTE [ Planned rematerialization ] 4), as the eviction search
    sees it: ``reads`` (storage -> its pending steps that read it: those are evicted last), ``steps`` (the next
    one last; ``None``: the caller's op, which reads ``roots``). ``rev`` changes with ``steps``; ``ahead`` is the
    order of their next reads (furthest first) as computed at revision ``ahead_rev``."""

    def __init__(self, reads: dict[Storage, int], steps: list[Storage | None], roots: Sequence[Storage]) -> None:
        self.reads = reads
        self.steps = steps
        self.roots = roots
        self.rev = 0
        self.ahead_rev = -1
        self.ahead: list[Storage] = []

