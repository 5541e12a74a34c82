"""Work the compiled front end does not manage, said once per session: torch.compile's compiled kernels and
torch.func's transforms.

# NOTE [ Unmanaged regions ]
#
# 1. A torch.compile region's kernels run on plain tensors below dispatch: what they compute is not managed
#    (never evicted). With inductor (torch.compile's default) each region is planned against the budget instead
#    (NOTE [ Compiled regions under a budget ]); its managed inputs are brought back and pinned before it runs
#    (its kernels read their memory directly, and it may save them for its backward). The aten ops its kernels call
#    through the dispatcher (inductor's extern kernels: convolutions, matmuls; its buffers' allocations; grad mode
#    is off in them) take the plain path too (reserved ahead, retried on the device's out-of-memory), from its call
#    to its end and from its backward's start to its end (``Env.enter``/``leave``, front.cpp's ``region_enter``),
#    after the core heard of every death so far. Managed by the grad-mode-off rule, their outputs
#    were values the kernels read by address, freed only when the core next heard of their deaths: the bench's
#    ResNet-50 held 62 MiB more in its backward than compiled plain at the same partition. A region dynamo compiles
#    with another backend while a session runs is said once per session (dynamo's end callback). A region
#    compiled before ``enable()`` and only run under it is not seen (as with the Python front end, NOTE
#    [ Compiled regions ] 2).
# 2. Inside torch.func's transforms (vmap, grad, vjp, jvp and what is built on them) ops run on functorch's
#    wrapped tensors, which the kernel passes through: their work is outside the budget too. While a session runs,
#    the transforms' implementations are wrapped to warn once per session (the Python front end's list,
#    NOTE [ Compiled regions ] 3).
# 3. Dynamo's callbacks are registered at ``enable()`` where dynamo is imported already; otherwise when it is first
#    imported (``_Later``, an import hook on ``torch._dynamo.callback``, which dynamo imports before it compiles
#    anything), so that a program that never compiles does not import dynamo: 0.7 s and ~60 MiB of modules
#    (sympy's among them) that a session otherwise held in RSS from ``enable()`` on.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..eager.front import _TRANSFORMS

COMPILED = ("torch_dtr: a torch.compile region is compiled while torch_dtr runs, with a backend other than inductor; "
            "what its compiled kernels compute is not managed (never evicted, not counted in the budget on the CPU; "
            "on CUDA counted as memory outside torch-dtr's reach), unless the backend runs aten ops "
            "(backend='eager'), which torch-dtr manages. Leave room for it in the budget, or compile with inductor "
            "(the default), whose regions torch-dtr plans against the budget (NOTE [ Unmanaged regions ]). Under a "
            "budget, pass such a region plain tensors (t.detach().clone() made under torch_dtr.disable()): its "
            "kernels read their inputs' memory directly, and a managed value evicted under them is read freed.")
TRANSFORMS = ("torch_dtr: ops inside torch.func transforms (vmap, grad, vjp, jvp, jacrev, ...) are not managed: what "
              "they compute is outside torch-dtr's budget (never evicted; not counted on the CPU, counted as memory "
              "outside its reach on CUDA). Run the transform outside torch_dtr.enable(), or leave room for it in the "
              "budget (NOTE [ Unmanaged regions ]).")


def watch(session: Any) -> Callable[[], None]:
    """Warn once per ``session`` (its ``warned``: a set of what was said) when a region starts that it does not
    manage; returns the function that stops watching (``disable()``)."""

    def say(what: str) -> None:
        if session.active and what not in session.warned:
            session.warned.add(what)
            warnings.warn(what, RuntimeWarning, stacklevel=4)

    planned: list[Callable[[], None] | None] = []  # installed at dynamo's first compile (inductor imports in ~2 s)
    made = [0, 0]

    def compiling(_args: Any) -> None:
        if not planned and session.active:
            planned.append(_plan_regions(session))
        made[:] = [_made(), _graphs()]

    def compiled(_args: Any) -> None:
        # more graphs were handed to backends than regions of inductor's made (NOTE [ Unmanaged regions ] 1)
        if _graphs() - made[1] > _made() - made[0]:
            say(COMPILED)

    def wrapped(orig: Any) -> Any:
        def transform(*args: Any, **kwargs: Any) -> Any:
            say(TRANSFORMS)
            return orig(*args, **kwargs)

        return transform

    handlers: list[Any] = []

    def register(handler: Any) -> None:
        if handler is not None and hasattr(handler, "register_start_callback"):
            handler.register_start_callback(compiling)
            handler.register_end_callback(compiled)
            handlers.append(handler)

    if "torch._dynamo" in sys.modules:  # rule 3
        register(_callbacks())
    else:
        _Later.wait(register)
    for mod, name, orig in _TRANSFORMS:
        setattr(mod, name, wrapped(orig))

    def stop() -> None:
        _Later.cancel(register)
        for handler in handlers:
            for remove, fn in ((handler.remove_start_callback, compiling), (handler.remove_end_callback, compiled)):
                try:
                    remove(fn)
                except ValueError:  # already gone
                    pass
        if planned and planned[0] is not None:
            planned[0]()
        for mod, name, orig in _TRANSFORMS:
            setattr(mod, name, orig)

    return stop


class _Later(importlib.abc.MetaPathFinder):
    """Rule 3: calls what waits with dynamo's callback handler once ``torch._dynamo.callback`` is imported."""

    waiting: list[Callable[[Any], None]] = []
    me: _Later | None = None

    @classmethod
    def wait(cls, fn: Callable[[Any], None]) -> None:
        cls.waiting.append(fn)
        if cls.me is None:
            cls.me = cls()
            sys.meta_path.insert(0, cls.me)

    @classmethod
    def cancel(cls, fn: Callable[[Any], None]) -> None:
        if fn in cls.waiting:
            cls.waiting.remove(fn)
        if not cls.waiting and cls.me is not None:
            if cls.me in sys.meta_path:
                sys.meta_path.remove(cls.me)
            cls.me = None

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._dynamo.callback":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            for fn in list(_Later.waiting):
                _Later.cancel(fn)
                fn(getattr(module, "callback_handler", None))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _callbacks() -> Any:
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without dynamo's callbacks: compiled regions go unsaid
        return None
    return callback_handler if hasattr(callback_handler, "register_start_callback") else None


def _graphs() -> int:
    """Graphs dynamo has handed to a backend in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _made() -> int:
    try:
        from ..inductor.region import made
    except ImportError:
        return 0
    return made()


class _SessionEnv:
    """What a compiled region asks of a compiled front end's session (NOTE [ Compiled regions under a budget ] 4)."""

    def __init__(self, session: Any) -> None:
        self.s = session
        self.before = 0  # the bytes of the last region's inputs allocated before the session (CPU)

    def active(self) -> bool:
        return bool(self.s.active)

    def budget(self) -> int | None:
        return self.s.rt.budget

    def live(self, args: Sequence[Any]) -> int:
        self.s.settle()  # (what died since the core last heard is not alive)
        dev = self.s.dev
        if dev is not None:
            return int(dev.allocated())
        ext = self.s.ext
        before = 0
        seen: set[int] = set()
        for a in args:  # inputs allocated before the session (parameters made before enable()) count too
            if isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.layout == torch.strided \
                    and not ext.is_managed(a) and not ext.cpu_blocks_owns(a):
                st = a.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    before += st.nbytes()
        self.before = before
        return int(ext.cpu_blocks_usage()[0]) + before

    def mark(self) -> int | None:
        dev = self.s.dev
        if dev is not None and str(dev.name).startswith("cuda"):
            return None  # not measured on CUDA (its one peak is the user's to reset)
        if dev is not None:  # the CPU device counts its constants beside the blocks (NOTE [ The CPU as a device ])
            return int(self.s.ext.cpu_blocks_mark()) + int(getattr(dev, "foreign", 0))
        return int(self.s.ext.cpu_blocks_mark()) + self.before

    def made_region(self) -> None:
        if self.s.dev is not None:
            self.s.dev.region_runs()  # NOTE [ The CPU as a device ] 8

    def sync(self, args: Sequence[Any]) -> None:
        """Before a region runs eagerly: what the runtime does not count (plain values such as an optimizer's
        state, parameters made before the session) becomes its outside count, so that its evictions keep the
        allocator's count within the budget (NOTE [ Compiled regions under a budget ] 5)."""
        s = self.s
        if s.dev is not None:
            s.rt.sync()
            return
        self.live(args)  # (what of them was allocated before the session: ``before``)
        self._remeasure(0)
        s.remeasure = self._remeasure

    def _remeasure(self, made: int) -> None:
        """What lives outside, measured: before the region's call, and again each time its eager backward made a
        gradient of ``made`` bytes, now plain (NOTE [ Managed vs constant ] 4), with the parameters made before the
        session as at the call. The gradient counts as outside: the core lets its storage go once the managed
        handle dies (until the next measure it may count twice)."""
        s = self.s
        s.flush()
        mem = s.rt.memory
        mem.set_outside(max(0, int(s.ext.cpu_blocks_usage()[0]) + self.before - mem.tracked + made))

    def prepare(self, args: Sequence[Any]) -> None:
        """Managed inputs are brought back and pinned: the region's kernels read their memory directly."""
        ext = self.s.ext
        for a in args:
            if isinstance(a, torch.Tensor) and ext.is_managed(a):
                self.s.unwrap(a)

    def enter(self) -> None:
        self.s.settle()  # the values that died since the core last heard are freed before the kernels allocate
        self.s.ext.region_enter()

    def leave(self) -> bool:
        return bool(self.s.ext.region_leave())


def _plan_regions(session: Any) -> Callable[[], None] | None:
    try:
        from ..inductor import install
    except ImportError:  # a torch without inductor's partitioner hook: its regions go unplanned
        return None
    return install(_SessionEnv(session))
