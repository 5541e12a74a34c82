"""A zoo of real architectures (``zoo.py``: 15 Hugging Face models from configs, 6 ``torch.nn`` ones) trained
for 2 SGD steps plainly and under torch-dtr, unlimited and at 50% of the unconstrained peak (constants
included), with everything compared bitwise: losses, gradients, parameters and buffers after the steps."""

from __future__ import annotations

import harness
import pytest
import torch
from zoo import ZOO

import torch_dtr

STEPS = 2
# 50% of the peak fails with BudgetError (2026-11-23, modelled costs, so the same in every run): the bytes
# locked while an op and the recomputations of its evicted inputs run, plus the constants, exceed half the
# peak at these small sizes. That is issue 13 (bounded-memory rematerialization, the single-op floor), not an
# equivalence problem. Strict: a fix shows up as XPASS and fails, so the entry gets removed.
_LOCKED = "BudgetError at 50%: {}; locks of the op and its recomputations (issue 13)"
KNOWN_LOW = {
    "ViTForImageClassification": _LOCKED.format("gelu_backward needs 128 KiB with 256 KiB locked, 159 KiB constants"),
    "ConvNextForImageClassification": _LOCKED.format("recomputing batch norm, 96 KiB locked, 135 KiB constants"),
    "ResNetForImageClassification": _LOCKED.format("recomputing batch norm near the stem"),
    "nn_lstm": _LOCKED.format("mkldnn_rnn_layer_backward reads 598 KiB of workspace and outputs"),
    "nn_gru": _LOCKED.format("recomputing unsafe_split with 289 KiB locked"),
    "nn_sdpa": _LOCKED.format("416 KiB locked recomputing a mul"),
}
_PEAKS: dict[str, int] = {}
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
    for budget in ("unlimited", "50pct"):
        for name in ZOO:
            marks = [pytest.mark.slow]
            if budget == "50pct" and name in KNOWN_LOW:
                marks.append(pytest.mark.xfail(strict=True, raises=torch_dtr.BudgetError, reason=KNOWN_LOW[name]))
            yield pytest.param(name, budget, marks=marks, id=f"{budget}-{name}")


@pytest.mark.parametrize("name,budget", list(_cases()))
def test_zoo_model_trains_bitwise_plain(name, budget, request):
    ref = _plain(name)
    if budget == "unlimited" or name not in _PEAKS:
        got = harness.run_dtr(ZOO[name], "sgd", None, steps=STEPS)
        _PEAKS[name] = got.stats.peak_bytes
        assert got.stats.evictions == 0
    if budget == "50pct":
        nbytes = _PEAKS[name] // 2
        got = harness.run_dtr(ZOO[name], "sgd", nbytes, steps=STEPS)
        st = got.stats
        request.node.user_properties.append(("stats", repr(st)))
        assert st.peak_bytes <= nbytes and st.evictions > 0 and st.rematerializations > 0, st
    harness.assert_same(ref, got)
    assert got.grad_types <= {torch.Tensor}
    assert not torch_dtr.enabled()
