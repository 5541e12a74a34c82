"""The PyTorch front end: every aten op of the program passes through ``Front.run`` while enabled."""


from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..core import Op, Runtime, Storage
from ..core.policies import Policy
from . import fsdp
from .constants import Constants
from .costs import model_cost
from .device import GRANULE, CudaDevice, CudaTimer, Device, OutOfMemory
from .funcinfo import FuncInfo, info
from .mathkeys import math_keys
from .recipe import Recipe, Ref, clone_storage, fill, flat_outputs, version
from .rng import RngState
from .sizes import Sizes, trim
from .swap import HostTier
from .tensor import Cell, DTRTensor, geometry, view_of

# NOTE [ Managed vs constant ]
#
# 1. While enabled, an op's outputs are managed (wrapped in ``DTRTensor``, recorded, evictable) when one
#    of its inputs is managed, or requires grad while grad mode is on.
# 2. Everything else stays plain and is a constant: parameters, buffers, inputs, whatever was created
#    outside. Constants are never evicted; their storages count against the budget once seen as an input
#    of a managed op (NOTE [ Budget accounting ]), until the last tensor seen on them dies.
# 3. A view of a constant and an in-place write to a constant stay plain.
# 4. Gradients accumulated into plain leaves (``p.grad``) are handed back plain by a post-accumulate-grad
#    hook on each leaf seen, so optimizers (foreach and fused paths too) run on plain tensors.
# 5. Inference: with grad mode off (``torch.no_grad``, ``torch.inference_mode``), an op that makes new
#    tensors from tensors (not a view, not an in-place write, replayable) is managed even when its inputs are
#    plain, so that what inference holds (activations of a batched forward, a KV cache, outputs kept for
#    later) counts against the budget and can be evicted and recomputed. Its plain inputs become constants
#    (counted), as do gradients read by no-grad code between steps (``clip_grad_norm_``, a GradScaler's
#    checks). Not inside ``optimizer.step()`` (``Front.stepping``, set by optimizer step hooks): an
#    optimizer's state and updates stay plain. The same with or without a budget, so that an unbudgeted
#    run's peak counts what a budgeted one counts. A step that raises never runs its post-hooks: a step
#    called without a closure cannot run ops under grad mode (unless its optimizer is ``differentiable``,
#    whose updates run under grad mode anyway), so the first op under grad mode ends it (``step_level``); a
#    step with a closure that raised leaves inference unmanaged until the next step ends.
# 6. A managed value that becomes a parameter (``nn.Parameter(t)``) or a buffer (``register_buffer``) while
#    enabled, as weight norm's parametrization makes them under no_grad, becomes its plain value (pinned):
#    parameters and buffers are constants. ``enable()`` wraps both for the session.
# 7. Tensor subclasses that run each op on inner tensors of their own (DTensor, the collectives'
#    AsyncCollectiveTensor) go first: the mode returns NotImplemented for an op with one among its arguments,
#    and sees the ops they run on their local tensors, which it manages as any other. Their own outputs (a
#    wrapper without storage) stay unmanaged. A collective's output is never replayed (its op is not aten's:
#    FuncInfo.replayable), so no rank recomputes one alone; c10d's in-place collectives (``dist.all_reduce(t)``)
#    write their first argument without their schemas saying so, and count as writing it (FuncInfo.mutated):
#    a managed tensor they wrote is pinned, never recomputed as what it was before.
#
# NOTE [ Threads ]
#
# 1. Autograd may run backward on a worker thread (one per device on CUDA). Every entry into the runtime
#    holds ``Front.lock`` (re-entrant: a rematerialization may run ops of its own).
# 2. Handles die whenever Python frees an object, possibly on another thread or in the middle of the
#    runtime's bookkeeping; their drops are queued (``Front.pending``, a thread-safe deque) and drained
#    under the lock at the start of the next managed op or ``stats()``.
# 3. A thread that does not see the dispatch mode still reaches ``DTRTensor.__torch_dispatch__`` for
#    managed tensors, which routes to the enabled front end.
# 4. PyTorch keeps dispatch modes per thread, so ``enable()`` manages the thread that calls it. Ops that
#    another thread runs on plain tensors stay plain (not counted, never evicted) unless that thread enters
#    ``torch_dtr.attach()``: the same session (budget, runtime, lock) on its own mode, which falls back to
#    plain PyTorch once the session is disabled. (Making it process-wide would need a hook on every thread's
#    dispatch, which PyTorch does not offer.)

# NOTE [ Compiled regions ]
#
# 1. ``torch.compile`` traces a region with dynamo, which runs its ops on fake tensors through the dispatch
#    modes of the thread, ours included (the mode lets dynamo in: ``_should_skip_dynamo``). While dynamo
#    traces (``torch.compiler.is_compiling()``), the mode steps aside: the region is traced as plain PyTorch.
# 2. At run time the compiled region's kernels run on plain tensors: what it computes is not managed
#    (never evicted, not counted in tracked bytes; on CUDA it is part of the allocator's count, outside
#    torch-dtr's reach). A warning says so once per session. With ``backend="eager"`` the compiled graph's
#    aten calls run through the mode again and are managed as usual.
# 3. Inside ``torch.func`` transforms (vmap, grad, vjp, jvp and what is built on them) the ops reach the mode
#    on tensors that do not require grad at its level, so they stay plain (not managed, not counted), and
#    nothing the mode can read tells them apart (``torch._C._are_functorch_transforms_active()`` is False
#    there). While enabled, the transforms' implementations (``vmap_impl``, ``grad_impl``, ...) are wrapped
#    to warn once per session that their work is outside the budget.

_ACTIVE: Front | None = None  # the enabled front end, if any
_EMPTY: frozenset[int] = frozenset()
_STRIDED = torch.strided
_TENSOR = torch.Tensor


_MANAGED, _GRAD, _COMPLEX, _FOREIGN = 2, 1, 4, 8
# tensor subclasses that run their ops on inner tensors of their own (DTensor): the mode lets them go first
# (NOTE [ Managed vs constant ] 7); filled at enable() from the modules already imported
_FOREIGN_TYPES: set[type] = set()


def _kinds(xs: Any) -> int:
    """What the arguments ``xs`` hold (one level of lists), as bits: ``_MANAGED`` a managed tensor, ``_GRAD`` a
    tensor that requires grad, ``_COMPLEX`` a complex tensor (NOTE [ Conjugate and negative keys ])."""
    k = 0
    for a in xs:
        t = type(a)
        if t is DTRTensor:
            k |= _MANAGED | (_COMPLEX if a.dtype.is_complex else 0)
        elif t is list or t is tuple:
            for b in a:
                if type(b) is DTRTensor:
                    k |= _MANAGED | (_COMPLEX if b.dtype.is_complex else 0)
                elif isinstance(b, torch.Tensor):
                    k |= (_GRAD if b.requires_grad else 0) | (_COMPLEX if b.dtype.is_complex else 0)
                    if type(b) in _FOREIGN_TYPES:
                        k |= _FOREIGN
        elif isinstance(a, torch.Tensor):
            k |= (_GRAD if a.requires_grad else 0) | (_COMPLEX if a.dtype.is_complex else 0)
            if t in _FOREIGN_TYPES:
                k |= _FOREIGN
    return k


def _has_tensor(args: tuple, kwargs: dict) -> bool:
    """Whether a strided tensor is among the arguments (one level of lists), and no nested one."""
    found = False
    for a in (*args, *kwargs.values()) if kwargs else args:
        for b in a if type(a) is list or type(a) is tuple else (a,):
            if isinstance(b, torch.Tensor):
                if b.is_nested:
                    return False
                found = found or b.layout == _STRIDED
    return found


def _on_device(dev: Device, refs: list[Ref], consts: list[torch.Tensor]) -> bool:
    if refs:
        return dev.owns(refs[0].storage.payload)
    return bool(consts) and dev.owns(consts[0])


# The live default of NOTE [ Banishing ] (rule 6 says why 2, and why replays of operator logs keep 0).
DEFAULT_BANISH_DEPTH = 2
EVICT_MINIMUM = 64  # bytes: a session never evicts a smaller storage (NOTE [ The smallest victim ], core/runtime.py)


def step_level(args: tuple, kwargs: dict) -> int:
    """What an optimizer step pre-hook's arguments say (NOTE [ Managed vs constant ] 5): 1 a step without a
    closure, 2 one with (whose closure runs ops under grad mode inside the step)."""
    closure = args[1] if len(args) > 1 else kwargs.get("closure")
    return 1 if closure is None else 2


def _refs_in(a: Any) -> list[Ref]:
    """The managed arguments in ``a``: one, or those in a list (of lists: c10d's ``allgather_``)."""
    if type(a) is Ref:
        return [a]
    if type(a) in (list, tuple):
        return [r for x in a for r in _refs_in(x)]
    return []


class Front:
    """One enabled session: the core runtime plus everything torch-specific around it."""

    def __init__(self, budget: int | None, policy: str | Policy, sample_sqrt: bool,
                 min_evict_bytes: int | None, costs: str = "model",
                 banish_depth: int = DEFAULT_BANISH_DEPTH, device: Device | None = None,
                 sync_every: int = 64, swap: bool = False, host_budget: int | None = None,
                 swap_gbps: float | None = None) -> None:
        self._args = (budget, policy, sample_sqrt, min_evict_bytes, costs, banish_depth, device, sync_every, swap,
                      host_budget, swap_gbps)
        # NOTE [ Tenants ]: the session's total budget, its tenants and their shares (tenants.py)
        self.total = budget
        self.session: Front | None = None  # a tenant's session
        self.tenants: dict[str, Front] = {}
        self.shares: dict[str, float] = {"": 1.0}
        if device is None and torch.cuda.is_available():
            device = CudaDevice()
        # NOTE [ Device memory ]: the budget bounds the device allocator's count; out-of-memory retries
        self.dev = device
        # NOTE [ Host copies ]: evicted values may be copied to host memory instead of dropped
        tier = None if not swap else HostTier(isinstance(device, CudaDevice), host_budget,
                                              None if swap_gbps is None else swap_gbps * 1e9)
        self.rt = Runtime(budget, policy, sample_sqrt=sample_sqrt, min_evict_bytes=min_evict_bytes,
                          device_usage=None if device is None else device.usage, sync_every=sync_every,
                          banish_depth=banish_depth, lazy_tracking=True, tier=tier, evict_minimum=EVICT_MINIMUM)
        self.model = costs == "model"  # NOTE [ Modelled costs ]; else measured time
        self.timer = CudaTimer() if isinstance(device, CudaDevice) and not self.model else None
        # ops and recipes on the device evict and retry on out-of-memory through it
        self.oom = None if device is None else OutOfMemory(self.rt, device)
        if device is not None and device.cheap_layout:  # NOTE [ Layout-aware eviction ]
            self.rt.layout = self.oom.victims  # type: ignore[union-attr]
        if tier is not None:
            tier.oom = self.oom  # a copy back that runs out of device memory evicts, retries (NOTE [ Host copies ] 7)
            tier.device = device  # its host_copies() around the copies out
        self.rates = "cuda" if isinstance(device, CudaDevice) else "cpu"  # modelled costs of ops on the device
        self.active = False  # set while this is the enabled front end (``set_active``)
        self.lock = threading.RLock()
        self.pending: deque[Any] = deque()
        self.consts = Constants(self.rt, self.pending, self.drain_if_idle)
        self.sizes = Sizes()
        self.mode = _Mode(self)
        self.busy = False  # True while this front end's runtime is doing bookkeeping (under the lock)
        self.expandable_was: bool | None = None  # the device's setting before enable() switched it (api)
        self.warned_compile = False  # NOTE [ Compiled regions ] 2
        self.warned_func = False  # NOTE [ Compiled regions ] 3
        self.stepping = 0  # inside an optimizer's step(): step_level's (NOTE [ Managed vs constant ] 5)
        self.closed = False  # disable() ended the session: values are read without a budget
        self._step_hooks = (register_optimizer_step_pre_hook(self._step_begins),
                            register_optimizer_step_post_hook(self._step_ends))

    # ------------------------------------------------------------------ queued handle drops
    def drain_if_idle(self) -> None:
        """Drain queued handle drops now, unless the runtime is busy (then it drains at its next op)."""
        if self.lock.acquire(blocking=False):
            try:
                if not self.busy:
                    self.busy = True
                    try:
                        self.drain()
                    finally:
                        self.busy = False
            finally:
                self.lock.release()

    def drain(self) -> None:
        rt, pending = self.rt, self.pending
        while pending:
            item = pending.popleft()
            if type(item) is Storage:
                rt.drop_ref(item)
            else:  # a constant tensor died
                self.consts.died(*item)

    # ------------------------------------------------------------------ constants
    def constant(self, c: torch.Tensor, where: str = "") -> None:
        self.consts.see(c, where)

    def before_write(self, tensors: Any, what: str) -> None:
        """The program is about to write ``tensors`` (plain) in place or replace their data: invalidate the
        recipes that read them, keeping the values it holds (NOTE [ Changed constants ] 2)."""
        ops = self.consts.written(tensors)
        if not ops:
            return
        rt = self.rt
        with _disable_current_modes():
            rt.rescue(ops)  # NOTE [ Changed inputs ] 2: recomputed with the old value, kept
        rt.invalidate(ops, f"{what} wrote a constant it was computed from (an optimizer step, a write "
                           f"through .data, or t.data = ...), so recomputing it would give another value")

    # ------------------------------------------------------------------ templates
    def scan(self, x: Any, refs: list[Ref], consts: list[torch.Tensor]) -> Any:
        t = type(x)
        if t is DTRTensor:
            cell = x._cell
            if cell.front is not self:  # made under an earlier enable(): a constant here (its value, pinned there)
                x = cell.front.unwrap(cell)
                consts.append(x)
                return x
            s = cell.storage if cell.storage.forward is None else cell.current()
            r = Ref(s, cell.geom)
            refs.append(r)
            return r
        if t is list or t is tuple:
            return t([self.scan(y, refs, consts) for y in x])
        if isinstance(x, torch.Tensor):
            consts.append(x)
        return x

    def _scan_top(self, args: tuple, refs: list[Ref], consts: list[torch.Tensor]) -> tuple[tuple, tuple] | None:
        """``scan`` and ``fill`` in one pass, for positional arguments without lists whose managed inputs are
        all resident: the call template and the plain arguments; None where that does not hold."""
        targs = []
        pargs = []
        for a in args:
            t = type(a)
            if t is DTRTensor:
                cell = a._cell
                s = cell.storage
                if s.forward is not None:
                    s = cell.current()
                p = s.payload
                if p is None or cell.front is not self:
                    return None
                geom = cell.geom
                r = Ref(s, geom)
                refs.append(r)
                targs.append(r)
                pargs.append(p if geom is None else view_of(p, geom))
            elif t is list or t is tuple:
                return None
            else:
                if isinstance(a, torch.Tensor):
                    consts.append(a)
                targs.append(a)
                pargs.append(a)
        return tuple(targs), tuple(pargs)

    # ------------------------------------------------------------------ the per-op path
    # Phases of one managed op (``_run``): acquire its managed inputs (the core rematerializes and locks
    # them), plan its in-place writes and reserve its outputs' bytes (``_plan``), run it (``_execute``:
    # random state, timing, out-of-memory retry), tell the runtime and keep its recipe (``_record``), and
    # hand back managed outputs (``_wrap``).
    def run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        fi = info(func)
        with self.lock:
            was_busy, self.busy = self.busy, True
            try:
                if self.pending:
                    self.drain()
                if fi.simple:
                    return self._run_simple(fi, args, kwargs)
                if fi.restrides and type(args[0]) is DTRTensor and args[0]._cell.front is self:
                    return self._restride(fi, args, kwargs)
                return self._run(fi, args, kwargs)
            finally:
                self.busy = was_busy

    def _restride(self, fi: FuncInfo, args: tuple, kwargs: dict) -> Any:
        """An op that changes only the view metadata of its first argument in place (``t_``, ``transpose_``,
        ``unsqueeze_``, ``as_strided_``, ...): no data is written, so no new version. The tensor's cell gets
        the new geometry, and the wrapper's own sizes and strides are changed to match (as
        ``return_and_correct_aliasing`` does for wrapper subclasses: the op run on the wrapper's metadata)."""
        x = args[0]
        cell = x._cell
        s = cell.current()
        p = self.rt.get(s)
        v = view_of(p, cell.geom)
        if v is p:  # a view object of our own: the op must not restride the payload itself
            v = p.as_strided(p.size(), p.stride(), p.storage_offset())
        fi.func(v, *args[1:], **kwargs)
        cell.geom = geometry(v, p)
        with no_dispatch():
            meta = torch._C._meta_in_tls_dispatch_include()
            torch._C._set_meta_in_tls_dispatch_include(True)
            try:
                fi.func(x, *args[1:], **kwargs)
            finally:
                torch._C._set_meta_in_tls_dispatch_include(meta)
        self.rt.ran([s], 0.0)
        return x

    def _run(self, fi: FuncInfo, args: tuple, kwargs: dict) -> Any:
        rt = self.rt
        refs: list[Ref] = []
        consts: list[torch.Tensor] = []
        targs = self.scan(args, refs, consts)
        tkwargs = {k: self.scan(v, refs, consts) for k, v in kwargs.items()} if kwargs else {}
        ins = [r.storage for r in refs]
        held = rt.acquire(ins) if refs else ()
        try:
            for c in consts:
                self.constant(c, fi.name)
            if consts and (fi.mutated or fi.hidden_writes) and self.consts.readers:
                self.before_write(_writes(fi, args, kwargs), fi.name)
            pargs = fill(targs, None, _EMPTY) if refs else targs
            pkwargs = {k: fill(v, None, _EMPTY) for k, v in tkwargs.items()} if tkwargs else {}
            cow, override, need, on_cuda = self._plan(fi, targs, tkwargs, pargs, pkwargs, refs, consts)
            if override:  # the op writes copies of storages that recipes still read
                pargs = fill(targs, override, _EMPTY)
                pkwargs = {k: fill(v, override, _EMPTY) for k, v in tkwargs.items()} if tkwargs else {}
            versions = [version(c) for c in consts] if consts else None
            rng = RngState.before(pargs, pkwargs) if fi.random else None
            out, cost, start = self._execute(fi, pargs, pkwargs, need, rng, on_cuda)
            flat = flat_outputs(out)
            if self.model:
                cost = model_cost(fi.func, pargs, pkwargs, flat, self.rates if on_cuda else "cpu")
            fresh, aliased = self._fresh(fi, flat, refs, consts)
            if fi.learns_size:  # NOTE [ Size prediction ] 6
                self.sizes.learn(fi, pargs, pkwargs, sum(flat[i].untyped_storage().nbytes() for i in fresh))
            written = [s for s in cow if s.deps or s.recomputable]  # else pinned and unread: a plain write
            if len(written) < len(cow):
                for s in cow:
                    if s.host is not None and s not in written:
                        rt.overwritten(s)  # its copy in the host tier is stale now
            op, recipe = self._record(fi, args, kwargs, targs, tkwargs, refs, ins, consts, versions, rng, cost,
                                      fresh, written, flat, len(written) < len(cow))
            if on_cuda and op is not None and self.timer is not None:
                self.timer.stop(op, start)  # type: ignore[union-attr]
            results = self._wrap(fi, args, kwargs, targs, tkwargs, op, recipe, flat, fresh, aliased, written, override)
        finally:
            if held:
                rt.release(held)
        return self._done(fi, pargs, pkwargs, need, out, flat, fresh, results, fi.fresh and override is None)

    def _run_simple(self, fi: FuncInfo, args: tuple, kwargs: dict) -> Any:
        """``_run`` for an op that only makes new tensors (``FuncInfo.simple``: nothing written, no view, no
        randomness): the same steps in the same order, without the branches that cannot apply."""
        rt = self.rt
        refs: list[Ref] = []
        consts: list[torch.Tensor] = []
        pargs = None if kwargs else self._scan_top(args, refs, consts)
        if pargs is None:  # lists among the arguments, keyword arguments, an input evicted: the general scan
            refs.clear()
            consts.clear()
            targs = self.scan(args, refs, consts)
            tkwargs = {k: self.scan(v, refs, consts) for k, v in kwargs.items()} if kwargs else {}
        else:
            targs, pargs = pargs
            tkwargs = {}
        ins = [r.storage for r in refs]
        held = rt.acquire(ins) if refs else ()
        try:
            if consts:
                see = self.consts.see
                for c in consts:
                    see(c, fi.name)
            if type(pargs) is tuple:  # from _scan_top: the inputs were resident, and now they are locked
                pkwargs = tkwargs
            elif refs:
                pargs = fill(targs, None, _EMPTY)
                pkwargs = {k: fill(v, None, _EMPTY) for k, v in tkwargs.items()} if tkwargs else {}
            else:
                pargs, pkwargs = targs, tkwargs
            dev = self.dev
            budget = rt.budget
            on_cuda = dev is not None and _on_device(dev, refs, consts)
            need = 0
            if budget is not None:
                need = self.sizes.predict(fi, pargs, pkwargs)
                if need and on_cuda:  # NOTE [ Device memory ] 2
                    need += GRANULE * len(fi.returns)
            if budget is not None or dev is not None:
                if on_cuda and self.timer is not None and self.timer.pending:
                    self.timer.resolve(rt)
                rt.reserve(need, fi.name)
            versions = [version(c) for c in consts] if consts else None
            if on_cuda or not self.model:
                out, cost, start = self._execute(fi, pargs, pkwargs, need, None, on_cuda)
            else:
                out, cost, start = fi.op(*pargs, **pkwargs), 0.0, None
            flat = [out] if type(out) is _TENSOR else flat_outputs(out)
            if self.model:
                cost = model_cost(fi.func, pargs, pkwargs, flat, self.rates if on_cuda else "cpu")
            fresh = [i for i, o in enumerate(flat)
                     if type(o) is _TENSOR and o.layout == _STRIDED and not o.is_nested and not o.is_meta]
            op, recipe = self._record(fi, args, kwargs, targs, tkwargs, refs, ins, consts, versions, None, cost,
                                      fresh, [], flat, False)
            if on_cuda and op is not None and self.timer is not None:
                self.timer.stop(op, start)
            results = self._wrap_fresh(op, recipe, flat, fresh)
        finally:
            if held:
                rt.release(held)
        return self._done(fi, pargs, pkwargs, need, out, flat, fresh, results, True)

    def _done(self, fi: FuncInfo, pargs: Any, pkwargs: dict, need: int, out: Any, flat: list[Any], fresh: list[int],
              results: list[Any], sized: bool) -> Any:
        """After an op: evict at once if its outputs outgrew the prediction (``sized``: learn their real size,
        NOTE [ Size prediction ] 9), tell the listeners, and hand back its outputs as the program sees them."""
        rt = self.rt
        if rt.budget is not None and rt.memory.tracked + rt.memory.outside > rt.budget:  # a prediction fell short
            if sized:
                bufs = {st.data_ptr(): st.nbytes() for st in (flat[i].untyped_storage() for i in fresh)}
                self.sizes.fell_short(fi, pargs, pkwargs, need, sum(bufs.values()))
            rt.reserve(0, fi.name)
        if rt.budget is not None:
            rt.ahead()
        if rt.listeners:
            rt.emit("op", None)
        return _rebuild(out, results)

    def _wrap_fresh(self, op: Op | None, recipe: Recipe | None, flat: list[Any], fresh: list[int]) -> list[Any]:
        """``_wrap`` for outputs that are all fresh (``FuncInfo.simple``)."""
        rt = self.rt
        dev = self.dev
        results: list[Any] = list(flat)
        by_ptr: dict[int, tuple[Storage, torch.Tensor]] | None = {} if len(fresh) > 1 else None
        for i in fresh:  # one storage per distinct buffer
            o = flat[i]
            st = o.untyped_storage()
            hit = by_ptr.get(st.data_ptr()) if by_ptr is not None and st.data_ptr() else None
            if hit is None:
                nbytes = st.nbytes()
                if dev is not None and nbytes and dev.owns(o):  # counted as the allocator counts it
                    nbytes = -(-nbytes // GRANULE) * GRANULE
                s = rt.output(op, nbytes, o)
                if recipe is not None:
                    recipe.outs.append(i)
                if by_ptr is not None:
                    by_ptr[st.data_ptr()] = (s, o)
                results[i] = DTRTensor(Cell(self, s, None), o)
            else:
                s, payload = hit
                results[i] = DTRTensor(Cell(self, s, geometry(o, payload)), o)
        return results

    def _plan(self, fi: FuncInfo, targs: Any, tkwargs: dict, pargs: Any, pkwargs: dict, refs: list[Ref],
              consts: list[torch.Tensor]) -> tuple[list[Storage], dict[Storage, torch.Tensor] | None, int, bool]:
        """The managed storages the op writes in place (NOTE [ In-place mutation ]), the copies it must
        write to instead, and the bytes it needs, reserved (evicting) before it runs."""
        rt = self.rt
        cow: list[Storage] = []
        for m in fi.mutated:
            for r in _refs_in(fi.arg(m, targs, tkwargs)):  # (a list: foreach ops, c10d's collectives)
                if r.storage not in cow:
                    cow.append(r.storage)
        if fi.hidden_writes and fi.arg(fi.training, targs, tkwargs):  # batch norm's statistics, if managed
            for h in fi.hidden_writes:
                r = fi.arg(h, targs, tkwargs)
                if type(r) is Ref and r.storage not in cow:
                    cow.append(r.storage)
        on_cuda = self.dev is not None and _on_device(self.dev, refs, consts)
        # sizes matter only to keep a budget: without one nothing is predicted (an out-of-memory retry reads
        # the size the allocator was asked for from its error: NOTE [ Device memory ] 4)
        # (a nested output is not managed: nothing to reserve for it)
        need = self.sizes.predict(fi, pargs, pkwargs) if fi.fresh and rt.budget is not None and not fi.nested else 0
        if need and on_cuda:  # the allocator rounds each output up to 512 B (NOTE [ Device memory ] 2)
            need += GRANULE * len(fi.returns)
        # NOTE [ In-place mutation ] 3: a version nothing can recompute that recipes still read keeps its buffer
        copies = [s for s in cow if s.deps > 0 and not s.recomputable] if cow else None
        if copies:
            need += sum(s.nbytes for s in copies)
        if rt.budget is not None or self.dev is not None:  # with a device: its count, learned now and then
            if on_cuda and self.timer is not None and self.timer.pending:  # type: ignore[union-attr]
                self.timer.resolve(rt)  # type: ignore[union-attr]
            rt.reserve(need, fi.name)
        override = {s: clone_storage(s.payload) for s in copies} if copies else None
        return cow, override, need, on_cuda

    def _execute(self, fi: FuncInfo, pargs: Any, pkwargs: dict, need: int, rng: RngState | None,
                 on_cuda: bool) -> tuple[Any, float, Any]:
        """Run the op once (the first run draws from the program's random stream and advances it)."""
        t0 = time.perf_counter()
        if on_cuda:
            start = self.timer.start() if self.timer is not None else None
            out = self.oom(lambda: fi.op(*pargs, **pkwargs), need, rng)  # type: ignore[misc]
            return out, time.perf_counter() - t0, start
        out = fi.op(*pargs, **pkwargs)
        return out, time.perf_counter() - t0, None

    @staticmethod
    def _fresh(fi: FuncInfo, flat: list[Any], refs: list[Ref],
               consts: list[torch.Tensor]) -> tuple[list[int], dict[int, Ref | None]]:
        """Indices of the outputs with storage of their own, and outputs that alias an input unannounced."""
        rets = fi.returns
        # sparse, nested and other storage-less layouts stay plain: computed eagerly, never evicted (not counted)
        # (and wrapper subclasses such as the collectives' AsyncCollectiveTensor: no storage of their own)
        # (and meta tensors, which hold no memory: a ZeroTensor's forward-mode tangent computes its shape on them)
        fresh = [i for i, o in enumerate(flat) if type(o) is _TENSOR and rets[min(i, len(rets) - 1)] is None
                 and o.layout == _STRIDED and not o.is_nested and not o.is_meta]
        if fi.view_unannotated and fresh:  # an unannotated alias of an input: treat it as a view
            ptrs = {r.storage.payload.untyped_storage().data_ptr(): r for r in refs}
            aliased = {i: ptrs.get(flat[i].untyped_storage().data_ptr()) for i in fresh}
            return [i for i in fresh if aliased[i] is None], aliased
        if fi.maybe_alias:  # annotated as an alias, new when it converted (``to(device="meta")``): not a view then
            mine = {t.untyped_storage().data_ptr() for t in (*(r.storage.payload for r in refs), *consts)}
            aliased: dict[int, Ref | None] = {}
            for i, o in enumerate(flat):
                if (isinstance(o, torch.Tensor) and rets[min(i, len(rets) - 1)] is not None
                        and (o.is_meta or o.untyped_storage().data_ptr() not in mine)):
                    aliased[i] = None  # (not a view of an input: left as it is, or managed below)
                    if type(o) is _TENSOR and o.layout == _STRIDED and not o.is_nested and not o.is_meta:
                        fresh.append(i)
            return fresh, aliased
        return fresh, {}

    def _record(self, fi: FuncInfo, args: tuple, kwargs: dict, targs: Any, tkwargs: dict, refs: list[Ref],
                ins: list[Storage], consts: list[torch.Tensor], versions: list[int] | None, rng: RngState | None,
                cost: float,
                fresh: list[int], written: list[Storage], flat: list[Any],
                plain_write: bool) -> tuple[Op | None, Recipe | None]:
        """Tell the runtime the op ran; its recipe when it made storages and can be replayed. ``plain_write``:
        it wrote a pinned storage in place without a new version (NOTE [ In-place mutation ] 3), which a
        replay would write again, so it is not replayable."""
        rt = self.rt
        if not (fresh or written):  # views and in-place returns only: no clock advance
            rt.ran(ins, 0.0, None, fi.name)
            return None, None
        replayable = fi.replayable and not plain_write
        if replayable and fi.cross_device and refs:
            dev = refs[0].storage.payload.device
            replayable = all(not isinstance(o, torch.Tensor) or o.device == dev for o in flat)
        if not replayable:
            rt.ran(ins, cost, None, fi.name)
            return None, None
        scratch = _EMPTY
        kept: list[tuple[torch.Tensor, int]] = []
        if consts:
            written_consts = [id(c) for c, v in zip(consts, versions, strict=True) if version(c) != v]  # type: ignore[arg-type]
            training = fi.hidden_writes and fi.arg(fi.training, args, kwargs)
            if training:
                written_consts += [id(c) for c in (fi.arg(h, args, kwargs) for h in fi.hidden_writes)
                                   if isinstance(c, torch.Tensor)]
            elif fi.stats:  # NOTE [ In-place mutation ] 6: the recipe reads a copy of the statistics
                targs, tkwargs, consts = _snapshot(fi, targs, tkwargs, consts)
            if written_consts:
                scratch = frozenset(written_consts)
                kept = [(c, version(c)) for c in consts if id(c) not in scratch]
            else:
                kept = [(c, version(c)) for c in consts]
        recipe = Recipe(fi.func, targs, tkwargs, rng, kept, scratch, [], tuple(written), self.oom,
                        torch.is_grad_enabled())
        op = rt.ran(ins, cost, recipe, fi.name, written)
        if kept:
            self.consts.read_by(op, [c for c, _ in kept])  # type: ignore[arg-type]
        return op, recipe

    def _wrap(self, fi: FuncInfo, args: tuple, kwargs: dict, targs: Any, tkwargs: dict, op: Op | None,
              recipe: Recipe | None, flat: list[Any], fresh: list[int], aliased: dict[int, Ref | None],
              written: list[Storage], override: dict[Storage, torch.Tensor] | None) -> list[Any]:
        """The op's outputs as the program sees them: new storages and versions recorded, managed wrappers."""
        rt = self.rt
        rets = fi.returns
        results: list[Any] = list(flat)
        by_ptr: dict[int, tuple[Storage, torch.Tensor]] = {}
        for i in fresh:  # one storage per distinct buffer
            o = flat[i]
            st = o.untyped_storage()
            ptr = st.data_ptr()
            hit = by_ptr.get(ptr) if ptr else None
            if hit is None:
                nbytes = st.nbytes()
                if self.dev is not None and nbytes and self.dev.owns(o):  # counted as the allocator counts it
                    nbytes = -(-nbytes // GRANULE) * GRANULE
                s = rt.output(op, nbytes, o)
                if recipe is not None:
                    recipe.outs.append(i)
                by_ptr[ptr] = (s, o)
                results[i] = DTRTensor(Cell(self, s, None), o)
            else:
                s, payload = hit
                results[i] = DTRTensor(Cell(self, s, geometry(o, payload)), o)
        for s in written:  # new versions of storages written in place
            if recipe is not None:
                recipe.outs.append(s)
            rt.new_version(s, op, override.get(s) if override else None)
        for i, o in enumerate(flat):  # views and in-place returns
            if i in aliased:  # checked by data pointer: a view of that input, or none (fresh, or left as it is)
                if aliased[i] is not None:
                    s = aliased[i].storage  # type: ignore[union-attr]  # resident and locked: a view op writes nothing
                    results[i] = DTRTensor(Cell(self, s, geometry(o, s.payload)), o)
                continue
            ret = rets[min(i, len(rets) - 1)] if rets else None
            if ret is None or not isinstance(o, torch.Tensor):
                continue
            r = fi.arg(ret[:2], targs, tkwargs)
            if ret[2]:  # written in place: hand back the caller's own object
                results[i] = fi.arg(ret[:2], args, kwargs) if not isinstance(r, list) else o
            elif type(r) is Ref:
                s = r.storage
                while s.forward is not None:
                    s = s.forward
                results[i] = DTRTensor(Cell(self, s, geometry(o, s.payload)), o)
        return results

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Hold the runtime for a call that is not an op (``run`` inlines the same for speed): the lock, the
        busy flag (NOTE [ Threads ] 2), queued drops drained first."""
        with self.lock:
            was_busy, self.busy = self.busy, True
            try:
                if self.pending:
                    self.drain()
                yield
            finally:
                self.busy = was_busy

    def set_data(self, t: torch.Tensor, v: torch.Tensor) -> None:
        """``t.data = v`` while enabled (NOTE [ Changed constants ] 4)."""
        with self.entered():
            if type(t) is not DTRTensor:
                self.before_write([t], "t.data = ...")
                self.consts.forget(t)
                _DATA.__set__(t, v._cell.front.unwrap(v._cell) if type(v) is DTRTensor else v)
                return
            if type(v) is DTRTensor and v._cell.front is self:
                cell = Cell(self, v._cell.current(), v._cell.geom)
            else:
                if type(v) is DTRTensor:
                    v = v._cell.front.unwrap(v._cell)
                v = v.detach()
                nbytes = v.untyped_storage().nbytes()
                self.rt.reserve(nbytes, "t.data = ...")
                cell = Cell(self, self.rt.output(None, nbytes, v), None)  # pinned: shares v's memory
            _DATA.__set__(t, DTRTensor(cell, v))  # t takes v's sizes and strides
            t._cell = cell  # type: ignore[attr-defined]

    def plain_ahead(self, func: Any, args: tuple, kwargs: dict) -> None:
        """A plain op is about to run on a device under a budget (an optimizer's state, a factory): where its
        fresh outputs land there, reserve their predicted bytes first, as for a managed op (or raise a
        ``BudgetError`` before it allocates); native/front.cpp's reserve_plain does the same."""
        fi = info(func)
        if not fi.fresh or fi.nested:
            return
        dev = self.dev
        if dev.name != "simulated":  # (there every CPU block is the device's, a factory's too)  # type: ignore[union-attr]
            on = any(isinstance(t, torch.Tensor) and dev.owns(t)  # type: ignore[union-attr]
                     for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else (a,)))
            d = kwargs.get("device")
            if not on and not (d is not None and torch.device(d).type == "cuda"):
                return
        need = self.sizes.predict(fi, args, kwargs, warn=False)
        if need > 0:
            with self.lock:
                self.rt.reserve(need + GRANULE * len(fi.returns), f"{fi.name} (a plain op)")

    def plain_outputs(self, func: Any, out: Any) -> None:
        """A plain op ran on a device under a budget: its fresh outputs there count as outside bytes until
        the next query of the allocator (NOTE [ Device memory ] 2)."""
        fi = info(func)
        if not fi.fresh:
            return
        dev, n = self.dev, 0
        for o in flat_outputs(out):
            if isinstance(o, torch.Tensor) and type(o) is not DTRTensor and o.layout == _STRIDED and dev.owns(o):  # type: ignore[union-attr]
                n += -(-o.untyped_storage().nbytes() // GRANULE) * GRANULE
        if n:
            with self.lock:
                self.rt.add_outside(n)

    def plain_retry(self, func: Any, args: tuple, kwargs: dict, err: BaseException) -> Any:
        """A plain op (an optimizer step, a factory) ran out of device memory: evict and retry it
        (NOTE [ Device memory ] 4); re-raise once nothing is left to evict."""
        while True:
            with self.entered():
                if not self.oom.evict(err, 0):  # type: ignore[union-attr]
                    raise err
            try:
                return func(*args, **kwargs)
            except torch.OutOfMemoryError as e:
                err = e

    def resharding(self, tensors: list[torch.Tensor]) -> None:
        """FSDP2 is about to free these unsharded parameters' storages (NOTE [ Resharded parameters ])."""
        with self.entered():
            self.before_write(tensors, "FSDP's reshard")
            self.consts.release(tensors)

    def plain_write(self, fi: FuncInfo, args: tuple, kwargs: dict) -> None:
        """An unmanaged op (the mode's plain path) is about to write its arguments in place (``entered``,
        inlined: an optimizer's step makes many)."""
        with self.lock:
            was_busy, self.busy = self.busy, True
            try:
                if self.pending:
                    self.drain()
                self.before_write(_writes(fi, args, kwargs), fi.name)
            finally:
                self.busy = was_busy

    # ------------------------------------------------------------------ running ops the mode did not see
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op on tensors this front end manages that reached ``DTRTensor.__torch_dispatch__``: no mode on
        this thread (NOTE [ Threads ] 3), or this session was disabled (then it runs on plain values)."""
        if self.active:
            return self.run(func, args, kwargs)

        def plain(x: Any) -> Any:
            if type(x) is DTRTensor:
                return x._cell.front.unwrap(x._cell)
            if type(x) is list or type(x) is tuple:
                return type(x)(plain(y) for y in x)
            return x

        return func(*plain(args), **{k: plain(v) for k, v in kwargs.items()})

    # ------------------------------------------------------------------ values
    def value(self, cell: Cell) -> torch.Tensor:
        with self.entered():
            s = cell.current()
            if not s.resident:
                rt = self.rt
                if self.closed and rt.budget is not None:
                    # after disable(): the session keeps no budget any more, and reading what the program
                    # still holds must not fail for it (stats() still reports the session's budget)
                    kept, rt.budget = rt.budget, None
                    try:
                        rt.rematerialize(s)
                    finally:
                        rt.budget = kept
                else:
                    rt.rematerialize(s)
            return view_of(s.payload, cell.geom)

    def peek(self, cell: Cell) -> torch.Tensor:
        """The value of a managed tensor for a moment's use (printing): the storage is not pinned."""
        with _disable_current_modes(), torch.no_grad():
            return self.value(cell)

    def unwrap(self, cell: Cell) -> torch.Tensor:
        """A plain tensor with the cell's value; it shares memory with the managed one, so that storage is
        pinned (never evicted again)."""
        if cell.geom is None:  # fast path (gradients handed to p.grad): the payload itself, if resident
            with self.lock:
                s = cell.current()
                if s.resident:
                    self.rt.pin(s)
                    return s.payload
        with _disable_current_modes(), torch.no_grad():
            v = self.value(cell)
            with self.lock:
                self.rt.pin(cell.storage)
        return v

    def set_budget(self, nbytes: int | None) -> None:
        """This front end's own budget (a tenant's share: NOTE [ Tenants ] 2); evicts to fit it now."""
        with self.lock:
            self.rt.set_budget(nbytes)

    def spawn(self) -> Front:
        """A front end with this one's options, for a tenant (NOTE [ Tenants ]); its host tier shares this
        one's host budget (NOTE [ Host copies ] 8)."""
        t = Front(*self._args)
        if t.rt.tier is not None:
            t.rt.tier.pool = self.rt.tier.pool  # type: ignore[union-attr]
        return t

    def _step_begins(self, _opt: Any, args: tuple, kwargs: dict) -> None:
        self.stepping = step_level(args, kwargs)

    def _step_ends(self, *_: Any) -> None:
        self.stepping = 0
        with self.lock:  # an iteration ended: NOTE [ Iteration plans ] in core/plan.py
            if not self.busy:
                self.busy = True
                try:
                    self.drain()
                    self.rt.boundary()
                    if self.dev is not None:
                        self.dev.stepped()
                finally:
                    self.busy = False

    def close(self) -> None:
        self.closed = True
        for t in self.tenants.values():
            t.active = False
            t.close()
        for h in self._step_hooks:
            h.remove()
        self.consts.close()
        trim()


class _Mode(TorchDispatchMode):
    def __init__(self, front: Front) -> None:
        super().__init__()
        self.front = front

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise torch wraps __torch_dispatch__ in torch._disable_dynamo: ~5 us more on every op. The
        # runtime never compiles, and a compiled region under enable() is not supported anyway.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if _compiler._is_compiling_flag:  # NOTE [ Compiled regions ]: dynamo traces through the mode; step aside
            _compiled_region_seen()
            return func(*args, **kwargs)
        k = _kinds(args)
        if kwargs:
            k |= _kinds(kwargs.values())
        if k & _FOREIGN:  # NOTE [ Managed vs constant ] 7: DTensor runs the op on its local tensors, which we see
            return NotImplemented
        if k & _COMPLEX:  # NOTE [ Conjugate and negative keys ]
            with math_keys():
                return self._dispatch(func, args, kwargs, k)
        return self._dispatch(func, args, kwargs, k)

    def _dispatch(self, func: Any, args: tuple, kwargs: dict, k: int) -> Any:
        if k & _MANAGED or (k & _GRAD and torch.is_grad_enabled()):
            if self.front.stepping == 1 and torch.is_grad_enabled():
                self.front.stepping = 0  # a step without a closure raised (NOTE [ Managed vs constant ] 5)
            return self.front.run(func, args, kwargs)
        front = self.front
        # NOTE [ Managed vs constant ] 5: inference
        if not front.stepping and not torch.is_grad_enabled():
            fi = info(func)
            if fi.fresh and not fi.mutated and fi.replayable and not fi.nested and _has_tensor(args, kwargs):
                return front.run(func, args, kwargs)
        root = front.session or front
        if root.tenants:  # NOTE [ Tenants ]: a tenant's parameters may be updated outside its scope
            fi = info(func)
            if fi.mutated:
                for f in (root, *root.tenants.values()):
                    if f.consts.readers:
                        f.plain_write(fi, args, kwargs)
        elif front.consts.readers:  # NOTE [ Changed constants ] 2: a write to a constant recipes read
            fi = info(func)
            if fi.mutated:
                front.plain_write(fi, args, kwargs)
        if front.oom is not None:  # NOTE [ Device memory ] 2 and 4
            if front.rt.budget is not None:
                front.plain_ahead(func, args, kwargs)
            try:
                out = func(*args, **kwargs)
            except torch.OutOfMemoryError as e:
                out = front.plain_retry(func, args, kwargs, e)
            if front.rt.budget is not None:
                front.plain_outputs(func, out)
            return out
        return func(*args, **kwargs)


class ThreadMode(_Mode):
    """The mode of a thread attached to a session (NOTE [ Threads ] 4): plain once the session is disabled."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if not self.front.active:
            return func(*args, **(kwargs or {}))
        return _Mode.__torch_dispatch__(self, func, types, args, kwargs)


class _AskCompiler:
    """For a torch without ``torch.compiler._is_compiling_flag``: ask ``is_compiling()``."""

    @property
    def _is_compiling_flag(self) -> bool:
        return torch.compiler.is_compiling()


# torch.compiler.is_compiling() returns this flag outside TorchScript (which never reaches a dispatch mode);
# read directly, it costs no call on every op
_compiler: Any = torch.compiler if hasattr(torch.compiler, "_is_compiling_flag") else _AskCompiler()


def _compiled_region_seen() -> None:
    f = _ACTIVE
    if f is not None and not f.warned_compile:
        f.warned_compile = True
        warnings.warn("torch_dtr: a torch.compile region is traced under torch_dtr.enable(); what its compiled "
                      "kernels compute is not managed by torch-dtr (never evicted, not counted in its tracked bytes; "
                      "on CUDA it counts as memory outside torch-dtr's reach). Compile with backend='eager' to keep "
                      "it managed, or leave such regions out of torch-dtr's budget (NOTE [ Compiled regions ]).",
                      RuntimeWarning, stacklevel=3)


def _transforms() -> list[tuple[Any, str, Any]]:
    """The implementations of torch.func's transforms that exist in this torch (NOTE [ Compiled regions ] 3)."""
    import torch._functorch.apis as apis
    import torch._functorch.eager_transforms as eager

    found = [(apis, "vmap_impl")] + [(eager, n) for n in ("grad_impl", "grad_and_value_impl", "_vjp_with_argnums",
                                                          "_jvp_with_argnums")]
    return [(m, n, getattr(m, n)) for m, n in found if hasattr(m, n)]


_TRANSFORMS = _transforms()


def _warns(orig: Any) -> Any:
    def transform(*args: Any, **kwargs: Any) -> Any:
        f = _ACTIVE
        if f is not None and not f.warned_func:
            f.warned_func = True
            warnings.warn("torch_dtr: ops inside torch.func transforms (vmap, grad, vjp, jvp, jacrev, ...) are not "
                          "managed: what they compute is outside torch-dtr's budget (never evicted; not counted on "
                          "the CPU, counted as memory outside its reach on CUDA). Run the transform outside "
                          "torch_dtr.enable(), or leave room for it in the budget.", RuntimeWarning, stacklevel=3)
        return orig(*args, **kwargs)

    return transform


def _rebuild(out: Any, results: list[Any]) -> Any:
    """The op's output ``out`` with its flattened tensors replaced by ``results``."""
    if isinstance(out, torch.Tensor):
        return results[0]
    if isinstance(out, (tuple, list)):
        it = iter(results)
        rebuilt = [type(o)(next(it) for _ in o) if isinstance(o, (tuple, list)) else next(it) for o in out]
        return type(out)(rebuilt)
    return out


def _writes(fi: FuncInfo, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments the op writes in place: the schema's, and batch norm's statistics in training mode."""
    out = [fi.arg(m, args, kwargs) for m in fi.mutated]
    if fi.hidden_writes and fi.arg(fi.training, args, kwargs):
        out += [fi.arg(h, args, kwargs) for h in fi.hidden_writes]
    return out


def _snapshot(fi: FuncInfo, targs: Any, tkwargs: dict, consts: list[torch.Tensor]
              ) -> tuple[Any, dict, list[torch.Tensor]]:
    """The call template with copies of the running statistics it reads (NOTE [ In-place mutation ] 6)."""
    copies = {}
    for pos, arg in fi.stats:
        c = fi.arg((pos, arg), targs, tkwargs)
        if isinstance(c, torch.Tensor):
            copies[id(c)] = c.detach().clone()
    if not copies:
        return targs, tkwargs, consts

    def swap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and id(x) in copies:
            return copies[id(x)]
        if type(x) is list or type(x) is tuple:
            return type(x)(swap(y) for y in x)
        return x

    return (swap(targs), {k: swap(v) for k, v in tkwargs.items()},
            [copies.get(id(c), c) for c in consts])


def active() -> Front | None:
    """The enabled front end, if any."""
    return _ACTIVE


def set_active(front: Front | None) -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.active = False
    _ACTIVE = front
    if front is not None:
        front.active = True
        torch.Tensor.data = property(_DATA.__get__, _set_data)  # type: ignore[assignment]
        torch.nn.Parameter.__new__ = _param_new  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = _register_buffer  # type: ignore[method-assign]
        for mod, name, orig in _TRANSFORMS:
            setattr(mod, name, _warns(orig))
        global _UNWRAP_FSDP
        _UNWRAP_FSDP = fsdp.wrap(active)  # NOTE [ Resharded parameters ]
        _FOREIGN_TYPES.update(fsdp.foreign_types())
    else:
        for mod, name, orig in _TRANSFORMS:
            setattr(mod, name, orig)
        _UNWRAP_FSDP()
        if "data" in torch.Tensor.__dict__:
            del torch.Tensor.data
        torch.nn.Parameter.__new__ = _PARAM_NEW  # type: ignore[method-assign]
        torch.nn.Module.register_buffer = _REGISTER_BUFFER  # type: ignore[method-assign]


def _nothing() -> None:
    return None


_UNWRAP_FSDP: Any = _nothing  # undoes fsdp.wrap while enabled


# NOTE [ Managed vs constant ] 6: a value made under no_grad (managed: rule 5) that becomes a parameter or a
# buffer (weight norm's parametrization, an init under no_grad) is a constant: its plain value, pinned
_PARAM_NEW = torch.nn.Parameter.__new__
_REGISTER_BUFFER = torch.nn.Module.register_buffer


def _param_new(cls: type, data: Any = None, requires_grad: bool = True) -> Any:
    if type(data) is DTRTensor:
        data = data._cell.front.unwrap(data._cell)
    return _PARAM_NEW(cls, data, requires_grad)


def _register_buffer(self: torch.nn.Module, name: str, tensor: Any, persistent: bool = True) -> None:
    if type(tensor) is DTRTensor:
        tensor = tensor._cell.front.unwrap(tensor._cell)
    _REGISTER_BUFFER(self, name, tensor, persistent)


# the C getter and setter of ``Tensor.data``; while enabled, ``torch.Tensor.data`` wraps the setter
_DATA = torch._C.TensorBase.__dict__["data"]


def _set_data(t: torch.Tensor, v: torch.Tensor) -> None:
    f = _ACTIVE
    if f is None:
        _DATA.__set__(t, v)
    else:
        f.set_data(t, v)
