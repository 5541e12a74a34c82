"""Train a model from ``models.py`` for a few optimizer steps, plainly or under torch_dtr, and collect
everything that must match bit for bit: per-step losses and gradients, final parameters and buffers.

Both runs seed the global RNG identically before building the model and before every step, so dropout
draws (and anything else random) are the same; a correct runtime must replay random ops with the draws
they made the first time (NOTE [ RNG replay ] in ``torch_dtr/eager/recipe.py``).
"""

from __future__ import annotations

import gc
import os
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
    # most bytes over the budget seen right after a rematerialization allocated its outputs (dtr runs)
    remat_overshoot: int = 0


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
    for n, b in model.named_buffers():
        assert type(b) is torch.Tensor, f"buffer {n} became managed"
    params = {n: _plain(p) for n, p in model.named_parameters()}
    buffers = {n: _plain(b) for n, b in model.named_buffers()}
    return RunResult(losses, grads, params, buffers, stats=st, grad_types=grad_types)


def run_plain(builder, opt_name: str, steps: int = 3) -> RunResult:
    assert not torch_dtr.enabled()
    return _train(builder, opt_name, steps)


class TooMuchRecomputation(RuntimeError):
    """A run passed its cap on rematerializations (the policy is thrashing at this budget)."""


POLICY = None  # enable(policy=...) of every run; None: the default (benchmarks/floors.py --policy compares)
BANISH = None  # enable(banish_depth=...) of every run; None: the default (benchmarks/floors.py --banish compares)
SWAP: dict = {}  # enable(swap=..., host_budget=..., swap_gbps=...) of every run (DTR_TEST_SWAP=1: conftest.py)


def run_dtr(builder, opt_name: str, budget: int | None, steps: int = 3, *, check: bool = True,
            max_remats: int | None = None, costs: str = "model") -> RunResult:
    """Train under ``torch_dtr.enable(budget)``. The model is built while enabled (its parameters must stay
    plain).

    ``check`` runs ``runtime().check()`` (the runtime's invariants, peak <= budget included) after every step;
    ``remat_overshoot`` records by how much tracked bytes ever passed the budget right after a
    rematerialization (0 unless the runtime has a bug). ``max_remats`` aborts the run
    with ``TooMuchRecomputation`` once that many recipes have been run again."""
    assert not torch_dtr.enabled()
    gc.collect()
    torch_dtr.enable(budget=budget, costs=costs, **({"policy": POLICY} if POLICY else {}),
                     **({} if BANISH is None else {"banish_depth": BANISH}), **SWAP)
    over = [0]
    try:
        rt = torch_dtr.runtime()

        def on_event(kind: str, _s, rt=rt) -> None:
            if kind != "remat" and kind != "swapin":
                return
            if budget is not None and rt.memory.tracked > budget:
                over[0] = max(over[0], rt.memory.tracked - budget)
            if max_remats is not None and rt.rematerializations > max_remats:
                raise TooMuchRecomputation(f"more than {max_remats} rematerializations at budget {budget} B")

        torch_dtr.listen(on_event)

        def check_now(_step: int = -1) -> None:
            rt.check()

        res = _train(builder, opt_name, steps, on_step=check_now if check else None)
        if check:
            check_now()
    finally:
        torch_dtr.disable()
        gc.collect()
    res.remat_overshoot = over[0]
    return res


# ---------------------------------------------------------------- budgets (cached per (model, optimizer))
#
# The eviction policy scores candidates with measured op times, so which storages get evicted varies a
# little from run to run. Far from the minimal budget that changes nothing that matters here; near it, a
# budget that trained once may raise BudgetError (or thrash) the next time. At low budgets some models
# (the recurrences lstm_loop and tree_rnn) also thrash: nearly every eviction is rematerialized soon after
# and a step takes tens of seconds. So "feasible" below means: trains for the given steps without
# BudgetError and with at most REMAT_CAP_PER_OP rematerializations per op of the unconstrained run.

REMAT_CAP_PER_OP = 4
# The outcome near the minimum can be bimodal: the tree RNN with Adam at 30% of its peak trains with ~400
# rematerializations in some runs and thrashes past the cap in others (CI: the 30% case trained once, that
# lucky budget became the bisection's upper end, and 1.0, 1.1 and 1.25 of it then all thrashed). So the
# bisection calls a budget feasible only once it has trained CONFIRM times and never failed, and any
# failure seen at a budget makes it (and everything below) a lower bound.
CONFIRM = 2
# budgets tried, relative to the requested one, when a run near the minimum fails. Seen in CI on the MLP with
# Adam (minimum ~53% of the peak, set by one large op whose locked inputs and outputs must fit together):
# 1.0, 1.05 and 1.10 of a lucky minimum all failed in a row; hence the confirmation above and a ladder to 1.5.
LADDER = (1.0, 1.10, 1.25, 1.5)
SEARCH_ITERS = 8
SEARCH_TOLERANCE = 0.01  # stop bisecting when the bracket is narrower than this fraction of the peak

_PEAK: dict[tuple[str, str, str], Any] = {}
_MIN: dict[tuple[str, str, str], int] = {}
# outcomes of every run made through here, per (model, optimizer, front end): budget -> [trained, failed]
_OUTCOMES: dict[tuple[str, str, str], dict[int, list[int]]] = {}


def _key(builder, opt_name: str) -> tuple[str, str, str]:
    # per front end (conftest.py's NOTE [ One behavioural suite ]): their peaks differ (gradients summed in place)
    return (builder.__name__, opt_name, os.environ.get("TORCH_DTR_FRONT", "default"))


def unconstrained_stats(builder, opt_name: str):
    """Stats of a torch_dtr run with ``budget=None`` (cached): peak_bytes, constant_bytes, ops..."""
    key = _key(builder, opt_name)
    if key not in _PEAK:
        _PEAK[key] = run_dtr(builder, opt_name, None, check=False).stats
    return _PEAK[key]


def unconstrained_peak(builder, opt_name: str) -> int:
    """``stats().peak_bytes`` of a torch_dtr run without a budget (constants included)."""
    return unconstrained_stats(builder, opt_name).peak_bytes


def remat_cap(builder, opt_name: str) -> int:
    return REMAT_CAP_PER_OP * unconstrained_stats(builder, opt_name).ops


def try_budget(builder, opt_name: str, budget: int, *, check: bool = True) -> RunResult | None:
    """``run_dtr`` under the rematerialization cap; ``None`` when the budget is not feasible. Remembers the
    outcome to narrow later searches."""
    seen = _OUTCOMES.setdefault(_key(builder, opt_name), {}).setdefault(budget, [0, 0])
    try:
        res = run_dtr(builder, opt_name, budget, check=check, max_remats=remat_cap(builder, opt_name))
    except (torch_dtr.BudgetError, TooMuchRecomputation):
        seen[1] += 1
        return None
    seen[0] += 1
    return res


def feasible(builder, opt_name: str, budget: int) -> bool:
    """Trained ``CONFIRM`` times at ``budget`` (earlier runs count) and never failed there."""
    seen = _OUTCOMES.get(_key(builder, opt_name), {}).get(budget, [0, 0])
    while seen[1] == 0 and seen[0] < CONFIRM:
        try_budget(builder, opt_name, budget, check=False)
        seen = _OUTCOMES[_key(builder, opt_name)][budget]
    return seen[1] == 0


def min_feasible_budget(builder, opt_name: str, iters: int = SEARCH_ITERS) -> int:
    """The smallest feasible budget (bytes, see above) found by bisection (cached).

    The bracket starts at ``(constant_bytes, unconstrained peak]`` (the constants alone fill a budget of
    ``constant_bytes``, so it is never feasible; the peak always is), narrowed by the outcomes of earlier
    runs at other budgets (a budget that ever failed is a lower end; one confirmed feasible, an upper end),
    and is halved at most ``iters`` times or until it is narrower than
    ``SEARCH_TOLERANCE`` of the peak."""
    key = _key(builder, opt_name)
    if key not in _MIN:
        st = unconstrained_stats(builder, opt_name)
        seen = _OUTCOMES.get(key, {})
        lo = max([st.constant_bytes, *(b for b, (_, bad) in seen.items() if bad)])
        hi = min([st.peak_bytes, *(b for b, (good, bad) in seen.items() if b > lo and good >= CONFIRM and not bad)])
        for _ in range(iters):
            if hi - lo <= max(1, SEARCH_TOLERANCE * st.peak_bytes):
                break
            mid = (lo + hi) // 2
            if feasible(builder, opt_name, mid):
                hi = mid
            else:
                lo = mid
        _MIN[key] = hi
    return _MIN[key]


def run_dtr_near(builder, opt_name: str, budget: int, ladder=LADDER) -> tuple[int, RunResult]:
    """Train at ``budget``; if it is not feasible this time (run-to-run variation near the minimum, see
    above), try the next budget of ``ladder``. Returns the budget used and the result."""
    tried = []
    for f in ladder:
        b = int(budget * f)
        res = try_budget(builder, opt_name, b)
        if res is not None:
            return b, res
        tried.append(b)
    raise torch_dtr.BudgetError(f"torch_dtr: none of the budgets {tried} B was feasible (see harness.py)")


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
    if a.is_floating_point():
        return f"max |diff| {(a.double() - b.double()).abs().max().item():.3g}"
    return f"{(a != b).sum().item()} elements differ"


def assert_same(ref: RunResult, got: RunResult) -> None:
    """Losses, every gradient of every step, parameters and buffers after the steps: all equal."""
    bad: list[str] = []
    for i, (a, b) in enumerate(zip(ref.losses, got.losses, strict=True)):
        if not torch.equal(a, b):
            bad.append(f"loss of step {i}: {a.item()!r} vs {b.item()!r}")
    for i, (ga, gb) in enumerate(zip(ref.grads, got.grads, strict=True)):
        assert list(ga) == list(gb)
        for n in ga:
            a, b = ga[n], gb[n]
            if (a is None) != (b is None):
                bad.append(f"grad of {n} at step {i}: {a is None=} {b is None=}")
            elif a is not None and not torch.equal(a, b):
                bad.append(f"grad of {n} at step {i}: {_diff(a, b)}")
    for what, da, db in (("parameter", ref.params, got.params), ("buffer", ref.buffers, got.buffers)):
        assert list(da) == list(db)
        for n in da:
            if not torch.equal(da[n], db[n]):
                bad.append(f"{what} {n} after the steps: {_diff(da[n], db[n])}")
    assert not bad, f"{len(bad)} mismatches with plain PyTorch:\n  " + "\n  ".join(bad[:25])
