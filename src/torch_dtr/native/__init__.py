"""torch-dtr's compiled front end, which ``torch_dtr.enable()`` runs: the per-op mechanism in C++, the decisions in
the Python core.

    from torch_dtr import native
    native.enable(budget="2GiB")   # this thread's ops are managed from here on
    ...
    native.disable()

# NOTE [ Native front end ]
#
# 1. Why: a Python dispatch mode costs a few microseconds per op before it does anything, and torch-dtr's
#    Python front end about 30 (docs/dispatch.md); a GPU kernel often takes less. Here a C++ kernel does the
#    per-op work (front.cpp): it finds the managed inputs, runs the op, tags the outputs, keeps the recipe,
#    and caches per call signature what eager/front.py computes per op (output sizes, modelled costs).
# 2. One definition of every rule: the kernel asks the core (``torch_dtr.core.Runtime``, the one the simulator
#    drives) everything it decides: which storage to evict, when one is freed for good, how an evicted value
#    comes back. It calls ``ran`` after each managed op, and ``before`` ahead of one when the core has
#    something to do first (an evicted input, a budget to reserve against, handle deaths, new constants): both
#    are the core's ``Feed`` (NOTE [ Feed ] in core/feed.py), bound on the session, so that the compiled core
#    compiles them too. The crossing into Python and the core's per-op work are what this front end still
#    costs (docs/native.md).
# 3. Handles: a managed tensor is an ordinary tensor of its device whose dispatch keys also hold the
#    PrivateUse1 backend bit (front.cpp, rule 1). While enabled, the thread's dispatch state includes that bit,
#    so plain ops reach the kernel too, which manages them by eager/front.py's rules (NOTE [ Managed vs
#    constant ] 1 and 5: an input requires grad under grad mode; or grad mode is off, outside an optimizer's
#    step, and the op makes new tensors) and else passes them through at once. A process that uses a real
#    PrivateUse1 backend cannot use this front end.
# 4. Constants (plain tensors that managed ops read: parameters, inputs) are counted per storage while a tensor
#    seen on it lives (a death is found before the next call to ``Session.before``, and otherwise within
#    (constants / 8) managed ops: front.cpp, ``g_sweep_in``), and a write to one that recipes read invalidates
#    those recipes first (NOTE [ Changed constants ] 2, by storage address). Gradients accumulated into plain
#    leaves come back plain (pinned; a constant first read without grad is handed to ``Session._see`` again once
#    it is a leaf that requires grad), and so do managed values that become parameters, buffers or a plain
#    tensor's ``.data`` (NOTE [ Native exports ] 4: a module converted with ``.double()`` while enabled).
#    In-place writes keep versions as NOTE [ In-place mutation ] says. ``disable()`` takes the session's
#    plain-gradient hooks off again; an earlier session is let go once no handle made under it lives.
# 5. Tenants (NOTE [ Tenants ]): each is a session of its own (its core, constants, budget), numbered in the kernel
#    as earlier sessions are; a thread's tenant is a thread-local there (``use``). Threads other
#    than the enabling one run plain unless they read managed tensors or join (``torch_dtr.attach()``, which sets
#    the thread's dispatch bit). torch.compile regions and torch.func transforms are not managed, said once per
#    session (NOTE [ Unmanaged regions ]). Sizes: meta kernels, then eager/sizes.py's rules (a rule that reads
#    shapes runs on the meta arguments on a cache miss, and the real size is learned per call signature; an op
#    whose size depends on its data is evicted for right after it, counted in ``sizes_unpredicted``, warned about
#    once); an op whose outputs outgrow the prediction (CPU ``col2im``) passes the budget once, with a warning,
#    and is reserved at its real size from then on. An op that writes more than one managed value pins them.
#    Reads without an op (``numpy()``, DLPack, ``untyped_storage()``, ``data_ptr()``, ``tolist()``) bring the
#    value back first, and pin it where the memory leaves PyTorch (NOTE [ Native exports ]); a C++ extension
#    that reads ``data_ptr<T>()`` itself is not seen. Under torch.distributed (DDP, FSDP2, tensor parallelism)
#    c10d's collectives, which have PrivateUse1 kernels of their own, are taken by the kernel and run below the
#    bit, never replayed (front.cpp, ``claim``); functional collectives (DTensor's), whose composite kernels
#    allocate their output as a managed op and write into it unseen, have what they return pinned
#    (``collective_kernel``); FSDP2's reshards are told to the core before they free the
#    unsharded parameters, as the Python front end tells its own (NOTE [ Resharded parameters ]).
# 6. The host tier (``enable(swap=True)``; NOTE [ Swapping ], NOTE [ Host copies ]): the core chooses, as with
#    the Python front end, and its tier (native/swap.py) moves a victim's bytes out of its slot into a plain
#    tensor (``Value.take``), copies them to host memory as the Python front end's tier does, and copies them back
#    into the same slot (``Value.fill``). The modelled costs, the Python path per recomputed op included
#    (NOTE [ Host copies ] 6, measured for the Python front end), are the same, so are the decisions.
# 7. While enabled, CPU tensors come from an allocator of this front end's (front.cpp, `Blocks`): plain `malloc`
#    with 80 bytes to spare, aligned inside, instead of c10's 64-byte `posix_memalign`. A hole that a freed block
#    leaves in the C heap cannot take an aligned block of the same size, and this front end frees values in an
#    order that leaves such holes (a value's data goes when the core drops it, not when its tensor dies): the heap
#    of the bench's LSTM loop grew to 1.96 GiB for 0.35 GiB in use; with `Blocks`, 0.34 GiB (docs/native.md).
#    Tensors keep their allocator after ``disable()``. CPU memory profiling does not see these blocks.
#    Freed blocks of 4 KiB or more are kept for the next block of their size, the kept and the used together never
#    more than the most used at once since ``enable()`` or the last ``set_budget()`` or ``empty_cache()`` (which
#    give them back): without it the C library handed large blocks back to the kernel and every step faulted their
#    pages in again (the small GPT-2: about 1,100 page faults and 2 ms of a 13 ms step; plain PyTorch a few
#    hundred).
# 8. Device memory (NOTE [ Device memory ] 1-3 and 8, as the Python front end): on CUDA the budget bounds the bytes
#    PyTorch's allocator has handed out, whoever asked for them. The core learns what it does not track
#    (``outside``: optimizer state, workspaces, tensors made before enabling) from ``device.usage()`` every 64
#    managed ops that need room, after each optimizer step (whose plain updates allocate its state) and before
#    a BudgetError; the kernel's fast path (no call into the core for an op that fits) asks the core again
#    once a query is due. Outputs on CUDA count as its allocator rounds them (512 B). Under a budget, plain ops'
#    fresh outputs on the device count as outside from the next call into the core on (``plain``), as the Python
#    front end counts them; factory ops (``torch.ones``) never reach the kernel: theirs wait for a query. A
#    managed op that runs out of the device's memory (with or without a budget) makes the core evict at least
#    what the allocator was asked for, gets its arguments and random state back, and runs again (front.cpp,
#    `run_retrying`); re-raised when nothing is left to evict; so do recomputations, and plain ops (an
#    optimizer's update) but random ones.
#    Where the device knows its layout (CUDA, the simulated device), a window of adjacent blocks goes first, as with
#    the Python front end (NOTE [ Device memory ] 4; ``Value.data_ptr`` gives a value's address, ``Device.locate``
#    its place in the layout). The simulated device (NOTE [ Simulated allocator ]) is a hook in `Blocks`
#    (simalloc.cpp): it counts CPU tensors as CUDA's allocator counts device ones (512-byte blocks).
# 9. Gradients summed in place: autograd's engine adds a value's next gradient term into the running sum in place
#    only when it holds the sum's tensor and storage alone (InputBuffer::accumulate); otherwise it makes a new
#    tensor per term, so a sum needs room for three terms at once instead of two. A managed tensor here is one
#    (front.cpp, rule 6: the core's slot holds its storage only while no handle does; the last handle to let go
#    of it, by dying on any thread or by ``t.data = other``, hands it back), and the write makes a new
#    version of the sum as any in-place write does (NOTE [ In-place mutation ]). The Python front end cannot have
#    it (with a dispatch mode on, the engine treats every tensor as a subclass and never writes in place), so the
#    two front ends' decisions differ on programs that sum gradients (``grads_in_place=False`` makes them equal).
#    Measured on the bench's LSTM loop with the host tier: docs/swap-live.md.
# 10. Queued ops (front.cpp, rule 7): an op that makes no memory (views, ``detach``, ``t``: half the calls into
#    the core on the bench's GPT-2) and needs nothing first (no input to bring back, no room to make, no handle
#    death to tell) only touches its inputs' staleness and counts; the kernel queues it instead of calling
#    ``ran``, and hands the queue over with the next call (``before``, ``ran``), or the session takes it
#    (``Session.flush``, with the handles that died since) first in every other entry into the core: the
#    out-of-memory retry, an optimizer's step, a written constant, a constant's death, an unwrapped gradient,
#    ``stats``, ``set_budget``, ``disable``. The core sees the same events in the same order. 3.1 -> 2.5 us per
#    ``t()`` here. Under a budget too: an eviction is decided only inside a call into the core, which takes the
#    queue first, so the staleness it reads is the same as if each op had been told at once.
# 11. Escaped values: an op whose output has no strided storage of its own (a sparse gradient built from managed
#    values, a nested tensor) may hold managed inputs inside it, where the ops that read it (an optimizer's plain
#    ``add_``) never reach the kernel with them: its managed inputs are pinned (``Session.pin``), never evicted.
#    Before, a sparse embedding's gradient could be evicted under a budget and read unallocated.
# 12. Writes told only where they matter: a write to a constant that recipes read is told to the core first
#    (rule 4), which brings back what the live ones computed and drops them. The kernel knows whether any live
#    recipe reads the constant (each holds a reference to a counter of the constant's, front.cpp ``Readers``; the
#    core's op holds the recipe until it drops it), and tells only then. In a training loop nothing the forward
#    made lives at the optimizer's step: its updates of the parameters run without the GIL or the core (27 of the
#    28 calls a step of the small GPT-2), and the core's list of each parameter's readers, no longer emptied by
#    the write, is pruned as it grows (``Feed.ran``). ``stats()``: ``constant_writes_told``, ``..._untold``.
# 13. Traces (``enable(trace=path)``, NOTE [ Traces ] in sim/trace.py): the session writes every call it makes into
#    the core (``Session.trace_to``); the kernel then calls ``before`` ahead of every managed op and tells every
#    write to a constant a recipe read (front.cpp, ``g_trace``), so that the trace replays at any budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.errors import parse_budget
from ..core.policies import DEFAULT_POLICY, Policy, get_policy

_SESSION: Any = None


class NativeUnavailable(RuntimeError):
    """The compiled front end could not be built here (no C++ compiler, no ninja): use ``torch_dtr.enable``."""


@contextlib.contextmanager
def _core_locked(ext: Any) -> Iterator[None]:
    """The kernel's lock, for an entry into the core from Python (front.cpp, rule 4: a managed op may be in
    flight on another thread without the GIL; its inputs must not be evicted under it)."""
    ext.lock_core()
    try:
        yield
    finally:
        ext.unlock_core()


def load() -> Any:
    """Build (on first use, about a minute; then cached by torch) and load the extension; a failure is
    remembered (raised again without a second try)."""
    out = _load()
    if isinstance(out, NativeUnavailable):
        raise out
    return out


@functools.cache
def _load() -> Any:
    try:
        return _build()
    except NativeUnavailable as e:
        return e


def _build() -> Any:
    try:
        from torch.utils.cpp_extension import load as build
    except ImportError as e:  # pragma: no cover - torch always has it
        raise NativeUnavailable(f"torch_dtr.native: torch.utils.cpp_extension is missing ({e})") from e
    t0 = time.perf_counter()
    try:
        here = Path(__file__).parent
        ext = build("torch_dtr_native", [str(here / "front.cpp"), str(here / "simalloc.cpp")],
                    extra_cflags=["-O2", "-DNDEBUG"])
    except Exception as e:  # no compiler, no ninja, a compile error
        raise NativeUnavailable(
            f"torch_dtr.native: the C++ front end could not be built ({type(e).__name__}: {str(e)[-400:]}); it needs "
            f"a C++ compiler (g++ or clang++: e.g. apt install g++, or xcode-select --install) and ninja (pip "
            f"install ninja).") from e
    ext.claim()
    took = time.perf_counter() - t0
    if took > 5:
        print(f"torch_dtr.native: built the C++ front end in {took:.0f} s (cached from now on)", file=sys.stderr)
    return ext


def available() -> bool:
    """Whether the compiled front end builds and loads here."""
    try:
        load()
    except NativeUnavailable:
        return False
    return True


def enable(budget: int | str | None = None, *, policy: str | Policy = DEFAULT_POLICY, banish_depth: int | None = None,
           swap: bool | str = False, host_budget: int | str | None = None, swap_gbps: float | None = None,
           device: Any = None, grads_in_place: bool = True, trace: str | Path | None = None, learn: bool = True) -> Any:
    """Manage this thread's ops with the compiled front end under ``budget`` (bytes or "2GiB"); returns the
    session (``.rt`` is its core runtime). ``swap``, ``host_budget``, ``swap_gbps``: the host tier, as
    ``torch_dtr.enable`` takes them (rule 6); ``banish_depth`` as there (default 2, or 0 with a host tier at
    least as large as the budget). ``device``: the allocator whose count the budget bounds (rule 8; default: the
    current CUDA device where CUDA is available, else none: the budget bounds the values this front end counts).
    ``grads_in_place``: autograd sums a value's gradients into one tensor in place, as in plain PyTorch (rule 9;
    False: into a new tensor per term, as under the Python front end, which makes the same decisions then).
    ``trace``: a file to write every call into the core to, for ``torch_dtr.sim.trace`` (NOTE [ Traces ]).
    ``learn``: trace the first steps in memory to learn the program's smallest budget (NOTE [ Learned budgets ])."""
    global _SESSION
    import torch

    from ..eager.api import freeze_gc
    from ..eager.front import DEFAULT_BANISH_DEPTH
    from ..eager.swap import banish_default, tier_options
    from .exports import guard_constants, guard_storage
    from .exports import install as install_exports
    from .regions import watch
    from .session import Session
    from .swap import NativeTier

    if _SESSION is not None and _SESSION.active:
        raise RuntimeError("torch_dtr.native: already enabled; call torch_dtr.native.disable() first")
    from .. import eager

    if eager.enabled():
        raise RuntimeError("torch_dtr.native: torch_dtr.enable() is on; the two front ends cannot run together "
                           "(call torch_dtr.disable() first)")
    nbytes = parse_budget(budget)
    policy_name = get_policy(policy).name
    if banish_depth is not None and (isinstance(banish_depth, bool) or not isinstance(banish_depth, int)
                                     or banish_depth < 0):
        raise ValueError(f"torch_dtr.native: banish_depth must be an int >= 0 (0: never banish), got {banish_depth!r}")
    from ..eager.device import CudaDevice, Device

    if device is not None and not isinstance(device, Device):
        raise TypeError(f"torch_dtr.native: device must be a torch_dtr device with an allocator count (CudaDevice, "
                        f"SimulatedDevice) or None, got {device!r} ({type(device).__name__})")
    if device is not None:
        device.ready()
    if device is None and torch.cuda.is_available():
        device = CudaDevice()
    cuda = isinstance(device, CudaDevice)
    kind = 0 if device is None else 1 if cuda else 3 if device.name == "simulated" else 2  # (simdevice.py)
    swap, host, gbps = tier_options(swap, host_budget, swap_gbps, cuda, "torch_dtr.native")
    if banish_depth is None:
        banish_depth = banish_default(swap, nbytes, host, DEFAULT_BANISH_DEPTH)
    ext = load()
    if nbytes is not None and device is not None:
        device.prepare()  # NOTE [ Device memory ] 8 (before the thread's ops reach the kernel)
    if _SESSION is not None:
        ext.forget()
    make_tier = functools.partial(NativeTier, ext, cuda, host, None if gbps is None else gbps * 1e9) if swap else None
    s = Session(ext, nbytes, policy, banish_depth, None if make_tier is None else make_tier(), device, make_tier)
    s.active = True
    _SESSION = s
    learn = bool(learn) and device is None  # NOTE [ Learned budgets ] 4
    if trace is not None or learn:
        from ..eager.front import EVICT_MINIMUM
        from ..sim.trace import Writer
        from .session import LEARN_ROWS

        w = Writer(trace, {"policy": policy_name, "banish_depth": banish_depth, "evict_minimum": EVICT_MINIMUM,
                           "budget": nbytes, "grads_in_place": bool(grads_in_place)}, LEARN_ROWS if learn else 0)
        if learn:
            s.learn(w)
        else:
            s.trace_to(w)
    from ..eager import fsdp

    _step_hooks(ext)
    s.unwrap_fsdp = fsdp.wrap(lambda: s if s.active else None)  # NOTE [ Resharded parameters ]
    s.unwatch = watch(s)  # NOTE [ Unmanaged regions ]
    s.epoch = ext.start(s, -1 if nbytes is None else nbytes)
    ext.set_trace(s.trace is not None)
    s.froze = freeze_gc()  # as the Python front end (torch_dtr.eager.api.freeze_gc): its records are many too
    ext.cpu_blocks(True)  # rule 7
    if device is not None:
        device.budget_set(nbytes)  # NOTE [ The CPU as a device ] 7
    ext.set_retry(device is not None)  # rule 8
    ext.set_count_plain(kind)  # rule 8: plain ops' outputs on the device (front.cpp, g_count_plain)
    ext.set_lend(bool(grads_in_place))  # rule 9
    install_exports(ext)  # NOTE [ Native exports ]
    guard_storage(ext, True)
    guard_constants(ext, True, lambda: _SESSION)
    ext.attach(True)
    return s


_STEP_HOOKS: list[Any] = []


def _step_hooks(ext: Any) -> None:
    """Inside an optimizer's step() its updates stay plain (NOTE [ Managed vs constant ] 5): hooks on every step,
    for the running session, registered once per process and never removed (a session enabled or disabled by an
    optimizer's own step hook, as ``torch-dtr record`` does, would otherwise change the hooks PyTorch is calling)."""
    if _STEP_HOOKS:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from ..eager.front import step_level

    def pre(_o: Any, args: Any, kwargs: Any) -> None:
        s = _SESSION
        if s is not None and s.active:
            ext.set_stepping(step_level(args, kwargs))

    def post(*_: Any) -> None:
        s = _SESSION
        if s is not None and s.active:
            s.stepped()

    _STEP_HOOKS[:] = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]


def disable() -> None:
    """Stop managing new ops. Managed tensors the program still holds stay readable (evicted ones are
    recomputed without a budget)."""
    s = _SESSION
    if s is None or not s.active:
        return
    with _core_locked(s.ext):
        _disable(s)


def _disable(s: Any) -> None:
    from ..eager.api import thaw_gc
    from .exports import guard_constants, guard_storage

    s.stop()  # what the kernel queued (front.cpp, rule 7) told; the session and its tenants stopped, budgets lifted
    s.ext.attach(False)
    guard_storage(s.ext, False)
    guard_constants(s.ext, False)
    s.ext.set_retry(False)
    s.ext.set_count_plain(0)
    s.ext.set_lend(True)
    s.ext.cpu_blocks(False)
    thaw_gc(s.froze)
    s.unwrap_fsdp()
    s.unwatch()
    s.ext.set_stepping(0)
    while s.ext.region_leave():  # a region's backward that raised left its kernels' scope open (this thread's)
        pass
    region = sys.modules.get("torch_dtr.inductor.region")
    if region is not None:
        region._open.n = 0
    if s.trace is not None:
        s.ext.set_trace(False)
        s.trace.close()


def current() -> Any:
    """The current (or last) native session, or None."""
    return _SESSION


def stats() -> dict[str, Any]:
    """The core's counters (``torch_dtr.Stats`` as a dict) and the kernel's."""
    s = _SESSION
    if s is None:
        return {}
    with _core_locked(s.ext):
        s.flush()
        s.sweep()
        out = dataclasses.asdict(s.rt.stats())
        out.update(s.ext.counters())
    return out


def set_budget(budget: int | str | None) -> None:
    """Change the budget of the running session (evicting now if it shrank): with tenants, the total they share
    (NOTE [ Tenants ] 2). Where it cannot be kept, ``BudgetError``, and the budgets stay as they were."""
    from ..eager.tenants import rebalance

    s = _SESSION
    if s is None or not s.active:
        raise RuntimeError("torch_dtr.native: not enabled")
    nbytes = parse_budget(budget)
    with _core_locked(s.ext):
        s.ext.cpu_blocks_empty()  # the blocks kept for reuse are bounded by the peak in use: it starts again (rule 7)
        old, s.total = s.total, nbytes
        try:
            if s.tenants:
                rebalance(s)
            else:
                s.set_budget(nbytes)
        except BaseException:
            s.total = old
            raise


@contextlib.contextmanager
def tenant(name: str, share: float | None = None) -> Iterator[Any]:
    """Run this thread's ops as tenant ``name`` of the running session (NOTE [ Tenants ]); yields its session."""
    from ..eager.tenants import tenant_of

    s = _SESSION
    if s is None or not s.active:
        raise RuntimeError("torch_dtr: tenant() needs an enabled session; call torch_dtr.enable(budget=...) first")
    if not isinstance(name, str):
        raise TypeError(f"torch_dtr: a tenant's name is a str, got {name!r}")
    if not s.ext.attached():
        raise RuntimeError("torch_dtr: tenant() must run where the session manages the thread's ops (the thread that "
                           "called enable(), or inside `with torch_dtr.attach():`)")
    with _core_locked(s.ext):
        t = tenant_of(s, name, share)
    was = s.ext.use(t.epoch if t is not s else -1)
    try:
        yield t
    finally:
        try:
            s.ext.use(was)
        except RuntimeError:  # a new session began inside the scope: its tenants are not the old one's
            s.ext.use(-1)


def empty_cache() -> int:
    """Give the CPU blocks kept for reuse back to the C library (NOTE [ Native front end ] 7), as
    ``torch.cuda.empty_cache`` does for CUDA's; returns the bytes given back. ``set_budget`` and ``disable`` do it
    too."""
    ext = load()
    kept = int(ext.cpu_blocks_kept()[0])
    ext.cpu_blocks_empty()
    return kept


@contextlib.contextmanager
def passthrough(blocks: bool = False) -> Iterator[None]:
    """For benchmarks: the floor of this front end's mechanism. Inside, every op of this thread reaches the
    front end's dispatch-key fallback, which passes it straight down (no session, no Python, no GIL): what any
    boxed fallback costs before it does anything, as a do-nothing ``TorchDispatchMode`` is the floor of a Python
    mode. ``blocks``: the CPU blocks allocator is on too (NOTE [ Native front end ] 7). Refused while a session
    is enabled, and while managed tensors of an ended one live (their ops need the front end)."""
    ext = load()
    if _SESSION is not None and _SESSION.active:
        raise RuntimeError("torch_dtr.native.passthrough: a session is enabled; call torch_dtr.native.disable() "
                           "first")
    ext.set_passthrough(True)
    if blocks:
        ext.cpu_blocks(True)
    try:
        yield
    finally:
        if blocks:
            ext.cpu_blocks(False)
        ext.set_passthrough(False)


def is_managed(t: Any) -> bool:
    return bool(load().is_managed(t))
