"""Inductor's compile_fx, wrapped while a session runs: each region compiled is planned against the budget
(NOTE [ Compiled regions under a budget ] 1, 4, 5)."""

from __future__ import annotations

import itertools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._functorch.config as functorch_config
import torch._inductor.compile_fx as compile_fx_module
import torch._inductor.config as inductor_config

from ..core.errors import fmt_bytes
from .partition import BudgetPartitioner, Choice

if not hasattr(inductor_config, "custom_partitioner_fn"):
    raise ImportError("torch_dtr.inductor needs torch._inductor.config.custom_partitioner_fn (torch 2.6 or later)")

REPLANS = 4  # compilations of one region after its first, at most (dynamo's own limit per frame is 8)
OVER = 1.01  # a measured peak this far over the budget compiles the region again (less is noise: not worth minutes)
_inside = threading.local()  # compile_fx calls itself: those calls are inductor's, not a region's
REGIONS: weakref.WeakSet[Region] = weakref.WeakSet()
_MADE = itertools.count(1)
_made = [0]


CALLED: list[Callable[[], None]] = []  # told whenever any region runs (NOTE [ The CPU as a device ] 8)


def made() -> int:
    """How many regions were made in this process so far."""
    return _made[0]


class Env:
    """What a region asks of the running session."""

    def active(self) -> bool:
        raise NotImplementedError

    def budget(self) -> int | None:
        raise NotImplementedError

    def live(self, args: Sequence[Any]) -> int:
        """Bytes alive outside the region as it is called with ``args``, as the budget counts them."""
        raise NotImplementedError

    def mark(self) -> int | None:
        """The most bytes in use at once since the last call (None: not measured here)."""
        return None

    def sync(self, args: Sequence[Any]) -> None:
        """Before the region's graph runs eagerly under the session: what lives outside, told to its runtime."""

    def prepare(self, args: Sequence[Any]) -> None:
        """Before the compiled kernels read ``args``."""

    def enter(self) -> None:
        """The compiled kernels start on this thread (a region's call, or its backward): the ops they call run
        plain (NOTE [ Unmanaged regions ] 1)."""

    def leave(self) -> bool:
        """They ended (paired with ``enter``); False where none had started."""
        return False

    def made_region(self) -> None:
        """A region was made: its kernels (forward and backward) will allocate outside any op the session can run
        again."""


_open = threading.local()  # backward nodes of regions started on this thread and not yet ended


def _bracket(region: Region, outs: Any) -> None:
    """The region's backward (one autograd node for all its outputs) runs as its call did: its kernels' ops plain,
    and measured (the most in use from the node's start to its end)."""
    env = region.env

    def pre(_grads: Any) -> None:
        env.mark()
        env.enter()
        _open.n = getattr(_open, "n", 0) + 1

    def post(_ins: Any, _outs: Any) -> None:
        _open.n -= 1
        env.leave()
        region.took(env.mark())

    for t in outs if isinstance(outs, (list, tuple)) else (outs,):
        node = t.grad_fn if isinstance(t, torch.Tensor) else None
        if node is not None:
            node.register_prehook(pre)
            node.register_hook(post)
            return


def _close(env: Env) -> None:
    """A backward that raised inside a region's node left its kernels' scope open on this thread: closed here."""
    while getattr(_open, "n", 0) > 0:
        _open.n -= 1
        env.leave()


class Region:
    """One graph dynamo handed to inductor: compiled at its first call with the partition that fits what the
    budget leaves it then; compiled again (at most ``REPLANS`` times) when that no longer fits: what lives
    outside grew, the budget changed, or the most in use between two of its calls passed the budget."""

    def __init__(self, compile_fx: Callable[..., Any], env: Env, gm: torch.fx.GraphModule, rest: tuple,
                 kwargs: dict) -> None:
        self.compile_fx, self.env, self.gm, self.rest, self.kwargs = compile_fx, env, gm, rest, kwargs
        self.name = str(kwargs.get("compile_region_name") or f"graph {next(_MADE)}")
        self.fn: Callable[..., Any] | None = None
        self.choice: Choice | None = None  # None: compiled without a plan (no budget, or no backward)
        self.budget: int | None = None  # the budget it was planned for
        self.compiles = 0
        self.seen = 0  # the most in use during its calls and their backward since its last call (Env.mark)
        self.over: list[int] = []  # measured peaks over the budget that made it compile again
        self.measured: dict[float, int] = {}  # fraction -> the most the region was seen to add to what lived
        self.predicted: dict[float, int] = {}  # fraction -> graphmem's prediction there
        self.live = 0  # what lived outside at its last call
        self.eager_said = False
        _made[0] += 1
        REGIONS.add(self)
        env.made_region()

    def __call__(self, *args: Any) -> Any:
        for f in CALLED:
            f()
        env = self.env
        _close(env)
        if not env.active():
            if self.fn is None:
                self._compile(args, None, 0)
            assert self.fn is not None
            return self.fn(*args)
        budget = env.budget()
        seen, self.seen = self.seen, 0
        live = env.live(args) if budget is not None else 0
        c = self.choice
        if c is not None and c.fits and self.fn is not None and seen:
            # what its last call and backward added to what lived outside at that call
            self.measured[c.fraction] = max(self.measured.get(c.fraction, 0), seen - self.live)
        self.live = live
        if self.fn is None or (self.compiles <= REPLANS and self._stale(budget, live, seen)):
            self._compile(args, budget, live)
        if self.choice is not None and not self.choice.fits:
            self._say_eager()
            env.sync(args)
            return self.gm(*args)  # its ops run under the session, which keeps the budget
        env.prepare(args)
        assert self.fn is not None
        env.mark()
        env.enter()
        try:
            outs = self.fn(*args)
        finally:
            env.leave()
        self.took(env.mark())
        _bracket(self, outs)
        return outs

    def took(self, peak: int | None) -> None:
        """The most in use during one of its calls or its backward (rule 4)."""
        if peak is not None:
            self.seen = max(self.seen, peak)

    def _stale(self, budget: int | None, live: int, seen: int) -> bool:
        if budget != self.budget:
            return True
        c = self.choice
        if c is None or budget is None or not c.fits:
            return False
        if seen > budget * OVER:  # measured: its last call or backward passed the budget; plan again with it
            self.over.append(seen)
            return True
        return c.predicted > budget - live  # what lives outside grew (an optimizer's state)

    def _compile(self, args: Sequence[Any], budget: int | None, live: int) -> None:
        partitioner = None
        if budget is not None and inductor_config.custom_partitioner_fn is None:  # a user's own one is left be
            short = max((m / self.predicted[f] for f, m in self.measured.items() if self.predicted.get(f)), default=1.0)
            partitioner = BudgetPartitioner(budget - live, self.measured, short)
        if self.compiles:
            room = "no budget" if partitioner is None else f"{fmt_bytes(max(0, partitioner.allowance))} predicted"
            print(f"torch_dtr: compiling region {self.name} again for the memory the budget leaves it now ({room})",
                  file=sys.stderr, flush=True)
        _inside.on = True
        try:
            if partitioner is None:
                self.fn = self.compile_fx(self.gm, list(args), *self.rest, **self.kwargs)
            else:
                # no joint graph's partition cached from elsewhere: AOTAutograd's cache keys take a partitioner
                # without a uuid (the choice depends on the allowance) for none at all, and a hit would skip it (the
                # partitioned graphs' own cache, inductor's FX graph cache, stays: its keys are the partitions)
                with inductor_config.patch(custom_partitioner_fn=partitioner), \
                        functorch_config.patch(enable_autograd_cache=False):
                    self.fn = self.compile_fx(self.gm, list(args), *self.rest, **self.kwargs)
        finally:
            _inside.on = False
        self.compiles += 1
        self.budget = budget
        self.choice = None if partitioner is None else partitioner.choice
        if partitioner is not None:
            self.predicted.update(partitioner.predicted)

    def _say_eager(self) -> None:
        if self.eager_said:
            return
        self.eager_said = True
        c = self.choice
        assert c is not None
        warnings.warn(
            f"torch_dtr: the torch.compile region {self.name} needs {fmt_bytes(min(c.tried.values()))} at the least "
            f"(predicted) beyond what lives outside it, with compile recomputing what it can: more than the budget "
            f"leaves it ({fmt_bytes(max(0, c.allowance))}). It runs eagerly under torch-dtr, which keeps the "
            f"budget, at eager speed and with eager PyTorch's results rather than inductor's. A larger budget lets "
            f"it run compiled (NOTE [ Compiled regions under a budget ] 5).", RuntimeWarning, stacklevel=3)


def install(env: Env) -> Callable[[], None]:
    """Plan the regions inductor compiles from now on against ``env``'s budget; returns the function that stops
    (regions already made keep their plans, and plan no more once the session ended)."""
    orig = compile_fx_module.compile_fx

    def compile_fx(gm: Any, example_inputs: Any, *rest: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "on", False) or not env.active() or not isinstance(gm, torch.fx.GraphModule):
            return orig(gm, example_inputs, *rest, **kwargs)
        region = Region(orig, env, gm, rest, kwargs)
        if _symbolic(gm):
            # compiled now, inside dynamo's context, which holds its symbolic shapes; planned once
            region._compile(example_inputs, env.budget(), env.live(()))
            region.compiles = REPLANS + 1
        return region

    compile_fx_module.compile_fx = compile_fx

    def stop() -> None:
        if compile_fx_module.compile_fx is compile_fx:
            compile_fx_module.compile_fx = orig

    return stop


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether dynamo traced ``gm`` with dynamic shapes (compiled later, outside its context, it would not be)."""
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor)
                                           and any(isinstance(d, torch.SymInt) for d in v.shape)):
            return True
    return False


def plans() -> list[dict[str, Any]]:
    """Every region planned in this process that is still alive: its name, compilations and choice."""
    out = []
    for r in REGIONS:
        c = r.choice
        out.append({"region": r.name, "compiles": r.compiles, "budget": r.budget, "over_budget_peaks": list(r.over),
                    "live": r.live, "measured": dict(r.measured),
                    "fraction": None if c is None else c.fraction, "predicted": None if c is None else c.predicted,
                    "allowance": None if c is None else c.allowance, "fits": None if c is None else c.fits,
                    "tried": {} if c is None else dict(c.tried)})
    return out
