"""Conformance against PyTorch's own operator database (``op_db``, needs ``expecttest``).

Each sample of an operator runs plain and under torch-dtr with no budget, in two modes: nothing evicted,
and everything evictable evicted after every op (so every later read is a recomputation). Forward
outputs and the gradients of the outputs (``autograd.grad`` with ones, i.e. of their sum) are compared
bitwise, NaNs equal. Used by ``test_conformance.py`` (a deterministic subset) and by
``benchmarks/conformance.py`` (every sample, writes docs/conformance.md).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

import torch_dtr

MODES = ("nothing_evicted", "all_evicted")
# ops whose output values are undefined (uninitialized memory): only dtypes and shapes are compared
UNDEFINED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
# ops whose values differ from run to run in plain PyTorch: compared within a tolerance (rtol = atol = 1e-4).
# linalg.lstsq's default CPU driver reads an uninitialized pivot array (pytorch/pytorch#187411): 13 of 20
# plain runs of one float32 sample differed from the first by up to 1.4e-6 (2026-11-23).
NONDETERMINISTIC = {"linalg.lstsq", "linalg.lstsq.grad_oriented"}


@dataclass(frozen=True)
class Outcome:
    op: str
    dtype: str
    sample: int
    mode: str
    status: str  # "equal", "differs", "raises" (torch-dtr raised), "plain_raises" (not a torch-dtr matter)
    detail: str = ""


def op_db() -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    # op_db holds millions of objects: move them out of the garbage collector's walks (torch_dtr.enable()
    # and the tests' gc.collect() would otherwise walk them every time)
    gc.collect()
    gc.freeze()
    return list(db)


def name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def ops_for(dtype: torch.dtype, device: str = "cpu") -> list[Any]:
    return [op for op in op_db() if dtype in op.supported_dtypes(device)]


def samples(op: Any, dtype: torch.dtype, limit: int | None, device: str = "cpu") -> Iterator[tuple[int, Any]]:
    grad = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
    torch.manual_seed(0)
    for i, s in enumerate(op.sample_inputs(device, dtype, requires_grad=grad)):
        if limit is not None and i >= limit:
            return
        yield i, s


def _clone(x: Any) -> Any:
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            c = t.detach().clone()
            return c.requires_grad_(True) if t.requires_grad else c
        return t

    return tree_map(one, x)


def _run(op: Any, sample: Any) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs))
    torch.manual_seed(1)
    out = op(inp, *args, **kwargs)
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    leaves = [t for t in tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    diff = [o for o in outs if o.requires_grad]
    grads: list[torch.Tensor | None] = []
    if diff and leaves:
        grads = list(torch.autograd.grad(diff, leaves, [torch.ones_like(o) for o in diff], allow_unused=True))
    keep = [torch_dtr.unwrap(o).detach().clone() for o in outs]
    return keep, [None if g is None else torch_dtr.unwrap(g).detach().clone() for g in grads]


def _evict_all(kind: str, _s: Any) -> None:
    if kind == "op":
        rt = torch_dtr.runtime()
        for s in list(rt.candidates):
            if not s.locks:
                rt.evict(s)


def _same(a: torch.Tensor | None, b: torch.Tensor | None, values: bool = True, close: bool = False) -> str:
    """'' when bitwise equal (NaNs equal), else what differs; ``values=False``: dtypes and shapes only;
    ``close``: equal within ``NONDETERMINISTIC``'s tolerance."""
    if a is None or b is None:
        return "" if a is None and b is None else "one gradient is None"
    if a.layout != torch.strided:
        a = a.to_dense()
    if b.layout != torch.strided:
        b = b.to_dense()
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{b.dtype}{tuple(b.shape)} != plain {a.dtype}{tuple(a.shape)}"
    if not values:
        return ""
    if a.dtype == torch.complex32:  # no comparison kernels for it on CPU
        a, b = a.to(torch.complex64), b.to(torch.complex64)
    if torch.equal(a, b):
        return ""
    if close and (a.is_floating_point() or a.is_complex()) and torch.allclose(a, b, 1e-4, 1e-4, equal_nan=True):
        return ""
    if a.is_floating_point() or a.is_complex():
        same = (a == b) | (a.isnan() & b.isnan())
        if bool(same.all()):
            return ""
        d = (a - b).abs()
        d = d[~same]
        return f"max abs difference {float(d.max()):.3g} over {int((~same).sum())} of {a.numel()} values"
    return "values differ"


def check(op: Any, sample: Any, mode: str, device: Any = None) -> tuple[str, str]:
    """(status, detail) of one sample in one mode. ``device``: the torch-dtr device of the session (a
    ``SimulatedDevice`` runs CPU samples through the device path: sizes predicted without a budget, the
    allocator's rounding and queries, out-of-memory retries); None: the default (CUDA's where present)."""
    try:
        want_out, want_grad = _run(op, sample)
    except Exception as e:  # noqa: BLE001 - the op's own failure on this sample, not ours
        return "plain_raises", f"{type(e).__name__}: {str(e)[:120]}"
    entered = contextlib.ExitStack()
    if isinstance(device, torch_dtr.SimulatedDevice) and device.ext is None:
        entered.enter_context(device)  # it counts what is allocated while entered
    torch_dtr.enable(budget=None, device=device)
    try:
        if mode == "all_evicted":
            torch_dtr.listen(_evict_all)
        got_out, got_grad = _run(op, sample)
        torch_dtr.runtime().check()
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        torch_dtr.disable()
        entered.close()
    if len(got_out) != len(want_out) or len(got_grad) != len(want_grad):
        return "differs", f"{len(got_out)} outputs / {len(got_grad)} grads vs plain {len(want_out)} / {len(want_grad)}"
    values = name(op) not in UNDEFINED
    close = name(op) in NONDETERMINISTIC
    for i, (a, b) in enumerate(zip(want_out, got_out, strict=True)):
        why = _same(a, b, values, close)
        if why:
            return "differs", f"output {i}: {why}"
    for i, (a, b) in enumerate(zip(want_grad, got_grad, strict=True)):
        why = _same(a, b, True, close)
        if why:
            return "differs", f"gradient {i}: {why}"
    return "equal", ""


def run(dtype: torch.dtype, limit: int | None, only: set[str] | None = None, device: str = "cpu"
        ) -> Iterator[Outcome]:
    """Every sample (up to ``limit`` per op) in both modes; ``device``: "cpu", "cuda" (samples made on the GPU),
    or "sim" (CPU samples, torch-dtr on a ``SimulatedDevice``)."""
    dev = torch_dtr.SimulatedDevice() if device == "sim" else None
    where = "cuda" if device == "cuda" else "cpu"
    for op in ops_for(dtype, where):
        n = name(op)
        if only is not None and n not in only:
            continue
        for i, s in samples(op, dtype, limit, where):
            for mode in MODES:
                status, detail = check(op, s, mode, dev)
                yield Outcome(n, str(dtype).removeprefix("torch."), i, mode, status, detail)
