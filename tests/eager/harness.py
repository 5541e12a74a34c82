"""Train a model from ``models.py`` for a few optimizer steps, plainly or under torch_dtr, and collect
everything that must match bit for bit: per-step losses and gradients, final parameters and buffers.

Both runs seed the global RNG identically before building the model and before every step, so dropout
draws (and anything else random) are the same; a correct runtime must replay random ops with the draws
they made the first time (NOTE [ RNG replay ] in ``torch_dtr/eager/recipe.py``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor

BUILD_SEED = 1234
STEP_SEED = 4321


@dataclass
class RunResult:
    losses: list[torch.Tensor]
    grads: list[dict[str, torch.Tensor | None]]  # per step: parameter name -> its .grad (plain clone)
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    stats: Any = None  # torch_dtr.Stats for a dtr run
    grad_types: set[type] = field(default_factory=set)  # types of p.grad seen (must be plain tensors)


def _plain(t: torch.Tensor) -> torch.Tensor:
    if type(t) is DTRTensor:
        t = torch_dtr.unwrap(t)
    return t.detach().clone()


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}")


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs)


def _train(builder, opt_name: str, steps: int, on_step=None) -> RunResult:
    dtr = torch_dtr.enabled()
    torch.manual_seed(BUILD_SEED)
    model, make_batch, loss_fn = builder()
    model.train()
    opt = make_optimizer(opt_name, model.parameters())
    names = [n for n, _ in model.named_parameters()]
    losses: list[torch.Tensor] = []
    grads: list[dict[str, torch.Tensor | None]] = []
    grad_types: set[type] = set()
    for step in range(steps):
        torch.manual_seed(STEP_SEED + step)
        inputs, targets = make_batch(step)
        opt.zero_grad(set_to_none=True)
        out = _call(model, inputs)
        loss = loss_fn(out, targets)
        del out
        loss.backward()
        losses.append(_plain(loss))
        del loss
        g = {}
        for n, p in model.named_parameters():
            if p.grad is None:
                g[n] = None
            else:
                grad_types.add(type(p.grad))
                g[n] = _plain(p.grad)
        grads.append(g)
        opt.step()
        if on_step is not None:
            on_step(step)
    assert names == list(g)
    # stats while the model and the last batch are alive: constant_bytes counts the parameters then
    st = torch_dtr.stats() if dtr else None
    for p in model.parameters():
        assert type(p) is nn.Parameter and type(p.data) is torch.Tensor, "a parameter became managed"
    params = {n: _plain(p) for n, p in model.named_parameters()}
    buffers = {n: _plain(b) for n, b in model.named_buffers()}
    return RunResult(losses, grads, params, buffers, stats=st, grad_types=grad_types)


def run_plain(builder, opt_name: str, steps: int = 3) -> RunResult:
    assert not torch_dtr.enabled()
    return _train(builder, opt_name, steps)


def run_dtr(builder, opt_name: str, budget: int | None, steps: int = 3, *, check: bool = True) -> RunResult:
    """Train under ``torch_dtr.enable(budget)``; the model is built while enabled too (its parameters must
    stay plain). ``check`` asserts the runtime's invariants after every step."""
    assert not torch_dtr.enabled()
    gc.collect()
    torch_dtr.enable(budget=budget)
    try:
        rt = torch_dtr.runtime()
        res = _train(builder, opt_name, steps, on_step=(lambda _s: rt.check()) if check else None)
        if check:
            rt.check()
    finally:
        torch_dtr.disable()
    return res


# ---------------------------------------------------------------- budgets (cached per (model, optimizer))
_PEAK: dict[tuple[str, str], Any] = {}
_MIN: dict[tuple[str, str], int] = {}


def unconstrained_stats(name: str, builder, opt_name: str):
    key = (name, opt_name)
    if key not in _PEAK:
        _PEAK[key] = run_dtr(builder, opt_name, None, check=False).stats
    return _PEAK[key]


def unconstrained_peak(builder, opt_name: str, name: str | None = None) -> int:
    """``stats().peak_bytes`` of a torch_dtr run without a budget (constants included)."""
    return unconstrained_stats(name or builder.__name__, builder, opt_name).peak_bytes


def feasible(builder, opt_name: str, budget: int) -> bool:
    try:
        run_dtr(builder, opt_name, budget, check=False)
    except torch_dtr.BudgetError:
        return False
    finally:
        gc.collect()
    return True


def min_feasible_budget(builder, opt_name: str, name: str | None = None, iters: int = 8) -> int:
    """The smallest budget (bytes) found by bisection on ``(constant_bytes, unconstrained peak]`` with which
    training runs without ``BudgetError``. A budget at or below the constants can never be feasible; the
    unconstrained peak always is."""
    key = (name or builder.__name__, opt_name)
    if key not in _MIN:
        st = unconstrained_stats(key[0], builder, opt_name)
        lo, hi = st.constant_bytes, st.peak_bytes  # lo infeasible (nothing left for a single output)
        for _ in range(iters):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            if feasible(builder, opt_name, mid):
                hi = mid
            else:
                lo = mid
        _MIN[key] = hi
    return _MIN[key]
