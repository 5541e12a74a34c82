"""FSDP2 (``fully_shard``): parameters that are freed and gathered again around every use.

# NOTE [ Resharded parameters ]
#
# 1. FSDP2 all-gathers a module's parameters into plain tensors before its forward (and its backward) and
#    frees them after, by resizing their storages to 0 bytes (``FSDPParam.free_unsharded_param``), not by
#    an op a dispatch mode sees. A recipe that read an unsharded parameter cannot run once it is freed: a
#    recomputation would read an empty storage. And gathering it again is a collective, which one rank must
#    never run alone.
# 2. So a reshard is a write to a constant (NOTE [ Changed constants ]): just before FSDP frees the storages,
#    the recipes that read them are invalidated, and what they computed that is still needed is brought back
#    if evicted (the parameters are still there) and pinned. Values computed from those values stay
#    evictable: chains of recomputation stop at each layer's outputs of its parameter ops (matmuls, norms).
#    Those outputs are pinned movable: with ``swap=True`` they are copied to host memory when the budget
#    needs their bytes (NOTE [ Swapping ] 9), so the default resharding goes as low as rule 5's.
# 3. Freed storages leave the constants' count at once, so unsharded parameters count against the budget
#    only while they are unsharded; the next managed op that reads one again counts it again.
# 4. While enabled, ``FSDPParam.free_unsharded_param`` is wrapped, where FSDP2 was imported before
#    ``enable()`` (it is, when ``fully_shard`` was called first). The sharded parameters themselves are
#    DTensors: wrapper subclasses without storage of their own, never counted.
# 5. With ``fully_shard(..., reshard_after_forward=False)`` a layer's parameters stay unsharded from its
#    forward to its backward, so nothing is pinned in between and the budget can go far lower (an MLP under
#    FSDP2: 45% of its peak, against 95% with the default; tests/eager/test_distributed.py), at the cost of
#    holding each layer's full parameters through the step, which FSDP2 counts and torch-dtr budgets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param"


def wrap(active: Callable[[], Any]) -> Callable[[], None]:
    """Wrap FSDP2's free of unsharded parameters to tell ``active()`` (the enabled front end) first; returns
    the undo. Nothing to do where FSDP2 is not imported."""
    mod = sys.modules.get(_MODULE)
    cls = getattr(mod, "FSDPParam", None)
    orig = getattr(cls, "free_unsharded_param", None)
    if orig is None:
        return lambda: None

    def free_unsharded_param(self: Any) -> None:
        front = active()
        if front is not None:
            tensors = [*getattr(self, "all_gather_outputs", ()), *getattr(self, "_unsharded_inner_tensors", ())]
            front.resharding([t for t in tensors if t.untyped_storage().nbytes()])
        orig(self)

    cls.free_unsharded_param = free_unsharded_param  # type: ignore[union-attr]
    return lambda: setattr(cls, "free_unsharded_param", orig)


def foreign_types() -> set[type]:
    """Tensor subclasses that dispatch their ops to inner tensors (NOTE [ Managed vs constant ] 7), among the
    modules already imported: DTensor and the collectives' async wrapper."""
    found: set[type] = set()
    for mod, name in (("torch.distributed.tensor", "DTensor"),
                      ("torch.distributed._functional_collectives", "AsyncCollectiveTensor")):
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type):
            found.add(cls)
    return found
