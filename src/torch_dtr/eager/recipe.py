"""Recipes: how to run a recorded aten call again, with the same inputs, randomness and constants."""

from __future__ import annotations

from typing import Any

import torch

from ..core import Storage
from ..core.errors import ConstantChangedError, internal_assert
from .mathkeys import complex_args, math_keys
from .rng import RngState
from .tensor import Geom, view_of

# NOTE [ In-place mutation ]
#
# 1. Writing in place to a managed storage makes a new *version*: the new storage takes over the buffer
#    and its bytes; the old version keeps its recipe and becomes evicted. Recipes that read the old
#    version still recompute the value it had (copy-on-write without the copy).
# 2. The recipe of the new version clones the old version's storage and replays the write on the clone.
# 3. When the old version cannot be recomputed (no recipe, or its recipe was dropped: a changed constant,
#    banishing) but a live recipe still reads it, the write goes to a real copy instead, so the old value
#    stays resident for its readers (checking only for "no recipe" lost the old value: a reader's
#    recomputation raised ``ConstantChangedError``; ``Runtime.new_version`` now asserts it). When no
#    recipe reads it, the write goes to its buffer and makes no new version: it stays pinned, as plain
#    PyTorch's tensor would (a recipe dropped because its outputs are pinned, NOTE [ Lifetimes ] 5, is
#    "cannot be recomputed" as much as "no recipe").
# 4. A constant (parameter, buffer, input) written by a recorded op (BatchNorm's running statistics:
#    ``native_batch_norm`` writes them without saying so in its schema) is detected by its version
#    counter; a replay writes to a scratch clone, never to the constant. Training-mode BatchNorm does not
#    read the running statistics, so the replayed outputs are exact.
# 5. A replay checks that every other constant it reads still has the version it had when recorded; if
#    the program changed it since (an optimizer step), it raises instead of computing a wrong value.
# 6. Running statistics are written without a version bump (4), so 5 cannot see a training pass change
#    them after an eval pass read them (consistency losses, mean teachers). A recipe of an op that reads
#    them without writing them (batch norm in eval mode) keeps its own copy (2 x channels values).


class Ref:
    """A recipe's reference to one managed input: a storage version and a view of it."""

    __slots__ = ("storage", "geom")

    def __init__(self, storage: Storage, geom: Geom) -> None:
        self.storage = storage
        self.geom = geom


def version(c: torch.Tensor) -> int:
    """``c``'s version counter; -1 for an inference tensor, which has none (it cannot be written outside
    ``torch.inference_mode``, and a write inside it is not seen)."""
    try:
        return c._version
    except RuntimeError:
        return -1


def clone_storage(p: torch.Tensor) -> torch.Tensor:
    """A copy of ``p``'s whole storage, seen with ``p``'s geometry."""
    st = p.untyped_storage().clone()
    return torch.empty(0, dtype=p.dtype, device=p.device).set_(st, p.storage_offset(), p.size(), p.stride())


def fill(x: Any, override: dict[Storage, torch.Tensor] | None, scratch: frozenset[int]) -> Any:
    """Replace every ``Ref`` in a call template by the tensor it names (inputs must be resident)."""
    t = type(x)
    if t is Ref:
        s = x.storage
        p = override.get(s) if override else None
        if p is None:
            p = s.payload
            if p is None:
                internal_assert(False, f"input {s} is not resident when its reader runs")
        return view_of(p, x.geom)
    if t is tuple or t is list:
        return t(fill(y, override, scratch) for y in x)
    if scratch and isinstance(x, torch.Tensor) and id(x) in scratch:
        return x.clone()
    return x


def flat_outputs(out: Any) -> list[Any]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        flat: list[Any] = []
        for o in out:
            if isinstance(o, (tuple, list)):
                flat.extend(o)
            else:
                flat.append(o)
        return flat
    return [out]


class Recipe:
    """The ``compute`` of a core ``Op``: replays one aten call and returns the payloads of its outputs.

    ``outs[k]`` says where the payload of ``op.outputs[k]`` comes from: an int is an index into the
    flattened outputs of the call; a ``Storage`` is an old version whose clone the call wrote in place.
    ``oom``: the front end's ``device.OutOfMemory``, which evicts and retries when the call runs out of device
    memory (NOTE [ Device memory ] 4), or None.
    ``grad``: whether grad mode was on when the call first ran; a replay runs in the same mode (some kernels,
    e.g. the CPU LSTM's ``mkldnn_rnn_layer``, return a workspace only with grad mode on).
    """

    __slots__ = ("func", "args", "kwargs", "rng", "consts", "scratch", "outs", "cow", "oom", "grad")

    def __init__(self, func: Any, args: Any, kwargs: dict, rng: RngState | None,
                 consts: list[tuple[torch.Tensor, int]], scratch: frozenset[int],
                 outs: list[int | Storage], cow: tuple[Storage, ...], oom: Any = None, grad: bool = True) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.rng = rng
        self.consts = consts
        self.scratch = scratch
        self.outs = outs
        self.cow = cow
        self.oom = oom
        self.grad = grad

    def __call__(self, lend: Any = ()) -> list[torch.Tensor]:
        """Replay; ``lend``: old versions in ``cow`` that nothing else needs, written in place instead of
        copied (core ``Op.writes``), as the first run did."""
        for c, v in self.consts:
            if v >= 0 and c._version != v:
                raise ConstantChangedError(
                    f"torch_dtr: cannot rematerialize the output of {self.func}: a constant it read "
                    f"(shape {tuple(c.shape)}, {c.dtype}) was modified in place after it was recorded "
                    f"(version {v} -> {c._version}), e.g. by an optimizer step; recomputing would give a "
                    f"different value. Use managed tensors from before such a change only before it, or "
                    f"keep them with torch_dtr.unwrap(t)."
                )
        override = ({s: s.payload if s in lend else clone_storage(s.payload) for s in self.cow}
                    if self.cow else None)
        args = fill(self.args, override, self.scratch)
        kwargs = {k: fill(v, override, self.scratch) for k, v in self.kwargs.items()} if self.kwargs else {}
        try:
            out = self._call(args, kwargs)
        except torch.OutOfMemoryError:
            if self.oom is None:
                raise
            need = sum(int(p.untyped_storage().nbytes()) for s, p in (override or {}).items() if s not in lend)
            out = self.oom(lambda: self._call(args, kwargs), need, None)
        flat = flat_outputs(out)
        return [flat[o] if type(o) is int else override[o] for o in self.outs]  # type: ignore[index]

    def _call(self, args: Any, kwargs: dict) -> Any:
        # As on its first run (inside __torch_dispatch__): below autograd, so payloads carry no graph, and in
        # the grad mode it ran in. A replay may start anywhere: inside another op, in backward, in unwrap().
        with torch._C._AutoDispatchBelowAutograd(), torch.set_grad_enabled(self.grad):
            if complex_args(args, kwargs):  # NOTE [ Conjugate and negative keys ]
                with math_keys():
                    return self._replay(args, kwargs)
            return self._replay(args, kwargs)

    def _replay(self, args: Any, kwargs: dict) -> Any:
        if self.rng is not None:  # replay() sets the saved state on every call, retries included
            return self.rng.replay(self.func, args, kwargs)
        return self.func(*args, **kwargs)
