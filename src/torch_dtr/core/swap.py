"""A second way to evict: copy the value to a slower memory (host memory) instead of forgetting it.

# NOTE [ Swapping ]
#
# 1. With a ``Tier`` (``Runtime(tier=...)``), a value the policy evicts is either *dropped* (recomputed by its
#    recipe when needed, plain DTR) or *swapped*: copied out to the tier and copied back when needed. A swapped
#    storage is not resident (its bytes leave the budget) and has ``Storage.host`` set: the tier's handle.
# 2. The choice, per victim (``swaps``, below): the policy picks the victim as without a tier; it is swapped
#    when the tier has room and copying it back (and out, when it has no copy yet, unless copies out overlap
#    compute: ``Tier.out_free``) costs less than recomputing it for nothing else: its recipe plus half of its
#    evicted ancestors that nothing holds (an ancestor with a handle is recomputed for its own reader anyway;
#    a chain recomputed once serves several of its values), each recipe with ``Tier.per_op`` added. A value
#    with a copy is decided again each time it is evicted (its copy goes when recomputing became cheaper).
#    Replayed on 24 logs at 0.2-0.9 of their peaks (``python benchmarks/swap_sim.py``, docs/swap.md; copies at
#    the device's memory bandwidth / 50), with copies out overlapped: never worse than recomputation alone
#    in 192 cells, better in 17; charging every such ancestor in full: worse in 3 (the bench's LSTM at 0.7:
#    1.158 vs 1.089, 60 copies back where recomputing chains served many values at once); every evicted
#    ancestor: worse in 6 of the shared logs' 45 (ResNet-32 copied back 171 MiB values that cost 2 ms to
#    recompute once their ancestors were back anyway); the recipe alone: better in 5 only. Paid copies out
#    (the CPU's tier) are worse in 4 cells, better in 8: an insurance paid for values never read again.
#    Scoring candidates by min(recompute, copy) (MegTaiChi's) was worse in 20 of the shared logs' 45 cells (a
#    variant of ``eviction.scored_victim``, removed; docs/decisions.md).
# 3. A swapped storage needs no recipe to come back: plans treat it as a leaf (one step, no inputs), so it
#    also cuts the evicted chains behind it. Trackers never hear of it (it is not in any evicted
#    neighbourhood): recomputing a reader costs its copy, not its ancestors.
# 4. Storages never change (an in-place write makes a new version), so a copy stays valid: a value copied in
#    keeps its host copy (``Tier.spare``) and is swapped again later for free; spare copies are the first
#    freed when the tier needs room. An old version made non-resident by an in-place write that has a copy
#    becomes swapped if rule 2 would swap it as a victim, else its copy goes and it is dropped (without that
#    check, rule 10 in particular, every version of a gradient summed in place under the native front end kept
#    its copy: 3.4 GiB of them for the bench's LSTM loop at 35% of its 155 MiB peak). Releasing or pinning a
#    storage frees its copy.
# 5. Only the policy's evictions copy out. A value dropped because its last handle died (NOTE [ Lifetimes ] 3)
#    is not copied (nothing may ever read it); with a spare copy it becomes swapped (rule 2 decides). Listeners
#    hear "swapout" before the "evict" or "drop" of a swapped value, and "swapin" when it is copied back.
# 6. The budget still bounds device memory with copies in flight: a copy out that has not landed keeps its
#    device bytes (``Tier.pending``), which ``reserve`` counts until ``Tier.settle`` says they landed.
# 7. Costs are modelled (``nbytes / bandwidth``) and advance the clock like recomputations, so decisions stay
#    deterministic; ``Runtime.swap_cost`` sums them (the simulator's overhead adds it).
# 8. Banishing (NOTE [ Banishing ]) pins a running sum's total so that its chain of handle-less values is not
#    recomputed; a tier copies such values out instead (rule 2 charges the chain), and pinned values cannot be
#    copied, so a live session whose tier is at least as large as its budget does not banish (``enable``'s
#    default depth is 0 then; a smaller tier fills up and needs banishing, as without one). Measured on the
#    bench's LSTM loop (width 768, sequence 96): with the tier and depth 2 the smallest budget that trains is
#    above 45% of its peak (41 MiB pinned by banishing at 45%); with depth 0 it trains at 45%, 40% and 35%
#    (the single-op floor is 34%), at the same step time at 50% and 60%.
# 9. A value pinned because its recipe can no longer run (``invalidate``: a constant it read changed, FSDP2
#    freed the parameters it read, banishing; and what ``rescue`` brought back for that) is pinned *movable*
#    (``Storage.moves``): only the runtime holds it, so with a tier it may be swapped, never dropped. Such
#    values (``Runtime.movable``) compete with the policy's victim by the same score, with their copies
#    (out and back) as their cost and no evicted neighbourhood; they go only where the tier has room. A value
#    pinned because something outside shares its memory (``unwrap``, ``t.data = v``) is never copied. Such a
#    value that nothing reads may be written in place (no new version): its copy goes (``overwritten``). With a
#    tier, the single-op floor leaves movable values out as it leaves candidates out. Under FSDP2's default
#    resharding this turns a floor of 91% of the peak into one of 36% (tests' MLP on two CPU ranks, gloo;
#    tests/eager/test_distributed.py), bitwise.
# 10. A value without handles (only recipes read it: plain PyTorch freed it already) is swapped only while the
#    tier holds no more than the device budget, counting its copy; past that it is dropped, and a spare copy
#    goes with it. Values the program holds are not limited (the host budget is). Without the rule, values
#    copied out while held, read back, then let go kept their copies until their readers' recipes died: the
#    bench's LSTM loop at 30% of its 190 MB peak held 3.7 GB of such copies (CPU, 2026-11-26).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .lifetimes import add_candidate, add_movable
from .records import Op, Storage

if TYPE_CHECKING:
    from .runtime import Runtime

try:  # only the compiled core reads it (NOTE [ Compiled core ]); interpreted, it is a no-op
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with mypy

    def mypyc_attr(*_args: object, **_kw: object) -> Any:  # type: ignore  # noqa: PGH003
        return lambda cls: cls


@mypyc_attr(allow_interpreted_subclasses=True)  # front ends subclass it
class Tier:
    """The host tier: its budget, its modelled bandwidth, and the copies it holds.

    A driver subclasses it for real copies (``copy_out``, ``copy_in``, ``discard``, ``settle``); this base
    class keeps the driver's payload object as the handle (the simulator's fake payloads)."""

    def __init__(self, budget: int | None = None, bandwidth: float = 1.0, out_free: bool = False,
                 per_op: float = 0.0) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: host_budget must be >= 0 bytes or None, got {budget}")
        if not bandwidth > 0:
            raise ValueError(f"torch_dtr: a swap bandwidth must be > 0 (bytes per unit of cost), got {bandwidth}")
        self.budget = budget
        self.bandwidth = bandwidth
        self.out_free = out_free  # copies out overlap compute: only the copy back is paid
        self.per_op = per_op  # what running a recipe costs beyond its modelled kernel (a runtime's dispatch)
        self.used = 0  # bytes of copies held
        self.peak = 0
        self.pending = 0  # device bytes of copies out still in flight (rule 6)
        self.spare: dict[Storage, None] = {}  # resident storages whose copy is kept (rule 4): freed first
        self.spare_bytes = 0
        self.outs = self.ins = 0  # copies made each way
        self.bytes_out = self.bytes_in = 0

    # ------------------------------------------------------------------ the model
    def in_cost(self, nbytes: int) -> float:
        return nbytes / self.bandwidth

    def out_cost(self, nbytes: int) -> float:
        return 0.0 if self.out_free else nbytes / self.bandwidth

    def free_bytes(self) -> float:
        """Bytes a new copy may take, counting spare copies as free."""
        if self.budget is None:
            return float("inf")
        return self.budget - self.used + self.spare_bytes

    # ------------------------------------------------------------------ the driver's part
    def copy_out(self, s: Storage) -> Any:
        """Start copying ``s.payload`` out; returns the handle ``copy_in`` takes."""
        return s.payload

    def copy_in(self, s: Storage) -> Any:
        """A device payload for ``s`` from its copy ``s.host`` (the copy stays)."""
        return s.host

    def discard(self, handle: Any) -> None:
        """Free a copy."""

    def settle(self, wait: bool) -> None:
        """Copies out that landed give their device bytes back (``pending``); ``wait``: all of them, now."""
        self.pending = 0

    # ------------------------------------------------------------------ bookkeeping, called by the runtime
    def hold(self, s: Storage) -> None:
        """Make room for, and count, a new copy of ``s`` (the caller checked ``free_bytes``)."""
        if self.budget is not None:
            while self.used + s.nbytes > self.budget and self.spare:
                self.drop(next(iter(self.spare)))
        s.host = self.copy_out(s)
        self.used += s.nbytes
        if self.used > self.peak:
            self.peak = self.used
        self.outs += 1
        self.bytes_out += s.nbytes

    def drop(self, s: Storage) -> None:
        """Free ``s``'s copy (released, pinned, or spare and the room is needed)."""
        self.unspare(s)
        h, s.host = s.host, None
        self.used -= s.nbytes
        self.discard(h)

    def keep(self, s: Storage) -> None:
        """``s`` is resident again and keeps its copy as a spare (rule 4)."""
        self.spare[s] = None
        self.spare_bytes += s.nbytes

    def unspare(self, s: Storage) -> None:
        """``s`` stopped being resident: a spare copy it had is its only copy now."""
        if self.spare.pop(s, 0) is None:
            self.spare_bytes -= s.nbytes


def recompute_cost(s: Storage, enough: float, per_op: float, most: int = 64) -> float:
    """What recomputing the resident ``s`` would cost now for nothing else (NOTE [ Swapping ] 2): its recipe, and
    half of its evicted ancestors that nothing holds (an ancestor with a handle is recomputed for its own reader
    anyway; a chain recomputed once serves several of its values), each recipe plus ``per_op``; summed until it
    passes ``enough`` or ``most`` recipes were visited."""
    total = s.cost + per_op
    seen: set[Op] = set()
    work = [i for i in s.op.inputs if not i.resident and i.host is None and i.refs == 0]  # type: ignore[union-attr]
    while work and total <= enough and len(seen) < most:
        op = work.pop().op
        if op is None or op in seen:
            continue
        seen.add(op)
        total += 0.5 * (op.cost + per_op)
        work.extend(i for i in op.inputs if not i.resident and i.host is None and i.refs == 0)
    return total


def swaps(rt: Runtime, s: Storage) -> bool:
    """Whether the victim ``s`` is swapped rather than dropped (NOTE [ Swapping ] 2): copying it back (and
    out, when it has no copy yet) costs less than recomputing it with its evicted ancestors."""
    tier: Tier = rt.tier  # type: ignore[assignment]
    n = s.nbytes
    copy = tier.in_cost(n)
    if s.host is None:
        if n > tier.free_bytes():
            return False
        copy += tier.out_cost(n)
    if s.pinned or not s.recomputable:  # a pinned value is never dropped (NOTE [ Swapping ] 9)
        return True
    if s.refs == 0 and rt.budget is not None and tier.used + (0 if s.host is not None else n) > rt.budget:
        return False  # NOTE [ Swapping ] 10: copies of values without handles stay within the device budget
    return copy < recompute_cost(s, copy, tier.per_op)


def swap_in(rt: Runtime, s: Storage) -> None:
    """Copy the swapped ``s`` back (NOTE [ Swapping ] 3); it keeps its copy as a spare (rule 4)."""
    tier: Tier = rt.tier  # type: ignore[assignment]
    rt.recomputing = True
    try:
        rt.reserve(s.nbytes, f"copying back {s.op.name if s.op is not None and s.op.name else 'a value'}")
    finally:
        rt.recomputing = False
    s.payload = tier.copy_in(s)
    if s.pinned and not s.moves:  # never copied out again: its copy is of no use
        tier.drop(s)
    else:
        tier.keep(s)
    tier.ins += 1
    tier.bytes_in += s.nbytes
    c = tier.in_cost(s.nbytes)
    rt.clock += c
    rt.swap_cost += c
    s.resident = True
    s.last_access = rt.clock
    rt.memory.alloc(s)
    if not s.pinned:
        add_candidate(rt, s)
    elif s.moves:
        add_movable(rt, s)
    if rt.listeners:
        rt.emit("swapin", s)
