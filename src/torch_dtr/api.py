"""The public functions behind ``torch_dtr.enable`` and friends: one entry for both front ends.

# NOTE [ Choosing the front end ]
#
# 1. Two front ends drive the one core: the compiled one (``torch_dtr.native``: a C++ kernel on a dispatch key,
#    NOTE [ Native front end ]) and the Python one (``torch_dtr.eager``: a ``TorchDispatchMode``). They make the
#    same decisions from the same rules and give plain PyTorch's results bit for bit; the compiled one costs a
#    fraction per op. ``enable()`` runs the compiled one unless rule 2 or 3 says otherwise.
# 2. ``front=``: ``"auto"`` (the default; ``TORCH_DTR_FRONT`` in the environment when not given), ``"native"`` or
#    ``"python"``. With ``"auto"``, the Python front end runs where the compiled one cannot be built (no C++
#    compiler or ninja: said once, with what to install) and where the call asks for what only the Python front
#    end has: one of its tuning options (``_PYTHON_ONLY``). ``"native"`` with such a request is an error naming
#    it. Both run on the simulated allocator (``device=SimulatedDevice(...)``, which is the compiled front end's).
# 3. Tenants (``tenant()``, NOTE [ Tenants ]) run on both front ends, with the same rules (eager/tenants.py).
# 4. Every other function here (``stats``, ``budget``, ``attach``, ``unwrap``, ``listen``, ``reset_peak``,
#    ``runtime``) acts on the running session, whichever front end runs it (after ``disable()``: on the last one,
#    for ``stats``, ``reset_peak`` and ``runtime``).
# 5. ``enable()`` while a session runs (a notebook cell run again after an error) ends that session first, with a
#    warning, then starts the new one. ``enable()`` returns the session, a context manager that disables it at the
#    end of a ``with`` block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import eager, native
from .core import Listener, Stats
from .core.errors import FIX
from .core.policies import DEFAULT_POLICY, Policy
from .eager.api import _expandable

FRONTS = ("auto", "native", "python")
# the Python front end's own options, with their defaults (rule 2)
_PYTHON_ONLY: dict[str, Any] = {"sample_sqrt": False, "min_evict_bytes": None, "costs": "model", "sync_every": 64}


class Session:
    """What ``enable()`` returns: which front end runs (``front``: ``"native"`` or ``"python"``); a context manager
    that disables the session when its ``with`` block ends."""

    def __init__(self, front: str, handle: Any = None) -> None:
        self.front = front
        self.handle = handle  # the native front end's session (torch_dtr.native.session.Session), or None
        self.expandable_was: bool | None = None  # NOTE [ Device memory ] 6, for the compiled front end
        self.budget: int | None = None  # the budget when it ended: stats() after disable() says it, as it ran
        self.active = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            disable()

    def __repr__(self) -> str:
        return f"<torch_dtr session: {self.front} front end, {'running' if self.active else 'ended'}>"


_WHOLE_STEP = (". A budget that holds for a whole training step, in one try: `torch-dtr record --out step.trace "
               "train.py` (without a budget), then `torch-dtr simulate step.trace --smallest`")
_CURRENT: Session | None = None  # the running session
_LAST: Session | None = None  # the running or the last one (stats() after disable())
_WARNED_FALLBACK = False


def _front_of(front: str | None) -> str:
    if front is None:
        front = os.environ.get("TORCH_DTR_FRONT") or "auto"
        where = "TORCH_DTR_FRONT"
    else:
        where = "front"
    if front not in FRONTS:
        raise ValueError(f"torch_dtr: {where} must be one of {FRONTS}, got {front!r}")
    return front


def enable(budget: int | str | None = None, *, front: str | None = None, policy: str | Policy = DEFAULT_POLICY,
           banish_depth: int | None = None, device: Any = None, swap: bool | str = False,
           host_budget: int | str | None = None, swap_gbps: float | None = None,
           expandable_segments: bool | None = None, grads_in_place: bool = True, trace: str | os.PathLike | None = None,
           learn: bool = True, plans: bool = True, **python_options: Any) -> Session:
    """Manage every op of this thread from here on: keep memory within ``budget`` (bytes or ``"3GiB"``) by evicting
    and recomputing. Returns the session (a context manager: ``with torch_dtr.enable(...):``).

    What the budget bounds: on CUDA, the bytes PyTorch's allocator has handed out on the device (parameters,
    optimizer state and workspaces included); on the CPU, the bytes torch-dtr tracks (NOTE [ Device memory ]), or
    with ``device="cpu"`` all the process's tensor memory as on CUDA (NOTE [ The CPU as a device ]).
    With no budget on CUDA, nothing is evicted until the device runs out of memory; then torch-dtr evicts and
    retries the op. ``device``: whose allocator to follow (default: the current CUDA device where CUDA is
    available; a ``torch_dtr.SimulatedDevice`` runs the same logic over the CPU).
    ``swap``: a host-memory tier (``True``, ``False``, ``"auto"``: on for CUDA), ``host_budget`` its bytes (default
    half the RAM), ``swap_gbps`` the bandwidth its costs assume. ``banish_depth``: NOTE [ Banishing ].
    ``expandable_segments``: PyTorch's expandable segments for the session (None: on for CUDA unless
    ``PYTORCH_CUDA_ALLOC_CONF`` names it). ``grads_in_place``: autograd sums gradients in place as plain PyTorch
    does (the compiled front end; the Python one cannot). ``front``: NOTE [ Choosing the front end ]; the Python
    front end's own options (``sample_sqrt``, ``min_evict_bytes``, ``costs``, ``sync_every``) choose it.
    ``trace``: write every call into the core to this file (the compiled front end), for ``torch-dtr simulate`` to
    replay at other budgets (NOTE [ Traces ]). ``learn``: trace the first two optimizer steps in memory (a program
    without an optimizer: all it runs, up to 100k ops), so that ``stats().learned_budget`` and a BudgetError name a
    budget for what was traced (the compiled front end without a device; NOTE [ Learned budgets ]). ``plans``: each
    optimizer step ends an iteration whose record the next one follows (NOTE [ Iteration plans ]); False: every
    iteration is decided afresh."""
    global _CURRENT, _LAST
    front = _front_of(front)
    if expandable_segments not in (None, True, False):
        raise ValueError(f"torch_dtr: expandable_segments must be None (automatic), True or False, got "
                         f"{expandable_segments!r}")
    unknown = sorted(set(python_options) - set(_PYTHON_ONLY))
    if unknown:
        raise TypeError(f"torch_dtr.enable() got unexpected keyword argument(s) {unknown}; its options: budget, "
                        f"front, policy, banish_depth, device, swap, host_budget, swap_gbps, expandable_segments, "
                        f"grads_in_place, trace, learn, plans, and the Python front end's {sorted(_PYTHON_ONLY)}")
    python_asked = [f"{k}={v!r}" for k, v in python_options.items() if v != _PYTHON_ONLY[k]]
    if front == "native" and python_asked:
        raise ValueError(f"torch_dtr: {', '.join(python_asked)} needs the Python front end, and front='native' was "
                         f"asked for: drop the option, or pass front='python' (or 'auto')")
    if front == "auto":
        front = "python" if python_asked else "native" if _native_builds() else "python"
    if isinstance(device, str) or getattr(device, "name", None) == "cpu":
        device = _cpu_device(device, front, swap)
    if trace is not None and front == "python":
        raise ValueError("torch_dtr: trace= needs the compiled front end, and the Python front end was chosen "
                         f"({', '.join(python_asked) or 'front=python, or the C++ front end cannot be built here'})")
    if _CURRENT is not None and _CURRENT.active or eager.enabled() or _native_running():
        warnings.warn("torch_dtr: enable() while a session runs: that session is disabled first (its managed tensors "
                      "stay readable)", RuntimeWarning, stacklevel=2)
        disable()
    if front == "python":
        eager.enable(budget, policy=policy, banish_depth=banish_depth, device=device, swap=swap,
                     host_budget=host_budget, swap_gbps=swap_gbps, expandable_segments=expandable_segments,
                     **python_options)
        from .eager import front as eager_front

        eager_front._ACTIVE.rt.plans = plans  # type: ignore[union-attr]
        s = Session("python")
    else:
        h = native.enable(budget, policy=policy, banish_depth=banish_depth, swap=swap, host_budget=host_budget,
                          swap_gbps=swap_gbps, device=device, grads_in_place=grads_in_place, trace=trace,
                          learn=learn)
        # a BudgetError names these calls, not torch_dtr.native's, and how to find a budget for a whole step where
        # the session does not learn it (NOTE [ Learned budgets ])
        h.rt.fix = FIX + ("" if h.learner is not None else _WHOLE_STEP)
        h.rt.plans = plans
        s = Session("native", h)
        try:
            s.expandable_was = _expandable(h.dev, expandable_segments)
        except BaseException:
            native.disable()
            raise
    _CURRENT = _LAST = s
    return s


def _cpu_device(device: Any, front: str, swap: bool | str) -> Any:
    """``device="cpu"``: the budget bounds the process's tensor memory (NOTE [ The CPU as a device ])."""
    if isinstance(device, str) and device != "cpu":
        raise ValueError(f"torch_dtr: device={device!r} is not a device torch-dtr knows by name; pass \"cpu\" (the "
                         f"budget bounds the process's tensor memory), a torch_dtr.CudaDevice or SimulatedDevice, or "
                         f"None (the current CUDA device where there is one)")
    if front == "python":
        raise ValueError("torch_dtr: device='cpu' counts the compiled front end's CPU allocator, and the Python front "
                         "end was chosen (front='python', one of its options, or the C++ front end cannot be built "
                         "here); drop device='cpu' (the budget then bounds what torch-dtr tracks) or use the "
                         "compiled front end")
    if swap and swap != "auto":
        raise ValueError("torch_dtr: swap=True with device='cpu': the host tier's copies would be CPU memory counted "
                         "against the same budget; drop one of them")
    from .native.cpudevice import CpuDevice

    return CpuDevice() if isinstance(device, str) else device


def _native_builds() -> bool:
    """Whether the compiled front end loads here; where it cannot, say so once (NOTE [ Choosing the front end ] 2)."""
    global _WARNED_FALLBACK
    try:
        native.load()
    except native.NativeUnavailable as e:
        if not _WARNED_FALLBACK:
            _WARNED_FALLBACK = True
            warnings.warn(f"{e} The Python front end runs instead: the same results and budget, slower per op. "
                          f"(front='python' or TORCH_DTR_FRONT=python chooses it without this warning.)",
                          RuntimeWarning, stacklevel=3)
        return False
    return True


def _native_running() -> bool:
    s = native.current()
    return s is not None and s.active


def disable() -> None:
    """Return to plain PyTorch. Managed tensors still alive keep working (evicted ones are recomputed)."""
    global _CURRENT
    s, _CURRENT = _CURRENT, None
    if s is not None:
        s.active = False
    if _native_running():
        h = native.current()
        if s is not None and s.handle is h:
            s.budget = h.rt.budget  # (disable() lifts it, so that values held later come back without one)
        native.disable()
        if s is not None and s.handle is h and s.expandable_was is not None and h.dev is not None:
            h.dev.set_expandable(s.expandable_was)
    eager.disable()


def enabled() -> bool:
    return eager.enabled() or _native_running()


def front() -> str | None:
    """The front end of the running session (or of the last one): ``"native"``, ``"python"``, or None."""
    if eager.enabled():
        return "python"
    if _native_running():
        return "native"
    return None if _LAST is None else _LAST.front


def _handle(running: bool = True) -> Any:
    """The compiled front end's session when it is the one that runs (``running=False``: or ran last)."""
    if _native_running():
        return native.current()
    if not running and not eager.enabled() and _LAST is not None and _LAST.front == "native":
        return _LAST.handle
    return None


@contextlib.contextmanager
def budget(budget: int | str | None, **options: Any) -> Iterator[None]:
    """A budget for a scope. Inside a running session it replaces the budget (the inner one wins) until the scope
    ends; outside one it enables a session for the scope (``options`` as ``enable`` takes them)."""
    h = _handle()
    if h is None and not eager.enabled():
        with enable(budget, **options):
            yield
        return
    if h is None:
        with eager.budget(budget, **options):
            yield
        return
    if options:
        raise ValueError(f"torch_dtr: options {sorted(options)} can only be set by the outermost scope")
    old = h.total
    try:
        native.set_budget(budget)
    except BaseException:
        native.set_budget(old)
        raise
    try:
        yield
    finally:
        if h.active:
            native.set_budget(old)


@contextlib.contextmanager
def tenant(name: str, share: float | None = None) -> Iterator[None]:
    """Run this thread's ops as tenant ``name`` of the running session: counted against, and evicted for, its own
    share of the session's budget (NOTE [ Tenants ]); ``share``: its weight (1 when first used); giving another one
    moves budget between tenants at once. ``stats(name)`` gives its counters."""
    if _handle() is not None:
        with native.tenant(name, share):
            yield
        return
    with eager.tenant(name, share):
        yield


@contextlib.contextmanager
def attach() -> Iterator[None]:
    """Manage this thread's ops too, under the running session (same budget and runtime). ``enable()`` manages the
    thread that calls it; a worker thread that trains under the session wraps its work in ``with attach():``
    (without it, its ops on plain tensors stay plain: not counted, never evicted). NOTE [ Threads ] 4."""
    h = _handle()
    if h is None:
        with eager.attach():
            yield
        return
    ext = h.ext
    was = ext.attached()
    ext.attach(True)
    try:
        yield
    finally:
        if not was:
            ext.attach(False)


def stats(tenant: str | None = None) -> Stats:
    """Counters of the running session (or of the last one, after ``disable()``); ``tenant``: of that tenant of the
    session."""
    h = _handle(running=False)
    if h is None:
        return eager.stats(tenant)
    main = h
    if tenant:
        if tenant not in h.tenants:
            raise KeyError(f"torch_dtr: no tenant {tenant!r} in the session (tenants: {sorted(h.tenants)})")
        h = h.tenants[tenant]
    with native._core_locked(h.ext):
        h.flush()
        h.sweep()
        st = h.rt.stats()
    if not h.active and _LAST is not None and _LAST.handle is main and h is main:
        st = dataclasses.replace(st, budget_bytes=_LAST.budget)
    if h.dev is not None and h.dev.session_peak:  # the allocator's own peak (NOTE [ The CPU as a device ] 5)
        st = dataclasses.replace(st, peak_bytes=h.dev.max_allocated())
    if h is main and (h.marks or h.learned is not None):  # NOTE [ Learned budgets ] 2 (a replay: outside the lock)
        st = dataclasses.replace(st, traced_steps=h.traced_steps(), learned_budget=h.learned_budget())
    return st


def reset_peak() -> None:
    """Start the peak (``stats().peak_bytes``) again from what is held now."""
    h = _handle(running=False)
    if h is None:
        eager.reset_peak()
        return
    with native._core_locked(h.ext):
        h.flush()
        h.rt.reset_peak()
        if h.dev is not None and h.dev.session_peak:
            h.dev.reset_peak()


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s value (recomputed if evicted), sharing its memory: that storage is pinned (never
    evicted again). A plain tensor comes back unchanged."""
    if type(t) is eager.DTRTensor:
        return eager.unwrap(t)
    h = native.current()  # (the extension is loaded where a session of it ever ran)
    if h is not None and isinstance(t, torch.Tensor):
        ext = h.ext
        if ext.is_managed(t):
            s = ext.session_of(t)
            with native._core_locked(ext):
                return s.unwrap(t)
    return t


def listen(fn: Listener) -> Callable[[], None]:
    """Call ``fn(kind, storage)`` on every event of the running runtime: "evict", "drop", "remat", "release",
    "swapin", and "op" after each managed op (storage ``None``; the compiled front end tells an op that makes no
    memory with its next call into the core). Returns a function that stops it. ``fn`` runs in the middle of the
    runtime's bookkeeping: it may read counters and raise to stop the program, but must not run tensor ops."""
    h = _handle()
    if h is None:
        return eager.listen(fn)
    return h.rt.listen(fn)


def runtime() -> Any:
    """The core runtime of the running session (or of the last one): for tests and tools."""
    h = _handle(running=False)
    return eager.runtime() if h is None else h.rt
