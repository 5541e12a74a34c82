"""torch.compile regions under a byte budget: inductor's partition of each compiled region chosen so that the
region fits the memory the budget leaves it.

# NOTE [ Compiled regions under a budget ]
#
# 1. While a session runs on the compiled front end, inductor's ``compile_fx`` is wrapped (region.py; from
#    dynamo's first compile in the session on, so that ``enable()`` does not import inductor, ~2 s): a graph
#    dynamo hands it becomes a ``Region``, compiled at its first call (with that call's tensors), then planned
#    against the budget. A graph with dynamic shapes is compiled at once, inside dynamo's context, and planned
#    once. A region compiled before ``enable()`` is not planned (NOTE [ Unmanaged regions ] 1), nor one compiled
#    while the user has set inductor's ``custom_partitioner_fn``.
# 2. Its bytes are predicted from the graphs compile's partitioner makes (graphmem.py): each value from the op
#    that makes it to its last reader, the forward's outputs held into the backward, the backward's saved values
#    freed after their last reader (as inductor's code frees them), and a pointwise kernel's output written in
#    place of an input of the same bytes that dies there (inductor's in-place buffers). A pointwise value is
#    inlined into its readers (what it reads then lives on to them) unless inductor's lowering would write it: a
#    reader of its own kernel or the graph's output, or, read more than once, a heavy op on the CPU or more than
#    four buffers read (its thresholds, torch 2.13). Inductor's scheduler then fuses and reorders for peak memory,
#    which this does not model. Against the allocator, the region alone (2026-11-30), inlining so: the bench's
#    GPT-2 to 0.1 MiB at activation memory budgets 1.0, 0.7 and 0.5, 1% under at 0.3, 19% and 13% over at 0.1 and
#    0.0 (where the scheduler's order matters most); the benchmark's MLP 1% over at 1.0 but 7% under at 0.5, and
#    a smaller MLP passed its budget by 10%. So the prediction is the larger of that and writing every value read
#    more than once (``region_bytes``): the MLP at 0.5 is then 33% over, GPT-2 at 0.3 1% under, and ResNet-50
#    14% and 9% under at 1.0 and 0.5. Rule 4 measures and corrects.
# 3. The partition (partition.py) is compile's own min-cut partitioner (what ``activation_memory_budget``
#    drives) at the largest activation memory budget, of 1.0, 0.85, ..., 0.0 and two halvings after, whose
#    expected bytes fit the allowance: the budget less what lives outside the region when it is called. The
#    curve need not fall with the fraction (recomputing everything needs more in the backward than recomputing
#    some); where none fits, the least expected is taken and rule 5 applies.
# 4. What lives outside (``Env.live``): the device's allocated bytes where a device is followed (CUDA, a
#    simulated device); on the CPU, the bytes of the front end's CPU allocator (every block allocated while the
#    session runs, NOTE [ Native front end ] 7) and the region's inputs allocated before it (parameters made
#    before ``enable()``; other tensors made before it are not seen). During each call of a region and its
#    backward (its autograd node, from its pre-hook to its hook) the allocator's most in use is measured where it is
#    this front end's (the CPU, a simulated device; a second peak, ``cpu_blocks_mark``, apart from the one users
#    reset), not what runs between (an optimizer's step): what a partition was seen to add replaces its
#    prediction, and scales the others' (``OVER``: a measured peak 1% over the budget). The region is compiled
#    again, at most ``REPLANS`` times, when what lives outside grew past what its plan left room for (an
#    optimizer's state appears after the first step), when the budget changed, or when a measured peak passed
#    the budget. Its compilations bypass AOTAutograd's cache: its keys take a partitioner without a uuid (ours: the
#    choice depends on the allowance) for none, and a cached partition would skip the partitioner.
# 5. Where no partition is expected to fit, the region runs its graph eagerly under the session, which
#    evicts and recomputes op by op: eager speed and eager PyTorch's results (bitwise, from then on), said once per
#    region. Before each such call what lives outside (rule 4) is told to the runtime as its outside count
#    (NOTE [ Budget accounting ] 4), so that it evicts for the allocator's count, not only for the values it
#    tracks; on the CPU without a device it is measured again as the backward makes each (plain) gradient, which
#    the call could not see (the bench's ResNet-50 at 85%: 1.12x the budget before, 1.03x after). Plain work after
#    the region (an optimizer's step and its temporaries) is not evicted for; with ``device="cpu"`` the session
#    follows the allocator throughout (NOTE [ The CPU as a device ]). Tried and not kept (2026-12-01): compiling a
#    fraction not yet measured whose own prediction fits, as a trial, where the others' misses scale every one over.
#    On the bench's ResNet-50 at 95% the trials at 0.85 and 0.7 measured what 0.9625 had, and each cost a compilation
#    of about 25 s; the region ran eagerly after. The cause was the extern kernels' outputs, managed then (NOTE
#    [ Unmanaged regions ] 1): its backward's peak did not depend on the partition. Now 0.9625 fits there.
# 6. Inductor's numerics do not depend on the partition on the CPU (recomputed values come from the same
#    kernels): a planned region trains bitwise as compiled plain. ``plans()`` lists every region's choice and
#    measurements. Managed inputs are brought back and pinned before the compiled kernels read them
#    (NOTE [ Unmanaged regions ] 1).
"""

from __future__ import annotations

from .region import REPLANS, Env, install, plans

__all__ = ["REPLANS", "Env", "install", "plans"]
