"""The public functions behind ``torch_dtr.enable`` and friends."""

from __future__ import annotations

import contextlib
import gc
import numbers
import os
import warnings
from collections.abc import Callable, Iterator

import torch

from ..core import Listener, Stats
from ..core.errors import parse_budget
from ..core.policies import DEFAULT_POLICY, Policy, get_policy
from . import front as _front
from . import tenants as _tenants
from .device import CudaDevice, Device
from .front import DEFAULT_BANISH_DEPTH, Front
from .swap import banish_default, tier_options
from .tensor import DTRTensor, guard_dlpack, spectra

_LAST: Front | None = None  # the most recent front end, for stats() after disable()
_FROZE = False  # enable() froze the garbage collector's view of older objects (see enable)


def enable(budget: int | str | None = None, *, policy: str | Policy = DEFAULT_POLICY,
           sample_sqrt: bool = False, min_evict_bytes: int | None = None, costs: str = "model",
           banish_depth: int | None = None, device: Device | None = None,
           sync_every: int = 64, expandable_segments: bool | None = None, swap: bool | str = False,
           host_budget: int | str | None = None, swap_gbps: float | None = None) -> None:
    """Manage every op from here on: keep memory within ``budget`` by evicting and recomputing.

    What the budget bounds: on CUDA, the bytes PyTorch's allocator has handed out on the device
    (``torch.cuda.memory_allocated``), parameters, optimizer state and workspaces included; on the CPU, the
    bytes torch-dtr tracks (NOTE [ Device memory ]). With no budget on CUDA, nothing is evicted until the
    device runs out of memory; then torch-dtr evicts and retries the op. ``device``: the device whose
    allocator to follow (default: the current CUDA device when CUDA is available; a
    ``torch_dtr.SimulatedDevice`` runs the same logic over the CPU). ``sync_every``: managed ops between two
    queries of the allocator's count under a budget (a query costs 30-360 us on a GPU).
    ``expandable_segments``: switch PyTorch's expandable segments on for the session, against fragmentation
    (None, the default: on CUDA unless ``PYTORCH_CUDA_ALLOC_CONF`` names the setting; True: on any device
    that has it; False: leave the allocator alone).

    ``costs``: what an op costs to recompute, for the eviction policy: ``"model"`` (FLOPs and bytes moved;
    the same program at the same budget makes the same choices in every run; NOTE [ Modelled costs ]) or
    ``"time"`` (measured around each call, as before 2026-11-23).
    ``swap``: evicted values may also be copied to host memory instead of being dropped, when copying them
    back is cheaper than recomputing them (NOTE [ Swapping ]): ``True``, ``False`` (the default) or ``"auto"``
    (on for CUDA devices). ``host_budget``: the most bytes held in host memory (default: half the machine's
    physical memory); ``swap_gbps``: the copy bandwidth the costs assume (default 25 GB/s to a GPU, 2.5 on the
    CPU; NOTE [ Host copies ]).
    ``banish_depth``: a running sum of values nobody holds is pinned, and the chain behind it freed, once the
    chain has this many links (NOTE [ Banishing ]; by default 2, or 0 with a host tier at least as large as the
    budget, which copies such values out instead: NOTE [ Swapping ] 8; 0: never)."""
    global _LAST
    if _front._ACTIVE is not None:
        raise RuntimeError("torch_dtr: already enabled; call torch_dtr.disable() first, or use "
                           "`with torch_dtr.budget(...)` to change the budget for a scope")
    nbytes = parse_budget(budget)
    get_policy(policy)
    if min_evict_bytes is not None:
        if isinstance(min_evict_bytes, bool) or not isinstance(min_evict_bytes, numbers.Integral):
            raise ValueError(f"torch_dtr: min_evict_bytes must be a number of bytes (int >= 0) or None, got "
                             f"{min_evict_bytes!r} ({type(min_evict_bytes).__name__}); e.g. min_evict_bytes=4096")
        if min_evict_bytes < 0:
            raise ValueError(f"torch_dtr: min_evict_bytes must be >= 0, got {min_evict_bytes}")
        min_evict_bytes = int(min_evict_bytes)
    if costs not in ("time", "model"):
        raise ValueError(f"torch_dtr: costs must be 'time' (measured) or 'model' (FLOPs and bytes), got {costs!r}")
    if banish_depth is not None and (isinstance(banish_depth, bool) or not isinstance(banish_depth, numbers.Integral)
                                     or banish_depth < 0):
        raise ValueError(f"torch_dtr: banish_depth must be an int >= 0 (0: never banish), got {banish_depth!r}")
    if device is not None and not isinstance(device, Device):
        raise TypeError(f"torch_dtr: device must be a torch_dtr device (CudaDevice, SimulatedDevice) or None, got "
                        f"{device!r} ({type(device).__name__}); a torch.device is chosen by where the tensors are")
    if device is not None:
        device.ready()
    if isinstance(sync_every, bool) or not isinstance(sync_every, numbers.Integral) or sync_every < 1:
        raise ValueError(f"torch_dtr: sync_every must be an int >= 1 (managed ops between allocator queries), got "
                         f"{sync_every!r}")
    if expandable_segments not in (None, True, False):
        raise ValueError(f"torch_dtr: expandable_segments must be None (automatic), True or False, got "
                         f"{expandable_segments!r}")
    cuda = isinstance(device, CudaDevice) or (device is None and torch.cuda.is_available())
    swap, host, gbps = tier_options(swap, host_budget, swap_gbps, cuda)
    if banish_depth is None:
        banish_depth = banish_default(swap, nbytes, host, DEFAULT_BANISH_DEPTH)
    f = Front(nbytes, policy, sample_sqrt, min_evict_bytes, costs, int(banish_depth), device,
              int(sync_every), swap, host, gbps)
    if nbytes is not None and f.dev is not None:
        f.dev.prepare()  # NOTE [ Device memory ] 8 (before the mode: these ops stay plain)
    f.expandable_was = _expandable(f.dev, expandable_segments)
    guard_dlpack()
    spectra(True)  # NOTE [ Spectra without vectors ]
    f.mode.__enter__()
    _front.set_active(f)
    _LAST = f
    _freeze_gc()


def _expandable(dev: Device | None, want: bool | None) -> bool | None:
    """NOTE [ Device memory ] 6: switch expandable segments on; the setting to restore at disable()."""
    if dev is None or want is False:
        return None
    if want is None:
        if not isinstance(dev, CudaDevice):
            return None
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
        if "expandable_segments" in conf:  # the user chose
            return None
    try:
        was = dev.set_expandable(True)
    except (RuntimeError, AttributeError) as e:  # an allocator without the setting: fragmentation stays
        warnings.warn(f"torch_dtr: could not switch expandable segments on ({e}); set "
                      f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the program starts instead",
                      stacklevel=3)
        return None
    return None if was else False


def freeze_gc() -> bool:
    """Freeze the garbage collector's view of the objects that exist now; whether this call froze it.

    Each managed op allocates a dozen small tracked objects (records, cell, wrapper), so the cyclic garbage
    collector runs full collections every few thousand ops, and each walks every object of the process (torch
    and transformers alone hold ~300k): measured ~10 us per op. Objects that exist before enable() are moved to
    the permanent generation (gc.freeze) until disable() (``thaw_gc``); cycles among them are collected after
    disable(). Skipped when the program froze objects itself. Both front ends do this."""
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True


def thaw_gc(froze: bool) -> None:
    if froze:
        gc.unfreeze()


def _freeze_gc() -> None:
    global _FROZE
    _FROZE = freeze_gc()


def disable() -> None:
    """Return to plain PyTorch. Managed tensors still alive keep working (ops on them return plain tensors)."""
    f = _front._ACTIVE
    if f is None:
        return
    global _FROZE
    _front.set_active(None)
    try:
        f.mode.__exit__(None, None, None)
    finally:
        spectra(False)
        f.close()
        if f.expandable_was is not None and f.dev is not None:
            f.dev.set_expandable(f.expandable_was)
        thaw_gc(_FROZE)
        _FROZE = False


def enabled() -> bool:
    return _front._ACTIVE is not None


@contextlib.contextmanager
def budget(budget: int | str | None, **options: object) -> Iterator[None]:
    """Scoped budget. Inside an enabled scope it replaces the budget (the inner one wins) until exit."""
    f = _front._ACTIVE
    if f is None:
        enable(budget, **options)  # type: ignore[arg-type]
        try:
            yield
        finally:
            disable()
        return
    if options:
        raise ValueError(f"torch_dtr: options {sorted(options)} can only be set by the outermost scope")
    old = f.total
    f.total = parse_budget(budget)
    try:
        if f.tenants:  # NOTE [ Tenants ] 2: every tenant gets its share of the new total
            _tenants.rebalance(f)
        else:
            with f.lock:
                f.rt.set_budget(f.total)
                f.rt.reserve(0)
    except BaseException:
        f.total = old
        raise
    try:
        yield
    finally:
        f.total = old
        if f.closed:  # disable() ran inside the scope: nothing to restore
            pass
        elif f.tenants:
            _tenants.rebalance(f)
        else:
            with f.lock:
                f.rt.set_budget(old)


@contextlib.contextmanager
def tenant(name: str, share: float | None = None) -> Iterator[None]:
    """Run this thread's ops as tenant ``name`` of the enabled session: counted against, and evicted for,
    its own share of the session's budget (NOTE [ Tenants ]). ``share``: its weight (1 when first used);
    giving another one moves budget between tenants at once. ``stats(name)`` gives its counters."""
    f = _front._ACTIVE
    if f is None:
        raise RuntimeError("torch_dtr: tenant() needs an enabled session; call torch_dtr.enable(budget=...) first")
    if not isinstance(name, str):
        raise TypeError(f"torch_dtr: a tenant's name is a str, got {name!r}")
    t = _tenants.tenant_of(f, name, share)
    mode, old = _tenants.switch(t)
    try:
        yield
    finally:
        mode.front = old


@contextlib.contextmanager
def attach() -> Iterator[None]:
    """Manage this thread's ops too, under the enabled session (same budget and runtime).

    ``enable()`` manages the thread that calls it: PyTorch keeps dispatch modes per thread. A worker
    thread that trains under the session wraps its work in ``with torch_dtr.attach():``; without it, its
    ops on plain tensors stay plain (not counted, never evicted). See NOTE [ Threads ] 4."""
    f = _front._ACTIVE
    if f is None:
        raise RuntimeError("torch_dtr: attach() needs an enabled session; call torch_dtr.enable(...) first (in "
                           "any thread), then `with torch_dtr.attach():` in the worker thread")
    mode = _front.ThreadMode(f)
    with mode:
        yield


def stats(tenant: str | None = None) -> Stats:
    """Counters of the enabled runtime (or of the last one, after ``disable()``); ``tenant``: of that tenant
    of the session (NOTE [ Tenants ])."""
    f = _front._ACTIVE or _LAST
    if f is None:
        return Stats(None, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0)
    if tenant:
        if tenant not in f.tenants:
            raise KeyError(f"torch_dtr: no tenant {tenant!r} in the session (tenants: {sorted(f.tenants)})")
        f = f.tenants[tenant]
    with f.lock:
        f.drain()
        return f.rt.stats()


def reset_peak() -> None:
    f = _front._ACTIVE or _LAST
    if f is not None:
        with f.lock:
            f.drain()
            f.rt.reset_peak()


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s value (recomputed if evicted). A plain tensor comes back unchanged.

    The plain tensor shares memory with the managed one, so that storage is pinned (never evicted again).
    """
    if type(t) is not DTRTensor:
        return t
    return t._cell.front.unwrap(t._cell)


def peek(t: torch.Tensor) -> torch.Tensor:
    """Like ``unwrap`` but for a moment's use (printing): the storage is not pinned."""
    if type(t) is not DTRTensor:
        return t
    return t._cell.front.peek(t._cell)


def listen(fn: Listener) -> Callable[[], None]:
    """Call ``fn(kind, storage)`` on every event of the enabled runtime: "evict", "drop", "remat",
    "release", and "op" after each managed op (storage ``None``). Returns a function that stops it; it stops
    with the session at ``disable()``. ``fn`` runs in the middle of the runtime's bookkeeping: it may read
    counters (``torch_dtr.runtime().rematerializations``) and raise to stop the program (a thrash cap), but
    must not run tensor ops or call ``stats()``."""
    f = _front._ACTIVE
    if f is None:
        raise RuntimeError("torch_dtr: listen() needs an enabled runtime; call torch_dtr.enable(...) first")
    return f.rt.listen(fn)


def runtime():  # noqa: ANN201 - for tests and tools
    """The core runtime of the enabled front end (or the last one)."""
    f = _front._ACTIVE or _LAST
    return None if f is None else f.rt
