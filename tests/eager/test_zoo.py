"""A zoo of real architectures (``zoo.py``: 15 Hugging Face models from configs, 6 ``torch.nn`` ones) trained
for 2 SGD steps plainly and under torch-dtr, with everything compared bitwise: losses, gradients,
parameters and buffers after the steps.

Budgets: unlimited, and ``50pct_or_1.25floor``: 50% of the unconstrained peak (constants included), or 1.25x
the model's single-op floor where that is higher (NOTE [ The single-op floor ]: below the floor no
schedule can run; issue 13's target is to train at 1.25x of it). Such a case says so in the session's list of
budgets that fell back (ViT, ConvNeXt, Swin, ResNet and nn.LSTM: their floors are 45-58% of their peaks).
"""

from __future__ import annotations

import harness
import pytest
import torch
from util import SWAPPING
from zoo import ZOO

import torch_dtr

STEPS = 2
FLOOR_MARGIN = 1.25
# Models known to fail their low budget, with the measurement (modelled costs, so the same in every run). Strict: a
# fix shows up as XPASS and fails, so the entry gets removed.
KNOWN_LOW = {
    "nn_gru": "BudgetError at 50% (1.54x the floor) while recomputing a running sum's add, with "
              "172 KiB pinned or kept (banishing at depth 2); fails at 52% too, trains at 55% (issue 13; measured "
              "2026-11-25 afternoon with the default dtr_comp; before handle-less inputs of awaited values stayed "
              "resident it failed at 55% and trained at 60%: docs/design.md)",
}
_PEAKS: dict[tuple[str, str], int] = {}  # per model and front end (their peaks differ)
_FLOORS: dict[tuple[str, str], int] = {}
_PLAIN: dict[str, harness.RunResult] = {}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _plain(name: str) -> harness.RunResult:
    if name not in _PLAIN:
        _PLAIN[name] = harness.run_plain(ZOO[name], "sgd", steps=STEPS)
    return _PLAIN[name]


def _cases():
    for budget in ("unlimited", "50pct_or_1.25floor"):
        for name in ZOO:
            marks = [pytest.mark.slow]
            yield pytest.param(name, budget, marks=marks, id=f"{budget}-{name}")


@pytest.mark.parametrize("name,budget", list(_cases()))
def test_zoo_model_trains_bitwise_plain(name, budget, request, dtr_front):
    if budget != "unlimited" and name in KNOWN_LOW and not SWAPPING and dtr_front == "python":
        # the Python front end's (the host tier trains them; the compiled front end sums gradients in place and does)
        request.applymarker(pytest.mark.xfail(strict=True, raises=torch_dtr.BudgetError, reason=KNOWN_LOW[name]))
    ref = _plain(name)
    key = (name, dtr_front)
    if budget == "unlimited" or key not in _PEAKS:
        got = harness.run_dtr(ZOO[name], "sgd", None, steps=STEPS)
        _PEAKS[key] = got.stats.peak_bytes
        _FLOORS[key] = got.stats.floor_bytes
        assert got.stats.evictions == 0
        assert 0 < got.stats.floor_bytes < got.stats.peak_bytes
    if budget != "unlimited":
        peak, floor = _PEAKS[key], _FLOORS[key]
        nbytes = max(peak // 2, int(FLOOR_MARGIN * floor))
        if nbytes > peak // 2:
            request.node.user_properties.append(
                ("budget_fallback", f"50% of the peak is below {FLOOR_MARGIN}x the single-op floor "
                                    f"({floor / peak:.0%} of the peak); ran at {nbytes / peak:.0%}"))
        got = harness.run_dtr(ZOO[name], "sgd", nbytes, steps=STEPS)
        st = got.stats
        request.node.user_properties.append(("stats", repr(st)))
        assert st.peak_bytes <= nbytes and st.evictions > 0 and st.rematerializations + st.swaps_in > 0, st
    harness.assert_same(ref, got)
    assert got.grad_types <= {torch.Tensor}
    assert not torch_dtr.enabled()
