"""The DTR runtime: records recipes, keeps tracked bytes within a budget, evicts, rematerializes.

It imports no torch. A driver (``torch_dtr.eager`` live, ``torch_dtr.sim`` for logs, the core's tests)
talks to it only through these verbs, and never writes a record's fields:

    held = rt.acquire(inputs)                  # rematerialize what is missing, lock every input
    try:
        rt.reserve(nbytes_of_outputs, where)   # evict until the outputs fit
        ... run the op ...
        op = rt.ran(inputs, cost, compute)     # count it, advance the clock; the recipe (None: no recipe);
                                               # writes=[...]: inputs the recipe writes in place
        s = rt.output(op, nbytes, payload)     # one storage per distinct output storage
    finally:
        rt.release(held)                       # unlock
    rt.add_ref(s) / rt.drop_ref(s)             # handles (tensors, log names) on a storage

plus ``new_version`` (in-place writes), ``add_constant``, ``pin``, ``get``/``rematerialize``/``bring``, ``evict``,
``evict_some``/``out_of_memory`` (out-of-memory retries), ``sync``/``add_outside`` (a device's allocator count),
``set_cost``, ``set_budget``, ``stranded``/``invalidate`` (an input
of recipes changed) and ``listen`` (observers of its events).
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BudgetError, ConstantChangedError, InternalError, fmt_bytes, internal_assert
from .memory import Drop, Memory
from .plan import Iterations
from .policies import DEFAULT_POLICY, Policy, get_policy
from .records import Op, Storage
from .swap import Tier
from .trackers import TRACKERS, Chain, Components, comp_extra

__all__ = ["BudgetError", "InternalError", "Listener", "Runtime", "Stats", "fmt_bytes", "internal_assert"]

# NOTE [ Lifetimes ]
#
# 1. A storage is kept while it has handles (``refs``: front-end tensors or log names) or live
#    dependents (``deps``: live recipes that read it).
# 2. When its last handle dies and no live recipe reads it, it is released: freed for good, its record
#    dropped, and its own recipe's inputs lose a dependent (which may release them in turn, iteratively).
# 3. When its last handle dies but a live recipe still reads it, it is evicted at once ("drop instead of
#    delete", as MegEngine does) and its recipe kept only as long as those dependents live. Pinned
#    storages (not recomputable) stay resident instead. These drops are counted as ``drops``, not as
#    evictions chosen by the policy. Except a value that a reader's evicted output *with a handle* waits
#    for (``_awaited``): the program may read that output again, and bringing it back without this value
#    would recompute the value's own evicted chain too (in a backward pass: every gradient back to the
#    loss). Such a value stays resident, an ordinary candidate (``Storage.awaits``). The drop it was
#    spared comes due once nothing waits for it: when the waiting output's last handle dies (every
#    handle-less input of that output's recipe that nothing else waits for is dropped then), or when the
#    output has been brought back (the next eviction takes it before asking the policy: ``_settled``).
#    Replaying 26 recorded and shared logs at 0.2-0.9 of their peaks: 35 cells better, 2 worse (by
#    under 1%); the simulator's recorded MLP at 0.7 from 1.855 to 1.265 (the ILP's optimum: 1.201).
#    docs/decisions.md, Handle-less inputs of awaited values.
# 4. So nothing accumulates across iterations: when an iteration's tensors die, every storage they
#    produced is released and tracked bytes return to the constants.
# 5. A recipe whose every live output is pinned (a value the program unwrapped, a value kept when a constant
#    changed) never runs again, so it is dropped when the last of them is pinned or the last other output is
#    released, and its inputs lose a dependent. Before, a loss the program held and read as a float kept the
#    32 MiB log-softmax its recipe reads resident through the next step (the bench's GPT-2 failed at 30%).

# NOTE [ Planned rematerialization ]
#
# 1. ``plan(roots)`` lists the evicted ancestors to recompute, one step per recipe, each after its evicted
#    inputs (post-order), visiting of several evicted inputs the one with the longest evicted chain below
#    it first (ties: the oldest), so that each value waits as briefly as possible for its reader: in a
#    recurrence whose side inputs are older than its chain, recomputing the oldest input first would hold
#    one side input per step; the plan holds O(1) (tests/core/test_planned_remat.py).
# 2. A recomputed value without handles (``refs == 0``: an old version of an in-place write, a value whose
#    tensors died but whose readers live) was brought back only to feed the recipes above it: it is dropped
#    as soon as its last reader in the plan has run, if every reader's outputs are resident (as NOTE
#    [ Lifetimes ] 3; one with a reader still evicted stays, to the policy). The end of an evicted chain
#    comes back with two links resident at a time.
# 3. ``bring(roots)`` runs the plan so that every root is resident at the end. First holding (``hold=True``):
#    each recomputed value stays locked until its last planned reader has run; a resident input evicted
#    meanwhile makes its step find it missing and plan it again (locked this time, so this ends).
# 4. If that cannot keep the budget, the caller (``acquire``, ``rematerialize``) drops every lock, its own
#    op's resident inputs included, and runs the plan without holding: the policy may evict any planned
#    value, even one the next step reads; a step that finds an input missing plans it again, and from its
#    second try locks its other resident inputs until it runs (each try locks more, so it ends). While
#    it runs, the policy first chooses among candidates that no pending step reads (``_soft``); when none
#    fits, the runtime evicts the planned value whose next read is furthest ahead in the plan (Belady's
#    rule; the larger on a tie), not the policy's choice among all: staleness says nothing about a plan's
#    order, and the policy's picks were read again a few steps later (the tests' MLP: smallest feasible
#    budget 33% -> 28% of its peak, tree RNN 23% -> 21%; docs/decisions.md). A plan that runs more than
#    4 x (its first length + 8) recomputations gives up with ``BudgetError`` (``_raise_undone``) instead
#    of thrashing.
# 5. Why held first: unheld, the policy may evict a stale input of the op in flight to recompute another,
#    and then recompute it; held, nothing is computed twice. Unheld only runs where held fails.
# 6. Lending: a recipe that writes an input in place (an in-place op's old version, ``Op.writes``) copies it
#    first, so that the old value survives for its other readers. When it has none (no handle, this recipe
#    its only dependent, not pinned, not a root of the plan), ``_recompute`` lends it: the reservation
#    counts its bytes as the output's, ``compute(lend)`` writes into it as the first run did, and it is
#    dropped (not handed to ``Drop``: its buffer now holds the output). An in-place chain (LSTMCell's
#    gates written by four in-place activations per step, dropout's ``bernoulli_``) comes back in one
#    buffer instead of two (tests/core/test_lending.py); the tests' LSTM loop's smallest feasible budget
#    went from 54% to 50% of its peak.

# NOTE [ Lazy tracking ]
#
# 1. The policy's tracker (union-find sets, evicted components, chains) is only read when the policy chooses
#    a victim (``_choose``). A live runtime may never choose (no budget, or a budget above the program's
#    peak), yet drops a value at almost every op (NOTE [ Lifetimes ] 3): with ``lazy_tracking=True`` (both
#    front ends') it keeps no tracker state (``tracking`` is False) until its first choice, which tells the
#    tracker every evicted storage then, oldest first (``track``). The same storages are then tracked as if
#    it had tracked all along, except for the order of floating-point cost sums and, under union-find
#    (``dtr_eq``, ``dtr_chain``), sets once joined through a value recomputed since: union-find never splits
#    them, a fresh start does not join them; ``dtr_chain``'s chain estimates also depend on the order of
#    evictions (NOTE [ Evicted chains ]), so its first choices may differ. (Tracking from the start cost a
#    budget above the peak about 2 us per op on the small-op chain of benchmarks/dispatch.py.)
# 2. A runtime created without ``lazy_tracking`` (every replay of a log, the core's tests) tracks from the
#    start: the simulator's outcomes do not change.

# NOTE [ Changed inputs ]
#
# 1. A recipe is valid only while what it reads keeps its value. Managed storages never change (an
#    in-place write makes a new version), but constants do: an optimizer step, a write through ``.data``,
#    ``p.data = ...``. The front end sees such a write before it happens and hands the ops whose recipes
#    read the constant to ``invalidate``.
# 2. First (``rescue``): evicted storages that would be left without a recipe and that something holds
#    (``refs > 0``, found by ``stranded``) are rematerialized and pinned, while their inputs still have the
#    values they read; the program keeps the values it computed. That may need memory: a ``BudgetError``
#    then names the write. Bringing one back may evict a value the search went through, so ``rescue`` looks
#    again until nothing is stranded (each round pins at least one value for good).
# 3. ``invalidate`` drops the recipes: their resident outputs are pinned (nothing can recompute them, so
#    they are never evicted: a ``BudgetError`` cannot destroy a value the program holds), evicted ones are
#    lost, and so is, recursively, what was computed from a lost one. Inputs lose a dependent and are
#    released when nothing else needs them: a loss kept for logging no longer keeps its step's whole
#    forward (and input batch) alive through recipes (simrd's banishing).
# 4. Reading a lost storage raises ``ConstantChangedError``. Only a write the front end did not see in
#    advance can lose a held value (see its NOTE [ Changed constants ]).

# NOTE [ The single-op floor ]
#
# 1. While an op runs, its inputs and outputs must be resident, and so must everything that cannot be
#    evicted: constants (parameters, gradients, optimizer state, inputs the program holds as plain
#    tensors) and pinned storages. The largest such sum over the ops of a program is a lower bound on any
#    schedule's memory, recomputing or not: the single-op floor.
# 2. ``ran`` starts the sum for each op (unevictable bytes now, plus its distinct unpinned inputs) and
#    ``output`` adds each new storage; ``floor`` keeps the largest so far (``Stats.floor_bytes``), and
#    ``BudgetError`` quotes it: a budget below it cannot be kept by any eviction policy.
#    An op whose own reservation fails (nothing but constants, pinned storages and its own locked inputs
#    left) sets the floor too, before the error is raised.
# 3. It is measured on the run itself (under a budget, what is pinned can differ from an unlimited run).
#    The exact smallest budget of a recorded step is the ILP's (``sim.checkmate``), where it solves.

# NOTE [ The smallest victim ]
#
# 1. The search skips candidates under a soft floor (``min_evict_bytes``, by default 1% of the average candidate)
#    and falls back to them when nothing above it can go. ``evict_minimum`` is a hard floor below that: a storage
#    smaller is never evicted (MegEngine's evictee minimum size). Evicting a scalar frees nothing a request can
#    use, and bringing it back can cost a chain: on the bench's LSTM loop a held 4-byte loss (and the gradient's
#    seed) went by the fallback, and AdamW's first weight write rescued them by recomputing 1.7-1.9k ops (NOTE
#    [ Changed inputs ]). Live sessions use 64 B (``EVICT_MINIMUM`` in eager/front.py, both front ends; in the
#    traces' header so that replays keep it): that LSTM loop at 45% of its peak, 5 steps, recomputed 9,698
#    ops instead of 11,623 (2026-11-29, ``python benchmarks/experiments/smallest_victim.py``). The core's
#    default is 0 (logs and the core's tests count single bytes).

# NOTE [ Banishing ]
#
# 1. A value without handles that recipes still read (a running sum's previous total, an old version of
#    an in-place write, a consumed gradient) is evicted at once (NOTE [ Lifetimes ] 3) and its recipe
#    kept. Summing T values one at a time (``acc = acc + g_t``: autograd's gradient accumulation over a
#    recurrence's steps, a residual stream's gradient, a user's loop) leaves a chain of T such values: the
#    newest total can only be recomputed from all of them, and evicting it costs O(T) recomputations
#    (each ``g_t`` with its own ancestors), so the run thrashes at budgets where the total is evicted.
# 2. ``chain`` measures it when a storage loses its last handle: the number of links on the longest path
#    of handle-less values ending there, where a link is an op that reads two or more handle-less values
#    (a sum of things nobody else holds; an in-place unary op on a view adds none). A pinned storage
#    counts as the limit: it stays resident for its readers and cannot be recomputed anyway.
# 3. At ``banish_depth`` links, the readers of the value whose outputs are all resident (or released) and
#    no larger than it lose their recipes: their outputs are pinned (``invalidate``), the value and,
#    recursively, the chain behind it are released. So the running total is pinned while it is held and
#    the chain costs nothing; the next total is banished at once (its input is pinned, rule 2), so a sum
#    over T steps keeps one total resident, as plain PyTorch's in-place accumulation does. A pinned value
#    (banished or not) that loses its last handle hands the pin to its resident readers whatever their
#    size: it is freed and nothing is added (they are resident already). With the size rule there too, such
#    values stayed resident for as long as any reader's recipe lived (the bench's LSTM loop failed at 60%
#    with 9.7 MiB of them at depth 1; a recorded CNN log at 0.9 of its peak).
# 4. The price: a banished output is never evicted while it has handles. The size rule means banishing an
#    evicted value never adds resident bytes when it happens (the value it frees is at least as large).
# 5. Pinned by choice, not because no schedule could do otherwise: the single-op floor leaves banished
#    bytes out (``banished_bytes``; in a ``BudgetError``, those the op in flight does not read), so it stays
#    a lower bound for any schedule.
# 6. Live, the default depth is 2 (``eager.front.DEFAULT_BANISH_DEPTH``, since 2026-11-25, 08:00 UTC): measured
#    (docs/design.md, Banishing) on the tests' models' smallest feasible budgets it is never worse than no
#    banishing and lower on five of eight (GPT-2 31% -> 25% of the peak, LSTM loop 65% -> 54%), and the
#    bench's LSTM loop trains at 50% of its peak, where it fails without. ``Runtime``'s own default, which
#    the replay of operator logs uses, stays 0: in those logs every weight gradient is an output whose
#    recipe lives to the end of the step (live they are plain ``p.grad`` constants), so a banished value
#    read by one stays resident, and the shared ResNet-32 log fails at 0.2 of its peak with banishing.
# 7. A pinned value that loses its last handle while a reader's outputs are evicted stays resident for that
#    reader's recipe, and so for every value computed from it that something still holds: in beam search
#    (HF ``generate(num_beams=3)``) each step's reordered KV cache is banished, its attention output evicted,
#    and the running beam scores and sequences, held to the end, kept every cache version alive (the BART of
#    tests/eager/test_inference.py: no-budget peak 8.6/30.2/71.5 MB at 6/24/48 tokens). So the reader's recipe
#    is dropped instead (``_cut``: ``invalidate``, as for a changed constant): the evicted values computed
#    through it are lost, the resident ones pinned (as banished), where those are at most a quarter of the bytes
#    the value frees
#    and none of the lost ones is held. At up to all of them, a program with reentrant checkpointing lost its
#    budget at 1.3x its floor (68 cuts in a step, each pinning as much as it freed, values that outlived it);
#    the BART's peak: 4.7/5.7/7.2 MB at 6/24/48 tokens with the quarter, 4.4/4.4/5.1 with all. A held lost
#    one would have to be brought back first, and a handle can die inside another op (the Python front end
#    drains deaths when an op starts, nested ones too), where bringing a value back could pass the budget.

Listener = Callable[[str, "Storage | None"], None]
"""An observer of runtime events: ``fn(kind, storage)`` with kind "evict", "drop", "remat", "release", or
"op" (a driver finished an op; storage ``None``). It may raise to stop the program (e.g. a thrash cap)."""


@dataclass(frozen=True)
class Stats:
    budget_bytes: int | None
    resident_bytes: int  # tracked bytes now (resident managed storages + constants)
    peak_bytes: int
    constant_bytes: int
    evictions: int  # storages evicted by the policy to make room
    drops: int  # storages evicted because their last handle died (NOTE [ Lifetimes ] 3)
    rematerializations: int  # recipes run again
    remat_seconds: float
    search_seconds: float
    ops: int  # ops run by the driver (managed ops of the program)
    live_storages: int  # records held (resident or evicted)
    floor_bytes: int = 0  # the single-op floor so far (NOTE [ The single-op floor ])
    floor_op: str = ""  # the op that set it
    banished: int = 0  # recipes dropped by banishing (NOTE [ Banishing ])
    # on a device with an allocator (NOTE [ Budget accounting ] 4): its bytes the runtime does not track, as
    # last learned; peak_bytes and budget_bytes then include them
    outside_bytes: int = 0
    syncs: int = 0  # allocator queries (``Runtime.sync``)
    oom_retries: int = 0  # ops and recomputations retried after the allocator ran out of memory
    oom_evicted_bytes: int = 0  # bytes evicted to make those retries fit
    # the most the device's allocator was found holding above the budget (NOTE [ Budget accounting ] 6; 0: never)
    excess_bytes: int = 0
    # the host tier (NOTE [ Swapping ]): copies out and back, the bytes it holds now and at most
    swaps_out: int = 0
    swaps_in: int = 0
    host_bytes: int = 0
    host_peak_bytes: int = 0
    # a front end that learns the program (NOTE [ Learned budgets ]): the optimizer steps it traced, and the smallest
    # budget at which their replay trains (where no step ended: what it traced; None: nothing learned yet)
    traced_steps: int = 0
    learned_budget: int | None = None
    # NOTE [ Iteration plans ]: iterations ended (optimizer steps), those that followed the plan of the one before
    # to their end, and those that left it
    iterations: int = 0
    planned: int = 0
    diverged: int = 0


# how a BudgetError says to raise the budget (``Runtime.fix``: a front end puts its own calls there; {n}: bytes)
FIX = "torch_dtr.enable(budget={n}), or `with torch_dtr.budget({n}):` for a scope inside a running session"


# ``Runtime.advise``: given the budget a BudgetError would suggest, a better one for the whole program and why (a
# front end that traced the program: NOTE [ Learned budgets ] in native/session.py), or None
Advise = Callable[[int], tuple[int, str] | None]


def _suggest(need: float, fix: str = FIX, advise: Advise | None = None) -> tuple[int, str]:
    """The one budget a ``BudgetError`` suggests (its ``budget``) and the sentence that says so: 10% above ``need``
    (never below the floor), or what ``advise`` returns for it."""
    n, why = math.ceil(need * 1.1), "10% above what this op needs; it covers the program up to here only"
    better = advise(n) if advise is not None else None
    if better is not None:
        n, why = better
    return n, f"Budget to try: {fmt_bytes(n)} ({n} B; {why}): {fix.format(n=n)}."


def _sid(s: Storage) -> int:
    return s.sid


def _step(s: Storage) -> Any:
    """What brings the evicted ``s`` back: its copy (``s`` itself, when swapped) or its recipe."""
    return s if s.host is not None else s.op


def _reads(s: Storage) -> Sequence[Storage]:
    """What a plan's step for ``s`` reads: its recipe's inputs, or nothing when it is copied back."""
    return () if s.host is not None else s.op.inputs  # type: ignore[union-attr]


def _recompute_cost(s: Storage, enough: float, per_op: float, most: int = 64) -> float:
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


def _all_pinned(op: Op) -> bool:
    """Whether every live output of ``op`` is pinned, resident or swapped: its recipe never runs again."""
    return all(o.released or (o.pinned and (o.resident or o.host is not None)) for o in op.outputs)


def _awaited(s: Storage) -> bool:
    """Whether a reader of ``s`` has an evicted output with a handle (NOTE [ Lifetimes ] 3)."""
    for c in s.children:  # (loops, not a generator: this runs for every value whose last handle dies)
        for o in c.outputs:
            if o.refs and not o.resident and o.host is None:
                return True
    return False


def _drop_recipe(op: Op) -> list[Storage]:
    """Drop the recipe of ``op``, whose live outputs are all pinned (NOTE [ Lifetimes ] 5); returns its inputs
    that nothing needs now, for the caller to release (iteratively: a chain of such recipes is as long as the
    program)."""
    op.compute = None
    op.why = "its outputs are pinned, so it never runs again"
    inputs, op.inputs = op.inputs, ()
    free = []
    for i in inputs:
        i.deps -= 1
        i.children.remove(op)
        if i.deps == 0 and i.refs == 0:
            free.append(i)
    return free


class Runtime:
    def __init__(
        self,
        budget: int | None,
        policy: str | Policy = DEFAULT_POLICY,
        *,
        sample_sqrt: bool = False,
        min_evict_bytes: int | None = None,
        evict_minimum: int = 0,
        memory: Memory | None = None,
        victim: Drop | None = None,
        device_usage: Callable[[], tuple[int, int]] | None = None,
        sync_every: int = 64,
        seed: int = 0,
        banish_depth: int = 0,
        lazy_tracking: bool = False,
        tier: Tier | None = None,
        plans: bool = True,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self.fix = FIX  # the calls a BudgetError suggests (the native front end names its own)
        self.advise: Advise | None = None  # a better budget to suggest (``_suggest``)
        self.banish_depth = banish_depth  # NOTE [ Banishing ]; 0 (the default): never
        self.banished = 0  # recipes dropped by banishing
        self.banished_bytes = 0  # resident bytes pinned by banishing
        self.peak_limit = budget  # the largest budget in force since the peak was last reset (check())
        self.policy = get_policy(policy)
        self.tracker = TRACKERS[self.policy.extra]()
        self.tracking = not lazy_tracking  # NOTE [ Lazy tracking ]
        self.sample_sqrt = sample_sqrt
        self.min_evict_bytes = min_evict_bytes
        self.evict_minimum = evict_minimum  # NOTE [ The smallest victim ]: smaller storages are never evicted
        self.memory = memory or Memory()
        self.victim = victim or Drop()
        self.tier = tier  # NOTE [ Swapping ]: a victim may be copied there instead of dropped
        self.swap_cost = 0.0  # modelled cost of the copies (out, unless they overlap, and back)
        # NOTE [ Budget accounting ] 4: the device allocator's bytes in use now and at their peak, queried at
        # most every ``sync_every`` ops that reserve, and before a BudgetError (never per op: 30-360 us each)
        self.device_usage = device_usage
        self.sync_every = sync_every
        self.syncs = 0
        self.headroom = 0  # bytes kept free below the budget for what the count missed between syncs (rule 6)
        self.excess = 0  # the most the allocator's peak was found above the budget (rule 6)
        self._device_peak = -1  # the allocator's peak at the last sync
        self._dirty = False  # the outside count grew by guesses since the last sync (plain ops' outputs)
        self._synced: tuple[int, int, int] | None = None  # (ops, tracked, outside) right after the last sync
        self._next_sync = 0 if device_usage is not None else 1 << 62  # self.ops at which reserve() syncs next
        self.oom_retries = self.oom_evicted_bytes = 0
        self.rng = random.Random(seed)
        self.candidates: dict[Storage, None] = {}  # resident, evictable storages (insertion-ordered set)
        self.candidate_bytes = 0
        self.movable: dict[Storage, None] = {}  # resident pinned storages a tier may copy out (Swapping 9)
        self.movable_bytes = 0
        self.live: dict[Storage, None] = {}  # every storage not yet released
        self.clock = 0.0
        self.next_sid = 0
        self.evictions = self.drops = self.rematerializations = self.ops = 0
        self.remat_seconds = self.search_seconds = 0.0
        self.remat_cost = 0.0  # summed recipe cost of rematerializations (the simulator's overhead)
        self.scored = 0  # candidates scored by the eviction search (policy metadata accesses)
        self.listeners: list[Listener] = []
        self.floor = 0  # NOTE [ The single-op floor ]
        self.floor_op = ""
        self._need = 0  # what the op being run needs resident: the unevictable bytes, its inputs, outputs
        self._need_op = ""
        self._recomputing = False  # reserve() is making room for a recomputation
        self._soft: dict[Storage, int] | None = None  # an unheld plan's pending reads: evicted last
        self._awaiting: dict[Storage, None] = {}  # kept without handles for an evicted output (Lifetimes 3)
        self._steps: list[Storage | None] | None = None  # that plan's steps (the next one last)
        self._roots: Sequence[Storage] = ()
        self._steps_rev = 0  # bumped whenever a plan's steps change (``_furthest`` caches its order per value)
        self._ahead_rev = -1
        self._ahead: list[Storage] = []
        self._score = math.inf  # the score of ``_candidate``'s last choice
        # victims a device's layout offers for a request of so many bytes (adjacent blocks whose freeing makes one
        # block it can use), evicted before the policy's when the budget needs room (NOTE [ Layout-aware
        # eviction ] in eager/device.py)
        self.layout: Callable[[int], Sequence[Storage]] | None = None
        # NOTE [ Iteration plans ] (plan.py): recorded under a budget only; ``plans=False``: boundaries ignored
        self.iterations = Iterations(budget is not None)
        self.plans = plans

    # ------------------------------------------------------------------ observers
    def listen(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(kind, storage)`` on every event from now on; returns a function that stops it."""
        self.listeners.append(fn)

        def remove() -> None:
            if fn in self.listeners:
                self.listeners.remove(fn)

        return remove

    def emit(self, kind: str, s: Storage | None) -> None:
        for fn in self.listeners:
            fn(kind, s)

    # ------------------------------------------------------------------ the per-op verbs
    def acquire(self, storages: Sequence[Storage], *, resident_first: bool = True) -> list[Storage]:
        """Make every storage resident and lock it for the op about to run; returns the locked storages,
        to be handed to ``release`` when the op is done (also when it raised).

        The resident ones are locked first, so that rematerializing the others cannot evict them; then the
        others are rematerialized in order (bringing one back may already have brought back another). If
        that cannot keep the budget, the locks are dropped and all of them are brought back together by one
        plan whose steps may evict the resident ones (``bring``; NOTE [ Planned rematerialization ] 4).
        ``resident_first=False`` instead rematerializes and locks one storage after the other, in order, as
        the DTR authors' simulator does (``sim.replay`` follows it so that its overheads compare with theirs).
        """
        held: list[Storage] = []
        missing: list[Storage] = []
        try:
            for s in storages:
                if s.resident and resident_first:
                    s.locks += 1
                    held.append(s)
                else:
                    missing.append(s)
            for s in missing:
                if not s.resident:
                    if resident_first:
                        self.bring([s])
                    else:
                        self.rematerialize(s)
                s.locks += 1
                held.append(s)
        except BudgetError:
            self.release(held)
            if not (missing and resident_first):
                raise
            self.bring(storages, hold=False)  # may raise BudgetError again, with nothing locked
            held = list(storages)
            self.lock(held)
        except BaseException:
            self.release(held)
            raise
        return held

    def release(self, held: Sequence[Storage]) -> None:
        for s in held:
            s.locks -= 1

    def ran(self, inputs: Sequence[Storage], cost: float, compute: Callable[..., Sequence[Any]] | None = None,
            name: str = "", writes: Sequence[Storage] = ()) -> Op | None:
        """An op just ran on ``inputs``: count it, advance the clock by ``cost`` and touch the inputs. With a
        ``compute``, record its recipe and return it; every recipe must then get at least one output
        (``output`` or ``new_version``), or its inputs would keep a dependent forever."""
        self.ops += 1
        self.clock += cost
        now = self.clock
        op = None if compute is None else Op(inputs, cost, compute, name, writes)
        # constants and pinned storages (the floor's sum), less those pinned by banishing (NOTE [ Banishing ] 5)
        # (with a tier, pinned values it may copy out are evictable: NOTE [ Swapping ] 9)
        mem = self.memory
        tier = self.tier is not None
        need = mem.tracked + mem.outside - self.candidate_bytes - (self.movable_bytes if tier else self.banished_bytes)
        if op is not None:  # (its inputs a typed tuple: compiled, the loop indexes it without an iterator)
            for s in op.inputs:  # distinct
                s.last_access = now
                if not s.pinned or (s.moves if tier else s.banished):
                    need += s.nbytes
                s.deps += 1
                s.children.append(op)
            if self.iterations.recording:
                self.iterations.ran(op.inputs, cost, name)
        else:
            distinct: Any = inputs if len(inputs) < 2 else dict.fromkeys(inputs)
            for s in distinct:
                s.last_access = now
                if not s.pinned or (s.moves if tier else s.banished):
                    need += s.nbytes
            if self.iterations.recording:
                self.iterations.ran(list(distinct), cost, name)
        self._need, self._need_op = need, name
        if need > self.floor:
            self.floor, self.floor_op = need, name
        return op

    def output(self, op: Op | None, nbytes: int, payload: Any) -> Storage:
        """A new resident storage produced by ``op``; with ``op=None`` it is pinned (never recomputed)."""
        s = self._storage(op, nbytes, payload)
        self.memory.alloc(s)
        self._need += nbytes
        if self._need > self.floor:
            self.floor, self.floor_op = self._need, self._need_op
        return s

    def _storage(self, op: Op | None, nbytes: int, payload: Any) -> Storage:
        s = Storage(self.next_sid, nbytes, payload, op, op is None)
        self.next_sid += 1
        s.last_access = self.clock
        if op is not None:
            if self.iterations.recording:
                self.iterations.made(s)
            op.outputs.append(s)
            op.live += 1
        self.live[s] = None
        if op is not None:  # (_add_candidate, inlined: this runs for every new value)
            self.candidates[s] = None
            self.candidate_bytes += nbytes
        return s

    def get(self, s: Storage) -> Any:
        """The payload of ``s``, rematerialized first when evicted."""
        if not s.resident:
            self.rematerialize(s)
        return s.payload

    def boundary(self) -> None:
        """An iteration of the program ended (an optimizer step): it becomes the plan the next one follows while
        it matches (NOTE [ Iteration plans ] in plan.py)."""
        if self.plans:
            self.iterations.boundary(self.live, self.remat_cost + self.swap_cost, self.budget is not None)

    def set_cost(self, op: Op, cost: float) -> None:
        """Replace ``op``'s cost by a better measurement (CUDA events), unless the old one is already summed
        into the tracker's state (an output in an evicted union-find set)."""
        if op.compute is not None and not any(self.tracker.grouped(o) for o in op.outputs):
            op.cost = cost

    # ------------------------------------------------------------------ handles and lifetimes
    def add_ref(self, s: Storage) -> None:
        s.refs += 1

    def drop_ref(self, s: Storage) -> None:
        """One handle on ``s`` died. Handles on an old version count on its newest (``new_version``)."""
        while s.forward is not None:
            s = s.forward
        s.refs -= 1
        if s.refs:
            if s.refs < 0:
                internal_assert(False, f"negative handle count on {s}")
        else:
            op = s.op
            if s.deps == 0:
                self._release(s)
            else:
                if s.resident and not s.pinned and s.locks == 0:
                    if _awaited(s):
                        s.awaits = True
                        self._awaiting[s] = None
                    else:
                        self._evict(s, "drop")
                if self.banish_depth:
                    self._orphaned(s)
            if not s.resident and op is not None:  # inputs without handles kept for its recipe are dropped
                for i in op.inputs:
                    if i.refs == 0 and i.resident and not i.locks and not i.pinned and not _awaited(i):
                        self._evict(i, "drop")

    def _orphaned(self, s: Storage) -> None:
        """``s`` lost its last handle but recipes still read it: measure its chain, banish at the limit
        (NOTE [ Banishing ])."""
        if s.pinned:
            s.chain = self.banish_depth
        else:
            op = s.op
            if op is None:
                s.chain = 0
            else:  # a link is an op that sums up two or more values without handles (an accumulation)
                free = longest = 0
                for i in op.inputs:
                    if i.refs == 0 and not i.pinned:
                        free += 1
                        if i.chain > longest:
                            longest = i.chain
                s.chain = (free > 1) + longest
        if s.chain < self.banish_depth:
            return
        for op in list(s.children):
            outs = op.outputs
            if op.compute is None:
                continue
            if not all(o.resident or o.released for o in outs):
                if s.pinned:  # rule 7: kept resident only for evicted values' recipes
                    self._cut(s, op)
                continue
            if not s.pinned and sum(o.nbytes for o in outs if not o.released) > s.nbytes:
                continue
            self.banished += 1
            fresh = [o for o in outs if not o.pinned and not o.released]
            self.invalidate([op], "banished: it read the end of a long chain of values without handles")
            for o in fresh:  # pinned by choice, not by necessity: the floor leaves them out (rule 5)
                o.banished = True
                self.banished_bytes += o.nbytes

    def _cut(self, s: Storage, op: Op) -> None:
        """NOTE [ Banishing ] 7: the pinned ``s`` lost its last handle, and ``op`` reads it for outputs that are
        evicted: drop ``op``'s recipe (and those computed from its evicted outputs) where it loses no held value
        and what it pins is at most a quarter of ``s``'s bytes, which it frees."""
        cost = 0
        seen: set[Op] = set()
        work = [op]
        while work:  # what ``invalidate`` would pin or lose: its walk
            o_op = work.pop()
            if o_op in seen or o_op.compute is None:
                continue
            seen.add(o_op)
            for o in o_op.outputs:
                if o.released or o.pinned:
                    continue
                if not o.resident and o.host is None and o.refs > 0:
                    return  # held and evicted: see rule 7 (bringing it back here could pass the budget)
                if o.resident or o.host is not None:
                    cost += o.nbytes
                    if cost * 4 > s.nbytes:
                        return
                if not o.resident and o.host is None:
                    work.extend(o.children)
        was = {o for o_op in seen for o in o_op.outputs if not o.pinned and not o.released}
        self.banished += 1
        self.invalidate([op], "banished: it read a pinned value only evicted values still needed")
        for o in was:  # pinned by choice (rule 5), as banished outputs are
            if o.pinned and o.resident and not o.released and not o.banished:
                o.banished = True
                self.banished_bytes += o.nbytes

    def _release(self, s: Storage) -> None:
        work = [s]
        while work:
            s = work.pop()
            if s.released:
                continue
            s.released = True
            if s.resident:
                self._unresident(s)
                if s.pinned and self.device_usage is not None and self.budget is not None:
                    # its memory lives on in a plain tensor (an unwrapped p.grad): outside until the next sync
                    self.memory.outside += s.nbytes
            if self.tracking:
                self.tracker.restored(s)
            if s.host is not None:
                self.tier.drop(s)  # type: ignore[union-attr]
            s.payload = None
            live = self.live
            if s in live:  # (not dict.pop with a default: compiled, that is a call by the method's name)
                del live[s]
            if self.listeners:
                self.emit("release", s)
            op = s.op
            if op is None:
                continue
            op.live -= 1
            if op.live and op.compute is not None and _all_pinned(op):  # NOTE [ Lifetimes ] 5
                work.extend(_drop_recipe(op))
            elif op.live == 0:
                op.compute = None
                for i in op.inputs:
                    i.deps -= 1
                    i.children.remove(op)
                    if i.deps == 0 and i.refs == 0:
                        work.append(i)
                # break the storage <-> op reference cycles, so that records die by reference counting
                # instead of waiting for (and slowing down) the cyclic garbage collector
                for o in op.outputs:
                    o.op = None
                op.outputs = []
                op.inputs = ()

    def _unbanish(self, s: Storage) -> None:
        """``s`` stops being resident: its bytes leave ``banished_bytes`` (NOTE [ Banishing ] 5)."""
        if s.banished:
            s.banished = False
            self.banished_bytes -= s.nbytes

    def _unawait(self, s: Storage) -> None:
        """``s`` leaves the kept set (NOTE [ Lifetimes ] 3): no longer resident, or held or pinned again."""
        s.awaits = False
        del self._awaiting[s]

    def _add_candidate(self, s: Storage) -> None:
        self.candidates[s] = None
        self.candidate_bytes += s.nbytes

    def _drop_candidate(self, s: Storage) -> None:
        candidates = self.candidates
        if s in candidates:
            del candidates[s]
            self.candidate_bytes -= s.nbytes

    def _add_movable(self, s: Storage) -> None:
        if self.tier is not None:
            self.movable[s] = None
            self.movable_bytes += s.nbytes

    def _drop_movable(self, s: Storage) -> None:
        if self.movable.pop(s, 0) is None:
            self.movable_bytes -= s.nbytes

    def _unresident(self, s: Storage) -> None:
        s.resident = False
        if s.moves:
            self._drop_movable(s)
        if s.host is not None:  # its spare copy is its only one now (NOTE [ Swapping ] 4)
            self.tier.unspare(s)  # type: ignore[union-attr]
        if s.awaits:
            self._unawait(s)
        if s.banished:
            self._unbanish(s)
        self.memory.free(s)
        candidates = self.candidates
        if s in candidates:  # (_drop_candidate, inlined: this runs for every dropped value)
            del candidates[s]
            self.candidate_bytes -= s.nbytes

    # ------------------------------------------------------------------ constants
    def add_constant(self, nbytes: int, where: str = "") -> None:
        """Count a constant storage (already in memory) against the budget, evicting to make room."""
        self.reserve(nbytes, where)
        self.memory.add_constant(nbytes)

    def remove_constant(self, nbytes: int) -> None:
        self.memory.remove_constant(nbytes)

    # ------------------------------------------------------------------ in-place writes
    def new_version(self, old: Storage, op: Op | None, payload: Any = None) -> Storage:
        """``op`` wrote ``old``'s value in place: the written value becomes a new storage.

        Without ``payload`` the write went to ``old``'s own buffer: the new storage takes over the buffer
        and its bytes, and ``old`` keeps its recipe but is no longer resident, so recipes that read it
        still recompute the value it had. With ``payload`` the write went to a copy (``old`` cannot be
        recomputed but is still read): ``old`` stays resident and the copy is counted as new bytes.
        ``op=None``: the write cannot be replayed, so the new storage is pinned. Handles naming ``old``
        now name the new version: they move with ``old.forward`` (``drop_ref`` follows it), so the newest
        version lives as long as any of them, and ``old`` only as long as recipes read it.
        """
        if not old.resident or old.released:
            internal_assert(False, f"in-place write to non-resident {old}")
        if payload is None and old.deps > 0 and not old.recomputable:
            internal_assert(False, f"in-place write to {old}, which recipes read and nothing can recompute: "
                                   f"the write must go to a copy")
        if payload is not None:
            new = self.output(op, old.nbytes, payload)
        else:  # the bytes move from old to new: tracked does not change
            new = self._storage(op, old.nbytes, old.payload)
            old.payload = None
            old.resident = False
            if old.awaits:
                self._unawait(old)
            self._drop_candidate(old)
            if old.moves:
                self._drop_movable(old)
            self._unbanish(old)
            if old.host is not None:  # its copy keeps the old value: swapped (NOTE [ Swapping ] 4)
                self.tier.unspare(old)  # type: ignore[union-attr]
            elif self.tracking:
                self.tracker.superseded(old)
        old.forward = new
        new.refs += old.refs
        old.refs = 0
        if old.deps == 0:
            self._release(old)
            return new
        if payload is None and old.host is not None and not self._swaps(old):  # NOTE [ Swapping ] 4
            self.tier.drop(old)  # type: ignore[union-attr]
            if self.tracking:
                self.tracker.superseded(old)
        if self.banish_depth and payload is None:
            self._orphaned(old)
        return new

    def overwritten(self, s: Storage) -> None:
        """The driver wrote the pinned ``s`` in place without a new version (nothing reads it): a copy of it in
        the tier holds the old value and goes (NOTE [ Swapping ] 9)."""
        if s.host is not None:
            internal_assert(s.resident, f"in-place write to the swapped {s}")
            self.tier.drop(s)  # type: ignore[union-attr]

    def pin(self, s: Storage, movable: bool = False) -> None:
        """Never drop ``s`` from now on: its memory is shared with something the runtime cannot see, or
        (``movable``) its recipe can no longer run, and then a tier may still copy it out (NOTE [ Swapping ] 9).

        A recipe whose every live output is pinned (and resident) will never run again: it is dropped
        (NOTE [ Lifetimes ] 5), so what only it read is released."""
        if s.pinned:
            if s.moves and not movable:  # its memory is shared now: it stays where it is
                s.moves = False
                self._drop_movable(s)
                if s.host is not None and s.resident:
                    self.tier.drop(s)  # type: ignore[union-attr]
            return
        s.pinned = True
        s.moves = movable
        self._drop_candidate(s)
        if s.host is not None and s.resident and not movable:  # never evicted now: its copy is of no use
            self.tier.drop(s)  # type: ignore[union-attr]
        if movable and s.resident:
            self._add_movable(s)
        op = s.op
        if op is not None and op.compute is not None and _all_pinned(op):
            for i in _drop_recipe(op):
                self._release(i)

    # ------------------------------------------------------------------ changed inputs
    def stranded(self, ops: Sequence[Op]) -> list[Storage]:
        """The evicted storages with handles that ``invalidate(ops)`` would lose, oldest first
        (NOTE [ Changed inputs ] 2)."""
        found: dict[Storage, None] = {}
        seen: set[Op] = set()
        work = list(ops)
        while work:
            op = work.pop()
            if op in seen or op.compute is None:
                continue
            seen.add(op)
            for o in op.outputs:
                if o.resident or o.released or o.host is not None or o in found:
                    continue
                if o.refs > 0:
                    found[o] = None
                work.extend(o.children)
        return sorted(found, key=_sid)

    def rescue(self, ops: Sequence[Op]) -> None:
        """Bring back and pin what ``invalidate(ops)`` would lose that something holds (NOTE [ Changed inputs ]
        2), until nothing is left: bringing one back may evict another value that the walk passed through.
        The pins are movable: only the runtime holds these values (NOTE [ Swapping ] 9)."""
        while True:
            lost = self.stranded(ops)
            if not lost:
                return
            for s in lost:
                if not s.resident:  # (an earlier one's plan may have brought it back)
                    self.rematerialize(s)
                self.pin(s, movable=True)

    def invalidate(self, ops: Sequence[Op], why: str) -> None:
        """The recipes of ``ops`` can no longer run (``why``): pin their resident outputs, lose the evicted
        ones and what was computed from them, release what nothing needs now (NOTE [ Changed inputs ] 3)."""
        work = list(ops)
        while work:
            op = work.pop()
            if op.compute is None:  # released or invalidated already
                continue
            op.compute = None
            op.why = why
            for o in op.outputs:
                if o.released:
                    continue
                if o.resident or o.host is not None:  # a swapped value keeps its copy (NOTE [ Swapping ] 9)
                    self.pin(o, movable=True)
                else:
                    work.extend(o.children)
            inputs, op.inputs = op.inputs, ()
            for i in inputs:
                i.deps -= 1
                i.children.remove(op)
                if i.deps == 0 and i.refs == 0:
                    self._release(i)

    # ------------------------------------------------------------------ budget and eviction
    def set_budget(self, budget: int | None) -> None:
        """Change the budget and evict until tracked bytes fit it; if they cannot, the old budget stays and
        ``BudgetError`` says why."""
        if budget is not None and budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}")
        old, self.budget = self.budget, budget
        try:
            self.reserve(0, "the new budget")
        except BaseException:
            self.budget = old
            raise
        if budget is None:  # nothing to plan for (NOTE [ Iteration plans ] 6)
            self.iterations.stop()
        if self.peak_limit is not None:
            self.peak_limit = None if budget is None else max(self.peak_limit, budget)

    def reserve(self, nbytes: int, where: str = "") -> None:
        """Evict until ``nbytes`` more fit within the budget; raise ``BudgetError`` when they cannot.
        ``where`` names what needs the bytes, for the error message."""
        mem = self.memory
        if self.ops >= self._next_sync:  # never without a device (NOTE [ Budget accounting ] 4)
            self.sync()
        if self.budget is None:
            return
        limit = self.budget - self.headroom
        if self._dirty and mem.tracked + mem.outside + nbytes > limit:
            self.sync()  # plain ops added to the outside count since the last query: most of it may be gone
        tier = self.tier
        layout = self.layout
        while mem.tracked + mem.outside + nbytes + (tier.pending if tier is not None else 0) > limit:
            if tier is not None and tier.pending:  # copies out in flight hold device bytes (NOTE [ Swapping ] 6)
                tier.settle(False)
                if tier.pending and mem.tracked + mem.outside + nbytes + tier.pending > limit:
                    tier.settle(True)
                continue
            if layout is not None:  # NOTE [ Layout-aware eviction ]: once per call
                victims, layout = layout(nbytes) if nbytes > 0 else (), None
                cands, soft = self.candidates, self._soft
                for s in victims:  # (not what an unheld plan's next steps read: the policy keeps those last too)
                    if s in cands and s.resident and not s.locks and not (soft and soft.get(s)):
                        self._evict(s, "evict")
                continue
            victim = self._choose()
            if victim is None:
                # the device's count may be stale (tensors outside died since): learn it before giving up
                if self.device_usage is not None and self._synced != (self.ops, mem.tracked, mem.outside):
                    self.sync()
                    continue
                self._raise_budget(nbytes, where)
            assert victim is not None  # (_raise_budget raised)
            self._evict(victim, "evict")

    @property
    def sync_due(self) -> bool:
        """Whether the next ``reserve`` queries the device (a driver that skips ``reserve`` for ops that fit asks)."""
        return self.ops >= self._next_sync

    def sync(self) -> None:
        """Learn the device's bytes in use from its allocator: what the runtime does not track is ``outside``
        (NOTE [ Budget accounting ] 4). For drivers after the device's usage changed outside their ops (an
        out-of-memory retry, plain ops that allocated); ``reserve`` calls it every ``sync_every`` ops."""
        if self.device_usage is None:
            return
        self.syncs += 1
        self._next_sync = self.ops + self.sync_every
        mem = self.memory
        now, peak = self.device_usage()
        mem.set_outside(max(0, now - mem.tracked - (self.tier.pending if self.tier is not None else 0)))
        self._dirty = False
        self._synced = (self.ops, mem.tracked, mem.outside)
        # NOTE [ Budget accounting ] 6: the allocator's peak rose past the budget since the last sync: what the
        # count missed in between (an unsplit block, a kernel's scratch memory) is kept free from now on
        if self._device_peak >= 0 and peak > self._device_peak:  # a new peak since the last sync
            if mem.peak < peak:  # the allocator's own peak, where the count missed it
                mem.peak = peak
            if self.budget is not None and peak > self.budget:
                self.headroom = min(self.budget // 4, self.headroom + peak - self.budget)
                if not self.excess:
                    over = fmt_bytes(peak - self.budget)
                    warnings.warn(f"torch_dtr: the device's allocator held {over} more than the budget of "
                                  f"{fmt_bytes(self.budget)} since its last query: memory allocated where torch-dtr "
                                  f"could not reserve it first (a kernel's scratch memory on its first call, a "
                                  f"factory, plain code); {fmt_bytes(self.headroom)} is kept free from now on. "
                                  f"stats().excess_bytes reports the most it passed by.", RuntimeWarning, stacklevel=2)
                self.excess = max(self.excess, peak - self.budget)
        self._device_peak = peak

    def add_outside(self, nbytes: int) -> None:
        """The device's usage grew by ``nbytes`` that the runtime does not track (a plain op's outputs); the
        next ``sync`` corrects the count when they die."""
        self.memory.set_outside(self.memory.outside + nbytes)
        self._dirty = True

    def evict_some(self, nbytes: int) -> int:
        """Evict by the policy until ``nbytes`` were freed or nothing is left to evict; return the bytes freed.

        For a front end whose allocator ran out of memory although the budget was kept (fragmentation,
        memory the runtime does not track): it evicts and retries the op before giving up.
        """
        freed = 0
        while freed < nbytes:
            victim = self._choose()
            if victim is None:
                break
            self._evict(victim, "evict")
            freed += victim.nbytes
        return freed

    def out_of_memory(self, nbytes: int, first: Sequence[Storage] = ()) -> int:
        """The device's allocator could not give ``nbytes`` although the budget was kept (fragmentation,
        memory the runtime does not count): evict ``first`` (the driver's choice, e.g. a window of adjacent
        blocks; those no longer evictable are skipped), then by the policy until ``nbytes`` were freed.
        Returns the bytes freed (0: nothing left to evict, the caller gives up); counted in ``Stats``."""
        freed = 0
        for s in first:
            if s.resident and not s.pinned and not s.locks and not s.released:
                self._evict(s, "evict")
                freed += s.nbytes
        if freed < nbytes:
            freed += self.evict_some(nbytes - freed)
        if self.tier is not None and self.tier.pending:  # the copies out must land before the retry
            self.tier.settle(True)
        if freed:
            self.oom_retries += 1
            self.oom_evicted_bytes += freed
        if self.device_usage is not None:
            self.sync()
        return freed

    def evict(self, s: Storage) -> None:
        """Evict ``s`` now, by the driver's choice (it must be resident, unpinned and unlocked)."""
        if not s.resident or s.pinned or s.locks:
            internal_assert(False, f"cannot evict {s}")
        self._evict(s, "evict")

    def _evict(self, s: Storage, kind: str) -> None:
        """Evict ``s``, count it as ``kind`` ("evict": to make room, "drop": NOTE [ Lifetimes ] 3), tell.
        With a tier, a policy's victim may be copied out instead, and one with a copy is swapped for free
        (NOTE [ Swapping ] 2, 4, 5)."""
        tier = self.tier
        if tier is not None and (kind == "evict" or s.host is not None) and self._swaps(s):
            if s.host is None:
                tier.hold(s)
                c = tier.out_cost(s.nbytes)
                self.clock += c
                self.swap_cost += c
            self._unresident(s)
            s.payload = None
            if self.listeners:
                self.emit("swapout", s)
        else:
            if s.host is not None:  # recomputing it is cheaper now: its copy goes
                tier.drop(s)  # type: ignore[union-attr]
            self._unresident(s)
            self.victim.evict(s)
            if self.tracking:
                self.tracker.evicted(s)
        if kind == "evict":
            self.evictions += 1
        else:
            self.drops += 1
        if self.listeners:
            self.emit(kind, s)

    def _swaps(self, s: Storage) -> bool:
        """Whether the victim ``s`` is swapped rather than dropped (NOTE [ Swapping ] 2): copying it back (and
        out, when it has no copy yet) costs less than recomputing it with its evicted ancestors."""
        tier: Tier = self.tier  # type: ignore[assignment]
        n = s.nbytes
        copy = tier.in_cost(n)
        if s.host is None:
            if n > tier.free_bytes():
                return False
            copy += tier.out_cost(n)
        if s.pinned or not s.recomputable:  # a pinned value is never dropped (NOTE [ Swapping ] 9)
            return True
        if s.refs == 0 and self.budget is not None and tier.used + (0 if s.host is not None else n) > self.budget:
            return False  # NOTE [ Swapping ] 10: copies of values without handles stay within the device budget
        return copy < _recompute_cost(s, copy, tier.per_op)

    def _swap_in(self, s: Storage) -> None:
        """Copy the swapped ``s`` back (NOTE [ Swapping ] 3); it keeps its copy as a spare (rule 4)."""
        tier: Tier = self.tier  # type: ignore[assignment]
        self._recomputing = True
        try:
            self.reserve(s.nbytes, f"copying back {s.op.name if s.op is not None and s.op.name else 'a value'}")
        finally:
            self._recomputing = False
        s.payload = tier.copy_in(s)
        if s.pinned and not s.moves:  # never copied out again: its copy is of no use
            tier.drop(s)
        else:
            tier.keep(s)
        tier.ins += 1
        tier.bytes_in += s.nbytes
        c = tier.in_cost(s.nbytes)
        self.clock += c
        self.swap_cost += c
        s.resident = True
        s.last_access = self.clock
        self.memory.alloc(s)
        if not s.pinned:
            self._add_candidate(s)
        elif s.moves:
            self._add_movable(s)
        if self.listeners:
            self.emit("swapin", s)

    def _raise_budget(self, nbytes: int, where: str) -> None:
        mem = self.memory
        held = mem.tracked + mem.outside
        locked = sum(s.nbytes for s in self.candidates if s.locks)
        need = held + nbytes + self.headroom
        # the driver's op: its inputs are what is locked; bytes pinned by banishing are a choice, not a need
        # (NOTE [ Banishing ] 5), so they stay out of the floor unless the op reads them (locked)
        if not self._recomputing:
            chosen = sum(s.nbytes for s in self.live if s.banished and not s.locks) if self.banished_bytes else 0
            if need - chosen > self.floor:
                self.floor, self.floor_op = need - chosen, where
        floor = ""
        if self.floor:
            below = "below it no schedule can run" if self.floor > self.budget else "the budget is above it"  # type: ignore[operator]
            floor = (f" The program's single-op floor so far is {fmt_bytes(self.floor)}"
                     f"{' (' + self.floor_op + ')' if self.floor_op else ''}: {below}.")
        outside = ""
        if self.device_usage is not None:
            outside = (f", outside torch-dtr's reach {fmt_bytes(mem.outside)} (device memory it does not manage: "
                       f"parameters and buffers no managed op has read yet, optimizer state, inputs, plain "
                       f"tensors, workspaces, allocator rounding)")
            if self.headroom:
                outside += (f", and {fmt_bytes(self.headroom)} is kept free for what the allocator counted "
                            f"beyond torch-dtr's count between two queries")
        n, fix = _suggest(max(need, self.floor), self.fix, self.advise)
        raise BudgetError(
            f"torch_dtr: budget {fmt_bytes(self.budget or 0)} ({self.budget} B) cannot be kept: "
            f"{fmt_bytes(held)} cannot be evicted (constants {fmt_bytes(mem.constants)}, "
            f"locked by the op in flight and recomputations {fmt_bytes(locked)}, pinned or kept "
            f"{fmt_bytes(mem.tracked - mem.constants - locked)}{outside}) and {where or 'the op'} needs "
            f"{fmt_bytes(nbytes)} more; "
            f"a budget of at least {fmt_bytes(need)} ({need} B) is needed here.{floor} {fix}", budget=n)

    def _raise_undone(self, roots: Sequence[Storage], ran: int, planned: int) -> None:
        need = sum(r.nbytes for r in roots)
        n, fix = _suggest(max(self.budget or 0, self.floor) * 1.15, self.fix, self.advise)
        raise BudgetError(
            f"torch_dtr: budget {fmt_bytes(self.budget or 0)} ({self.budget} B) cannot be kept while bringing back "
            f"{len(roots)} evicted value(s) of {fmt_bytes(need)}: their plan of {planned} recomputations needs more "
            f"than the budget while it holds its values, and without holding them the policy evicted them again "
            f"before their readers ran ({ran} recomputations, then it gave up; constants "
            f"{fmt_bytes(self.memory.constants)}, single-op floor so far {fmt_bytes(self.floor)}). {fix}", budget=n)

    def track(self) -> None:
        """Start the policy's tracker now (NOTE [ Lazy tracking ]): tell it every evicted storage, oldest first.
        Idempotent; for drivers and tests that read the tracker's features before any choice."""
        if self.tracking:
            return
        self.tracking = True
        tracker = self.tracker
        for s in self.live:
            if not s.resident:
                if s.forward is None:
                    tracker.evicted(s)
                else:
                    tracker.superseded(s)

    def _choose(self) -> Storage | None:
        best = self._candidate()
        if self.movable:  # NOTE [ Swapping ] 9: a pinned value the tier can take, if it scores lower
            t0 = time.perf_counter()
            m, v = self._best_movable(True)
            if m is None and best is None and self._soft:  # what an unheld plan reads, as a last resort
                m, v = self._best_movable(False)
            if m is not None and v < self._score:
                best = m
            self.search_seconds += time.perf_counter() - t0
        return best

    def _best_movable(self, skip_soft: bool) -> tuple[Storage | None, float]:
        """Of the pinned values a tier may copy out (``movable``), the one with the lowest score, the copies
        it needs as its cost, and that score (NOTE [ Swapping ] 9). ``skip_soft``: not one that an unheld
        plan's next steps read."""
        tier: Tier = self.tier  # type: ignore[assignment]
        room = tier.free_bytes()
        soft = self._soft if skip_soft else None
        now = self.clock
        policy = self.policy
        # a copy back brings no evicted neighbourhood with it (NOTE [ Swapping ] 3): the smallest extra there is
        neutral = Chain(0.0, 0.0, 1) if policy.extra == "chain" else 0.0
        best, best_score = None, math.inf
        for s in self.movable:
            n = s.nbytes
            if s.locks or n == 0 or (s.host is None and n > room) or (soft and soft.get(s)):
                continue
            cost = tier.in_cost(n) + (0.0 if s.host is not None else tier.out_cost(n))
            stale = now - s.last_access + 1e-9
            v = cost / (n * stale) if policy.h_dtr else policy.score(cost, n, stale, neutral)
            if v < best_score:
                best, best_score = s, v
        return best, best_score

    def _candidate(self) -> Storage | None:
        """The policy's victim among the candidates; ``_score`` its score (-inf: a due drop or a plan's
        furthest read, taken first; inf: none)."""
        if not self.tracking:
            self.track()
        t0 = time.perf_counter()
        self._score = -math.inf
        cands = self.candidates
        n = len(cands)
        if n == 0:
            self._score = math.inf
            self.search_seconds += time.perf_counter() - t0
            return None
        pool: Any = cands
        if self.sample_sqrt and n > 16:
            pool = self.rng.sample(list(cands), max(16, math.isqrt(n)))
        floor: Any = self.min_evict_bytes
        if floor is None:
            floor = 0.01 * self.candidate_bytes / n
        if floor < self.evict_minimum:
            floor = self.evict_minimum
        soft = self._soft
        best = None
        if self._awaiting:  # NOTE [ Lifetimes ] 3: kept for an evicted output, which nothing waits for now
            best = self._settled(soft)
            if best is not None:
                self.search_seconds += time.perf_counter() - t0
                return best
        if soft:  # an unheld plan runs: what its next steps read goes last (NOTE [ Planned rematerialization ] 4)
            best = self._best([s for s in pool if not soft.get(s)], floor)
            if best is None:
                best = self._furthest(cands)
                self._score = -math.inf if best is not None else math.inf
        if best is None:
            best = self._best(pool, floor)
        least = self.evict_minimum
        if best is None and floor > least:
            best = self._best(pool, least)
        if best is None and pool is not cands:
            best = self._best(cands, least)
        self.search_seconds += time.perf_counter() - t0
        return best

    def _settled(self, soft: dict[Storage, int] | None) -> Storage | None:
        """A value kept without handles for a reader's evicted output (NOTE [ Lifetimes ] 3) that no such
        output waits for any more: the drop it was spared is due (not one an unheld plan's next steps read)."""
        found, gone = None, []
        for s in self._awaiting:
            if s.refs or s.pinned:  # held again (a new view), or pinned since
                gone.append(s)
            elif not s.locks and not _awaited(s) and not (soft and soft.get(s)):
                found = s
                break
        for s in gone:
            self._unawait(s)
        return found

    def _furthest(self, cands: Any) -> Storage | None:
        """Of the candidates the unheld plan's pending steps read, the one whose next read is furthest
        ahead (the larger on a tie): NOTE [ Planned rematerialization ] 4. The order is computed once per
        state of the plan's steps (``_steps_rev``), not per eviction."""
        if self._ahead_rev != self._steps_rev:
            steps, roots = self._steps, self._roots
            ahead: dict[Storage, int] = {}  # storage -> steps until its next read
            n = len(steps)  # type: ignore[arg-type]
            for k in range(n - 1, -1, -1):
                # a step already resident (brought back with a sibling) is popped without running unless it is
                # evicted first; counting its reads anyway measured better (tests' MLP 28% vs 29% of its peak)
                st = steps[k]  # type: ignore[index]
                for i in roots if st is None else _reads(st):
                    if i not in ahead:
                        ahead[i] = n - k
            self._ahead = sorted(ahead, key=lambda i: (-ahead[i], -i.nbytes))
            self._ahead_rev = self._steps_rev
        least = max(1, self.evict_minimum)
        for s in self._ahead:
            if s.resident and not s.locks and s.nbytes >= least and s in cands:
                return s
        return None

    def _best(self, pool: Any, floor: float) -> Storage | None:
        score = self.policy.score
        extra = self.tracker.extra if self.tracker.scores else None
        bound = self.policy.extra_floor if extra is not None else None
        now = self.clock
        best, best_score = None, math.inf
        self.scored += len(pool)
        it = self.iterations
        if it.steer:  # NOTE [ Iteration plans ] 3: the plan's next read instead of the last read
            return self._best_planned(pool, floor, it)
        if self.policy.h_dtr:  # the same loop with the default's score inline (the hot path of evicting)
            # the default tracker's ``extra`` called as the typed function it is (the same value; a bound
            # method called through ``Any`` cost about half the search on the bench's LSTM loop)
            comp = type(self.tracker) is Components and bound == 0.0
            lo = float(floor)
            s: Storage
            for s in pool:
                n = s.nbytes
                if s.locks or n < lo or n == 0:
                    continue
                op = s.op
                c = op.cost if op is not None else 0.0
                d = n * (now - s.last_access + 1e-9)
                if extra is None:
                    v = (c + 0.0) / d
                elif bound is not None and (c + bound) / d >= best_score:
                    continue
                elif comp:
                    v = (c + comp_extra(s)) / d
                else:
                    v = (c + extra(s)) / d
                if v < best_score:
                    best, best_score = s, v
            self._score = best_score
            return best
        for s in pool:
            if s.locks or s.nbytes < floor or s.nbytes == 0:
                continue
            stale = now - s.last_access + 1e-9
            if extra is None:
                v = score(s.cost, s.nbytes, stale, 0.0)
            elif bound is not None and score(s.cost, s.nbytes, stale, bound) >= best_score:
                continue  # even its smallest possible score does not win: its extra is not needed
            else:
                v = score(s.cost, s.nbytes, stale, extra(s))
            if v < best_score:
                best, best_score = s, v
        self._score = best_score
        return best

    def _best_planned(self, pool: Any, floor: float, it: Iterations) -> Storage | None:
        """``_best`` while an iteration follows its plan: staleness replaced by its geometric mean with the time to
        the plan's next read (NOTE [ Iteration plans ] 3)."""
        score = self.policy.score
        extra = self.tracker.extra if self.tracker.scores else None
        bound = self.policy.extra_floor if extra is not None else None
        comp = type(self.tracker) is Components and bound == 0.0
        now = self.clock
        best, best_score = None, math.inf
        it.clean = False
        s: Storage
        for s in pool:
            n = s.nbytes
            if s.locks or n < floor or n == 0:
                continue
            dist = it.distance(s, now - s.last_access) + 1e-9
            c = s.cost
            if extra is None:
                v = score(c, n, dist, 0.0)
            elif bound is not None and score(c, n, dist, bound) >= best_score:
                continue
            else:
                v = score(c, n, dist, comp_extra(s) if comp else extra(s))
            if v < best_score:
                best, best_score = s, v
        self._score = best_score
        return best

    # ------------------------------------------------------------------ rematerialization
    def lock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks += 1

    def unlock(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            s.locks -= 1

    def rematerialize(self, target: Storage) -> None:
        """Make ``target`` resident again, recomputing its evicted ancestors first, by a plan (no recursion;
        NOTE [ Planned rematerialization ])."""
        if target.resident:
            return
        try:
            self.bring([target])
        except BudgetError:
            self.bring([target], hold=False)

    def _recipe(self, s: Storage) -> Op:
        """``s``'s recipe, which must be able to run (else ``ConstantChangedError`` or ``InternalError``)."""
        op = s.op
        if op is not None and op.why is not None and not s.released:
            raise ConstantChangedError(
                f"torch_dtr: cannot recompute the output of {op.name or 'an op'} ({s}): it was "
                f"evicted, and then {op.why}. Read values before such a change, or keep them with "
                f"torch_dtr.unwrap(t).")
        if op is None or op.compute is None or s.released:
            internal_assert(False, f"cannot rematerialize {s}: it has no recipe")
        return op  # type: ignore[return-value]

    def plan(self, roots: Sequence[Storage]) -> list[Storage]:
        """The evicted storages to recompute, in order, to make ``roots`` resident: one per recipe (each
        recipe recomputes all its missing outputs), every one after the evicted inputs of its recipe, and
        of several evicted inputs the one with the longest evicted chain below it first, so that each
        value waits as briefly as possible for its reader (NOTE [ Planned rematerialization ] 2)."""
        # 1. the evicted ancestors (one storage per recipe; a swapped storage is a step of its own, with no
        # inputs: NOTE [ Swapping ] 3)
        first: dict[Any, Storage] = {}
        work = [s for s in roots if not s.resident]
        while work:
            s = work.pop()
            if s.host is not None:
                first[s] = s
                continue
            op = self._recipe(s)
            if op in first:
                continue
            first[op] = s
            work.extend(i for i in op.inputs if not i.resident)
        # 2. depth: the longest chain of evicted recipes below each; inputs are older than outputs, so
        # ascending storage ids is a topological order
        depth: dict[Any, int] = {}
        for k in sorted(first, key=lambda o: first[o].sid):
            depth[k] = 1 if type(k) is Storage else 1 + max(
                (depth[_step(i)] for i in k.inputs if not i.resident), default=0)

        def order(s: Storage) -> list[Storage]:  # evicted inputs; the next to visit (deepest, then oldest) last
            if s.host is not None:
                return []
            ins = [i for i in s.op.inputs if not i.resident]  # type: ignore[union-attr]
            ins.sort(key=lambda i: (depth[_step(i)], -i.sid))
            return ins

        # 3. post-order from the roots, deepest input first
        out: list[Storage] = []
        done: set[Any] = set()
        for root in roots:
            if root.resident or _step(root) in done:
                continue
            stack: list[tuple[Storage, list[Storage]]] = [(root, order(root))]
            while stack:
                s, ins = stack[-1]
                while ins and _step(ins[-1]) in done:
                    ins.pop()
                if ins:
                    i = ins.pop()
                    stack.append((i, order(i)))
                    continue
                stack.pop()
                k = _step(s)
                if k not in done:
                    done.add(k)
                    out.append(s)
        return out

    def bring(self, roots: Sequence[Storage], *, hold: bool = True) -> None:
        """Make every storage of ``roots`` resident at once, locking nothing on return (the caller locks
        them before anything else runs): NOTE [ Planned rematerialization ].

        ``hold=True``: each recomputed value stays locked until the last step of the plan that reads it
        has run (no value is computed twice, but the plan's live values cannot make room). ``hold=False``:
        nothing is locked between steps, so the policy may evict a planned value again; a step that finds
        an input missing a second time locks the others it has, and a plan that keeps being undone gives up
        with ``BudgetError`` (rule 4)."""
        missing = [r for r in roots if not r.resident]
        if not missing:
            return
        if len(missing) == 1 and (hold or len(roots) == 1) and missing[0].host is not None:
            keep: Any = [r for r in roots if r.resident]
            self.lock(keep)
            try:
                self._swap_in(missing[0])
            finally:
                self.unlock(keep)
            return
        if len(missing) == 1 and (hold or len(roots) == 1):
            op: Any = self._recipe(missing[0])
            if all(i.resident for i in op.inputs):  # the common case: one recipe, its inputs resident
                keep = [*op.inputs, *(r for r in roots if r.resident)] if len(roots) > 1 else op.inputs
                self.lock(keep)
                try:
                    self._recompute(op, roots)
                finally:
                    self.unlock(keep)
                return
        # a step is a storage to recompute, or None: the caller's op, which reads ``roots``
        steps: list[Storage | None] = [None]
        pending: dict[Storage, int] = dict.fromkeys(roots, 1)  # storage -> pending steps that read it
        leaves: set[Storage] = set()  # steps planned as copies back (NOTE [ Swapping ] 3)
        limit = 4 * (self._push(steps, pending, missing, leaves) + 8)  # steps run before giving up (hold=False)
        tries: dict[Storage | None, int] = {}
        held: dict[Storage | None, list[Storage]] = {}  # locks a retried step keeps until it runs
        kept: set[Storage] = set()  # hold=True: recomputed values locked until their last planned reader
        brought: dict[Storage, None] = {}  # recomputed on the way, the roots excepted
        rootset = set(roots)
        ran = 0
        outer = self._soft, self._steps, self._roots
        if not hold:
            self._soft, self._steps, self._roots = pending, steps, roots
            self._steps_rev += 1
        try:
            while steps:
                s = steps[-1]
                if s is None or not s.resident:
                    swapped = s is not None and s.host is not None  # a copy back: no inputs (Swapping 3)
                    op = None if s is None or swapped else self._recipe(s)
                    ins = roots if s is None else () if swapped else op.inputs  # type: ignore[union-attr]
                    missing = [i for i in ins if not i.resident]
                    if missing:  # evicted since it was planned, or since it was recomputed
                        n = tries[s] = tries.get(s, 0) + 1
                        if n > 1:
                            keep = held.setdefault(s, [])
                            for i in ins:
                                if i.resident and i not in keep:
                                    i.locks += 1
                                    keep.append(i)
                        self._push(steps, pending, missing, leaves)
                        continue
                    if s is not None:
                        ran += 1
                        if not hold and ran > limit:
                            self._raise_undone(roots, ran, limit // 4 - 8)
                        if swapped:
                            self._swap_in(s)
                        else:
                            self.lock(ins)
                            try:
                                self._recompute(op, rootset)  # type: ignore[arg-type]
                            finally:
                                self.unlock(ins)
                        for o in (s,) if swapped else op.outputs:  # type: ignore[union-attr]
                            if o.resident and o not in rootset:
                                brought[o] = None
                                if hold and o not in kept and pending.get(o, 0) > 0:
                                    o.locks += 1
                                    kept.add(o)
                steps.pop()
                self._steps_rev += 1
                self.unlock(held.pop(s, ()))
                if s not in leaves:  # (a step planned as a recipe and swapped since still read its recipe's inputs)
                    self._done_reads(roots if s is None else s.op.inputs if s.op is not None else (),
                                     pending, kept, brought)
        finally:
            self._soft, self._steps, self._roots = outer
            self._steps_rev += 1
            for keep in held.values():
                self.unlock(keep)
            self.unlock(list(kept))
            for s in brought:  # rule 2
                self._drop_brought(s)

    def _done_reads(self, ins: Sequence[Storage], pending: dict[Storage, int], kept: set[Storage],
                    brought: dict[Storage, None]) -> None:
        """A plan's step that read ``ins`` ran: unlock and drop what no pending step reads now."""
        for i in ins:
            left = pending[i] = pending.get(i, 1) - 1
            if left == 0:
                if i in kept:
                    kept.discard(i)
                    i.locks -= 1
                if i in brought:
                    self._drop_brought(i)

    def _push(self, steps: list[Storage | None], pending: dict[Storage, int], missing: list[Storage],
              leaves: set[Storage]) -> int:
        plan = self.plan(missing)
        self._steps_rev += 1
        for m in plan:
            if m.host is not None:
                leaves.add(m)
                continue
            leaves.discard(m)
            for i in m.op.inputs:  # type: ignore[union-attr]
                pending[i] = pending.get(i, 0) + 1
        steps.extend(reversed(plan))
        return len(plan)

    def _drop_brought(self, s: Storage) -> None:
        """Evict ``s`` if nothing holds it and every reader's outputs are resident (NOTE [ Planned
        rematerialization ] 2)."""
        if (s.refs == 0 and s.resident and not s.locks and not s.pinned and not s.released
                and all(o.resident or o.released for c in s.children for o in c.outputs)):
            self._evict(s, "drop")

    def _recompute(self, op: Op, keep: Any = ()) -> None:
        """Run ``op``'s recipe again for its missing outputs. ``keep``: storages that must stay resident
        (the roots a plan brings back), never lent (NOTE [ Planned rematerialization ] 6)."""
        siblings = [o for o in op.outputs if o.resident]
        # inputs the recipe may write in place instead of copying: nothing but this recipe reads them
        lend = [s for s in op.writes if s.resident and s.refs == 0 and s.deps == 1 and not s.pinned
                and s not in keep] if op.writes else None
        self.lock(siblings)  # reserve() must not evict an output that compute() is about to bring back
        self._recomputing = True
        try:
            need = sum(o.nbytes for o in op.outputs if not o.resident and not o.released) + op.scratch
            self.reserve(max(0, need - sum(s.nbytes for s in lend)) if lend else need,
                         f"recomputing {op.name or 'an op'}")
        finally:
            self._recomputing = False
            self.unlock(siblings)
        t0 = time.perf_counter()
        payloads = op.compute(lend) if lend else op.compute()  # type: ignore[misc]
        self.remat_seconds += time.perf_counter() - t0
        for s in lend or ():  # its buffer now holds an output: its bytes move there (freed before counted)
            s.payload = None
            self._unresident(s)
            if self.tracking and s.host is None:  # with a copy it is swapped (NOTE [ Swapping ] 4)
                self.tracker.evicted(s)
            self.drops += 1
            if self.listeners:
                self.emit("drop", s)
        self.remat_cost += op.cost
        self.rematerializations += 1
        self.clock += op.cost
        now = self.clock
        for i in op.inputs:
            i.last_access = now
        for o, p in zip(op.outputs, payloads, strict=True):
            if o.resident or o.released:
                continue
            o.payload = p
            o.resident = True
            o.last_access = now
            self.memory.alloc(o)
            if not o.pinned:
                self._add_candidate(o)
            elif o.moves:
                self._add_movable(o)
            if o.host is not None:  # swapped, recomputed with a sibling: its copy is a spare
                self.tier.keep(o)  # type: ignore[union-attr]
            elif self.tracking:
                self.tracker.restored(o)
            if self.listeners:
                self.emit("remat", o)

    # ------------------------------------------------------------------ reporting
    def stats(self) -> Stats:
        return Stats(
            budget_bytes=self.budget,
            resident_bytes=self.memory.tracked,
            peak_bytes=self.memory.peak,
            constant_bytes=self.memory.constants,
            evictions=self.evictions,
            drops=self.drops,
            rematerializations=self.rematerializations,
            remat_seconds=self.remat_seconds,
            search_seconds=self.search_seconds,
            ops=self.ops,
            live_storages=len(self.live),
            floor_bytes=self.floor,
            floor_op=self.floor_op,
            banished=self.banished,
            outside_bytes=self.memory.outside,
            syncs=self.syncs,
            oom_retries=self.oom_retries,
            oom_evicted_bytes=self.oom_evicted_bytes,
            excess_bytes=self.excess,
            iterations=self.iterations.boundaries,
            planned=self.iterations.planned,
            diverged=self.iterations.diverged,
            **({} if self.tier is None else {
                "swaps_out": self.tier.outs, "swaps_in": self.tier.ins, "host_bytes": self.tier.used,
                "host_peak_bytes": self.tier.peak}),
        )

    def reset_peak(self) -> None:
        self.memory.peak = self.memory.tracked + self.memory.outside
        self.peak_limit = self.budget

    def check(self) -> None:
        """Assert the invariants of ``records`` (for tests; O(records))."""
        total = banished = 0
        deps: dict[Storage, int] = {s: 0 for s in self.live}
        ops = {op for s in self.live for op in s.children} | {s.op for s in self.live if s.op is not None}
        for op in ops:
            if op.live > 0:
                for i in op.inputs:
                    internal_assert(not i.released, f"live {op} reads released {i}")
                    deps[i] = deps.get(i, 0) + 1
        for s in self.live:
            internal_assert(not s.released, f"released {s} still in live set")
            internal_assert(s.deps == deps[s], f"{s} counts {s.deps} dependents, found {deps[s]}")
            if s.resident:
                internal_assert(s.payload is not None, f"resident {s} has no payload")
                total += s.nbytes
            internal_assert((s in self.candidates) == (s.resident and not s.pinned), f"candidate set wrong for {s}")
            internal_assert(not s.banished or (s.resident and s.pinned), f"banished {s} not resident and pinned")
            internal_assert(not s.moves or s.pinned, f"{s} moves but is not pinned")
            internal_assert((s in self.movable) == (self.tier is not None and s.resident and s.moves),
                            f"movable set wrong for {s}")
            internal_assert(s.awaits == (s in self._awaiting) and (not s.awaits or s.resident),
                            f"{s}: awaits={s.awaits} but {'in' if s in self._awaiting else 'not in'} the kept set")
            banished += s.nbytes if s.banished else 0
        internal_assert(all(s in self.live for s in self._awaiting), "a released value in the kept set")
        if self.tier is not None:
            tier = self.tier
            copies = [s for s in self.live if s.host is not None]
            internal_assert(sum(s.nbytes for s in copies) == tier.used, f"host tier counts {tier.used} B, holds "
                                                                       f"{sum(s.nbytes for s in copies)} B")
            internal_assert(set(tier.spare) == {s for s in copies if s.resident}, "spare copies wrong")
            internal_assert(sum(s.nbytes for s in tier.spare) == tier.spare_bytes, "spare bytes wrong")
            internal_assert(tier.budget is None or tier.used <= tier.budget,
                            f"host tier holds {tier.used} B over its budget {tier.budget} B")
            internal_assert(not any(s.pinned and not s.moves for s in tier.spare), "a pinned value keeps a copy")
            internal_assert(sum(s.nbytes for s in self.movable) == self.movable_bytes, "movable bytes wrong")
        internal_assert(banished == self.banished_bytes, f"banished bytes {self.banished_bytes} != {banished}")
        internal_assert(total + self.memory.constants == self.memory.tracked,
                        f"tracked {self.memory.tracked} != resident {total} + constants {self.memory.constants}")
        if self.peak_limit is not None and self.budget is not None and self.device_usage is None:
            limit = max(self.peak_limit, self.budget)
            internal_assert(self.memory.peak <= limit,
                            f"peak {self.memory.peak} > budget {limit} (the largest in force)")
