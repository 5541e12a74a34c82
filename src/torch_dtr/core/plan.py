"""Plans from traced iterations (MegTaiChi's observation): training repeats itself, so the last whole iteration
says when each value of the next one will be read.

# NOTE [ Iteration plans ]
#
# 1. Iterations: the driver calls ``Runtime.boundary()`` where one ends (the front ends: after each optimizer step;
#    the simulator: between the passes of a log replayed several times). Between two boundaries the runtime records
#    what the program ran (``Iterations``): per op, a key (its name and, for each input, which output of this
#    iteration it is, or -1 for anything older: constants, parameters, values kept from before) and the op cost
#    summed so far; per output, its bytes and the positions of the ops that read it. Recomputations are not the
#    program's reads and are not recorded. Nothing else is kept: the record is a few lists of ints.
# 2. The plan: at a boundary the iteration just recorded becomes the plan of the next (``Plan``), which then follows
#    it while the program matches it: op by op the key and every output's bytes must be the plan's. At the first
#    difference (another branch, shape or routing, more or fewer ops) the rest of the iteration runs on the dynamic
#    policy alone; ``Stats.diverged`` counts those iterations and ``Stats.planned`` the ones followed to the end.
# 3. What following means: the eviction search scores a candidate made in this iteration with h_DTR's (cost +
#    neighbourhood) / (bytes x t), where t is the geometric mean of its staleness and the time until the plan's next
#    read of it, in summed op cost from the op about to run (a value with handles at the iteration's end is read
#    there; one the plan never reads again is a full iteration beyond the end). Candidates from before this iteration
#    keep their staleness. Every other rule (locks, pins, an unheld rematerialization's next reads kept last, the
#    host tier) is unchanged: the plan only reorders the candidates. The mean and not the distance alone (Belady's
#    furthest-next-use rule) because it measured better; why is not established (a guess: the plan lists the
#    program's reads, not those of the recomputations it will cause, which staleness partly sees). Replaying 24
#    logs (benchmarks/plans.py) for two iterations at 0.2-0.9 of their peaks, the second iteration against the
#    dynamic policy's: the distance alone better in 59 cells and worse in 55, the mean better in 55 and worse in 31.
#    Weighing the distance by 0.35 or 0.7 instead of 0.5 (d^w x staleness^(1-w)): the last of six iterations better
#    in 63 and 60 cells (0.7: worse in one) against the mean's 67.
# 4. Deterministic: the plan is what was recorded, the keys are compared for equality only, and every choice
#    depends on the same state as before; a trace replayed with its boundaries (``["S"]`` rows) makes the same
#    choices as the session that wrote it.
# 5. Which rule: the plan is no better everywhere (point 3), so each program measures it, by the recomputation and
#    copy cost (the runtime's modelled cost) of whole iterations that matched the plan. An iteration in which no
#    eviction was chosen by a plan (the first; one that left its plan before any) is what the dynamic policy costs
#    on the plan it leaves; the next iteration follows the plan; from then on the rule whose last iteration cost
#    less is used, a tie going to the dynamic policy. Where no such measurement exists (a divergence after the plan
#    chose), one iteration runs without the plan first. So a repeated iteration costs, from the third on, no more
#    than what the dynamic policy measured, where iterations cost alike from one to the next. Trying the distance alone
#    as a third rule (benchmarks/plans.py, 2026-11-29) made the last iteration cheaper in 82 cells instead of 67,
#    but its trial iteration ran out of memory on the MoE at 0.5 where the dynamic policy trains: a trial can fail
#    where neither kept rule would, so the riskier rule is not tried. Steering by the exact optimum's keep sets
#    (Checkmate's ``S[t+1]``, sim/checkmate.py: candidates the ILP does not keep evicted first) was tried on the
#    recorded 5-layer MLP (38 nodes; 2026-11-30, a probe, not kept): its iterations cost what the dynamic policy's
#    do (1.265 at 0.7 of the peak, the ILP 1.201; the same at 0.6, 0.8, 0.9). So the ILP's lead does not come from
#    which values it keeps; a guess: from where it recomputes (ahead of need, in a stage's index order), which a
#    runtime that recomputes on demand does not follow.
# 6. Cost: recording adds about 0.5 us per op (two list appends per op and per output, on a 2-core CPU), so it runs
#    only under a budget (a budget set later starts at the next boundary), and stops for the rest of an iteration
#    past ``LIMIT`` ops (a program without optimizer steps: inference, ``generate()``), so that its record never
#    grows without bound; such a stretch leaves no plan.
# 7. Recomputing ahead of need: after each op of an iteration that follows its plan (either rule), once something was
#    evicted in it, the runtime reads the plan's next ``AHEAD`` (4) ops (``Runtime.ahead``, remat.py ``ahead``): an
#    input of theirs that is evicted is brought back now, if its plan's steps (``_plan_bytes``: what they hold at
#    most, a recomputed value without handles dropped after its last planned reader) and then the value, with what
#    those ops will make, fit in the bytes free under the budget; at the first that does not fit it stops, and the op
#    that reads it brings it back when it runs, as before. So nothing is evicted for it, and the recomputation runs
#    where memory is low instead of where the reader's other inputs and outputs crowd it: Checkmate's optimum
#    recomputes so, in the stage before the read (on the recorded 5-layer MLP at 0.7 of its peak the op reading a
#    layer's activation came after the gradient it also reads; recomputed on demand, the activation's chain evicted
#    that gradient, recomputed later: 1.265 against the optimum's 1.171; ahead, 1.171, the optimum's own
#    recomputations). Not in an iteration whose recomputations already passed its op time (thrashing: on the bench's
#    LSTM log at 0.8 of its peak, where the dynamic policy's trial iteration costs 9.4x, reading ahead made an unheld
#    plan give up). ``Stats.ahead`` counts the values brought back so.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from .records import Storage

LIMIT = 100_000  # ops recorded between two boundaries at most (rule 6)
# the rules an iteration may run by (rule 5): the dynamic policy alone, the plan (rule 3); tried in RULES' order,
# ties broken in ORDER's
NONE, MEAN = 0, 1
RULES = (MEAN, NONE)
ORDER = (NONE, MEAN)


class Plan:
    """One recorded iteration (NOTE [ Iteration plans ] 1): the program's op keys, the summed op cost after each op,
    and per output (in the order made) its bytes and the positions of the ops that read it."""

    __slots__ = ("keys", "times", "sizes", "uses", "total", "firsts", "reads", "made")

    def __init__(self, keys: list[int], times: list[float], sizes: list[int], uses: list[list[int]],
                 firsts: list[int]) -> None:
        self.keys = keys
        self.times = times
        self.sizes = sizes
        self.uses = uses
        self.total = times[-1] if times else 0.0
        self.firsts = firsts  # per op, the outputs made before it ran; then all of them (rule 7)
        self.reads: list[list[int]] = []  # per op, the outputs of the iteration it reads (``index``)
        self.made: list[int] = []  # per output, the bytes the iteration made before it; then all of them

    def index(self) -> None:
        """Fill ``reads`` and ``made`` (once, at the first look ahead: NOTE [ Iteration plans ] 7)."""
        n = len(self.keys)
        reads: list[list[int]] = [[] for _ in range(n)]
        for i in range(len(self.uses)):
            for u in self.uses[i]:
                if u < n:
                    reads[u].append(i)
        made = [0]
        total = 0
        for b in self.sizes:
            total += b
            made.append(total)
        self.reads, self.made = reads, made


class Iterations:
    """Records the iteration running now and follows the last whole one's plan (NOTE [ Iteration plans ])."""

    __slots__ = ("base", "next_tag", "pos", "elapsed", "keys", "times", "sizes", "uses", "plan", "following",
                 "steer", "rule", "boundaries", "planned", "diverged", "divergence", "spent", "tried", "recording",
                 "clean", "firsts", "stores", "evictions")

    def __init__(self, recording: bool = True) -> None:
        self.recording = recording  # rule 6: only under a budget, and at most ``LIMIT`` ops per iteration
        self.base = 0  # tags >= base were made in this iteration (tag - base: their index)
        self.next_tag = 0
        self.pos = 0  # ops the program ran in this iteration
        self.elapsed = 0.0  # their summed cost
        self.keys: list[int] = []
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.uses: list[list[int]] = []
        self.firsts: list[int] = []  # per op: how many outputs were made before it ran
        self.stores: list[Storage] = []  # while following: this iteration's outputs, in the order made (rule 7)
        self.evictions = 0  # the runtime's evictions when this iteration began (rule 7)
        self.plan: Plan | None = None
        self.following = False  # this iteration matches its plan so far (rule 2)
        self.steer = False  # ... and the plan steers the eviction search (rule 5)
        self.rule = NONE  # which score the plan steers with (rule 5)
        self.clean = True  # no eviction of this iteration was chosen by a plan (rule 5); the runtime clears it
        self.boundaries = 0
        self.planned = 0  # iterations followed to their end
        self.diverged = 0  # iterations that left their plan (rule 2)
        self.divergence = ""  # where the last one left it
        self.spent = 0.0  # the driver's recomputation and copy cost at this iteration's start
        self.tried: dict[int, float] = {}  # rule 5: a rule -> its last whole iteration's recomputation and copy cost

    def ran(self, inputs: Sequence[Storage], cost: float, name: str) -> None:
        """The program ran an op reading ``inputs`` (distinct): record it, and check it against the plan."""
        base = self.base
        pos = self.pos
        if pos >= LIMIT:  # rule 6: no boundary in sight
            self.stop()
            return
        key = hash(name)
        uses = self.uses
        for s in inputs:
            t = s.tag
            if t >= base:
                i = t - base
                uses[i].append(pos)
                key = (key * 1000003 + i) & 0xFFFFFFFFFFFF
            else:
                key = (key * 1000003 - 1) & 0xFFFFFFFFFFFF
        self.keys.append(key)
        self.firsts.append(len(self.sizes))
        self.elapsed += cost
        self.times.append(self.elapsed)
        self.pos = pos + 1
        if self.following:
            plan = self.plan
            assert plan is not None
            if pos >= len(plan.keys) or plan.keys[pos] != key:
                self._diverge(f"op {pos} ({name}) is not the plan's")

    def made(self, s: Storage) -> None:
        """``s`` is a new storage of this iteration: tag it, and check its bytes against the plan."""
        i = self.next_tag - self.base
        s.tag = self.next_tag
        self.next_tag += 1
        self.sizes.append(s.nbytes)
        self.uses.append([])
        if self.following:
            self.stores.append(s)
            plan = self.plan
            assert plan is not None
            if i >= len(plan.sizes) or plan.sizes[i] != s.nbytes:
                self._diverge(f"output {i} ({s.nbytes} B) is not the plan's")

    def stop(self) -> None:
        """Record nothing until the next boundary (rule 6)."""
        self.recording = self.following = self.steer = False
        self.keys, self.times, self.sizes, self.uses, self.firsts, self.stores = [], [], [], [], [], []
        self.pos = 0

    def _diverge(self, where: str) -> None:
        self.following = self.steer = False
        self.stores = []
        self.diverged += 1
        self.divergence = where
        self.tried.clear()

    def boundary(self, live: Iterable[Storage], spent: float, record: bool = True, evictions: int = 0) -> None:
        """An iteration ended: it becomes the plan of the next (rule 2). Two boundaries with no op between them
        keep the plan. ``live``: the storages not released; those of this iteration with handles are read at its
        end (rule 3). ``spent``: the driver's recomputation and copy cost so far (rule 5). ``record``: whether to
        record the next iteration (rule 6). ``evictions``: the runtime's count of them so far (rule 7)."""
        base, pos, uses = self.base, self.pos, self.uses
        for s in live:
            if s.tag >= base and s.refs:
                uses[s.tag - base].append(pos)
        self.boundaries += 1
        cost = spent - self.spent
        clean = self.clean and self.recording and self.pos > 0
        if self.following:
            plan = self.plan
            assert plan is not None
            if self.pos == len(plan.keys) and len(self.sizes) == len(plan.sizes):
                self.planned += self.rule != NONE
                self.tried[self.rule] = cost
            else:
                self._diverge(f"the iteration ran {self.pos} ops, the plan {len(plan.keys)}")
        self.spent = spent
        if not self.recording:  # what ran since the last boundary was not recorded (rule 6): no plan for it
            self.plan = None
            self.tried.clear()
        elif self.pos:
            self.firsts.append(len(self.sizes))
            self.plan = Plan(self.keys, self.times, self.sizes, self.uses, self.firsts)
            self.keys, self.times, self.sizes, self.uses, self.firsts = [], [], [], [], []
            if clean:  # it ran as the dynamic policy alone would: what that costs on its plan is known (rule 5)
                self.tried[NONE] = cost
        self.recording = record
        self.stores = []
        self.evictions = evictions
        self.base = self.next_tag
        self.pos = 0
        self.elapsed = 0.0
        self.following = record and self.plan is not None
        tried = self.tried
        # rule 5: each rule once, in ``RULES``' order, then the one whose last iteration cost least (a tie: the earlier
        # in ``ORDER``)
        untried = [r for r in RULES if r not in tried]
        self.rule = untried[0] if untried else min(ORDER, key=lambda r: (tried[r], ORDER.index(r)))
        self.steer = self.following and self.rule != NONE
        self.clean = True

    def distance(self, s: Storage, stale: float) -> float:
        """Rule 3's time for ``s``: the geometric mean of its staleness ``stale`` and the time to the plan's next read
        of it, in summed op cost; ``stale`` alone for a storage from before this iteration. Only while following."""
        i = s.tag - self.base
        plan = self.plan
        assert plan is not None
        pos = self.pos
        times = plan.times
        now = times[pos - 1] if pos > 0 else 0.0
        end = plan.total
        if i < 0 or i >= len(plan.uses):
            return stale
        us = plan.uses[i]
        q = bisect_left(us, pos)
        if q < len(us):
            u = us[q]
            d = (times[u] if u < len(times) else end) - now
        else:
            d = 2.0 * end - now
        return math.sqrt(d * stale) if stale > 0.0 else d
