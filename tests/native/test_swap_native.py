"""The native front end's host tier (NOTE [ Native front end ] 6) against plain PyTorch and the Python front end.

Both front ends run each program with ``swap=True`` at the budgets the test names say (fractions of the peak
each measured without a budget); the core decides for both, with the same modelled costs, so evictions,
recomputations and copies out and back must be equal, and results plain PyTorch's bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from test_native import PROGRAMS, _off, _runner  # noqa: F401 (_off: the autouse fixture)
from test_native import _outcomes as _front_outcomes

from torch_dtr import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here")


KEYS = ("evictions", "rematerializations", "swaps_out", "swaps_in", "host_peak_bytes", "peak_bytes")


def _outcomes(step, front, fracs, **tier):
    return _front_outcomes(step, front, fracs, KEYS, swap=True, **tier)[1]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_swapping_is_bitwise_and_decides_as_the_python_front_end_at_70_50_35(name):
    step = _runner(PROGRAMS[name])
    ref = step()
    fracs = (0.7, 0.5, 0.35)
    py = _outcomes(step, "python", fracs)
    nat = _outcomes(step, "native", fracs)
    for frac in fracs:
        assert nat[frac][0] == py[frac][0], (frac, nat[frac], py[frac][0])
        if nat[frac][0] != "ok":
            assert nat[frac][1] == py[frac][1]
            continue
        _, result, counts, budget = nat[frac]
        assert all(torch.equal(a, b) for a, b in zip(ref, result, strict=True)), f"values differ at {frac}"
        named = {front: dict(zip(KEYS, c, strict=True)) for front, c in (("native", counts), ("python", py[frac][2]))}
        assert counts == py[frac][2], f"decisions differ at {frac}: {named}"
        assert counts[-1] <= budget
    assert any(nat[f][0] == "ok" and nat[f][2][2] > 0 for f in fracs), "nothing was copied out: it tested nothing"


def test_values_come_back_by_copy_with_a_host_budget_of_their_size():
    """A program whose values are copied out and back (no recomputation needed), then a host budget of a quarter
    of those copies: fewer copies, more recomputations, the same values."""
    step = _runner(PROGRAMS["lstm_loop"])
    ref = step()
    native.enable()
    step()
    peak = native.stats()["peak_bytes"]
    native.disable()
    runs = {}
    for host in (None, 8 << 10):  # at 80% (at 70% a tier this small makes both front ends raise: decisions.md)
        native.enable(int(peak * 0.8), swap=True, host_budget=host)
        result = step()
        s = native.stats()
        native.disable()
        assert all(torch.equal(a, b) for a, b in zip(ref, result, strict=True)), host
        assert s["peak_bytes"] <= s["budget_bytes"]
        if host is not None:
            assert s["host_peak_bytes"] <= host
        runs[host] = s
    roomy, tight = runs[None], runs[8 << 10]
    assert roomy["swaps_out"] > 0 and roomy["swaps_in"] > 0
    assert tight["swaps_out"] < roomy["swaps_out"]
    assert roomy["rematerializations"] == 0 < tight["rematerializations"]


def test_a_swapped_value_read_by_the_program_comes_back_bitwise():
    """Values the program holds (not only recipes' inputs) swapped out under a budget, then read by ops and by
    the program (``.tolist()`` after an op): the bytes that come back are the bytes that left."""
    torch.manual_seed(0)
    xs = [torch.randn(64, 64) for _ in range(12)]
    ref = [(x.sin() * 2).sum().item() for x in xs]
    one = 64 * 64 * 4
    native.enable(one * (12 + 2 + 5), swap=True)  # the inputs (constants), an op's input and output, five more
    try:
        with torch.no_grad():  # (inference: fresh ops on plain inputs are managed)
            held = [x.sin() * 2 for x in xs]  # twelve results, room for five: the oldest go out
            out = [h.sum().item() for h in held]
        s = native.stats()
    finally:
        native.disable()
    assert out == ref
    assert s["swaps_out"] > 0 and s["swaps_in"] > 0, s
    assert s["rematerializations"] == 0, s
    assert s["peak_bytes"] <= s["budget_bytes"]


def test_bad_tier_arguments_say_what_was_wrong():
    with pytest.raises(ValueError, match="swap must be True, False or 'auto'"):
        native.enable(swap="yes")
    with pytest.raises(ValueError, match="host_budget and swap_gbps set the host tier, which is off"):
        native.enable(host_budget="1GiB")
    with pytest.raises(ValueError, match="swap_gbps must be a bandwidth"):
        native.enable(swap=True, swap_gbps=0)
    assert native.current() is None or not native.current().active


def test_the_bench_worker_runs_native_contenders_with_the_host_tier_as_the_python_ones_at_80():
    """``benchmarks/swap_live.py``'s contenders (bench worker, quick LSTM loop, three AdamW steps): plain's losses
    bit for bit, and the same evictions and copies from both front ends."""
    from torch_dtr.bench import worker, workloads

    common = {"workload": "lstm", "size": workloads.SIZES["lstm"]["quick"].__dict__, "warmup": 1, "steps": 2,
              "threads": 1, "label": "test"}
    threads = torch.get_num_threads()  # (the worker sets its own)
    try:
        plain = worker.run(common | {"kind": "plain"})
        out = {}
        for front in ("python", "native"):
            r = worker.run(common | {"kind": "dtr", "budget": int(0.8 * plain["peak_tracked"]), "swap": True,
                                     "front": front})
            assert "error" not in r, r
            assert r["losses"] == plain["losses"], front
            out[front] = (r["evictions"], r["remats"], r["swaps_in"], r["peak_tracked"])
    finally:
        torch.set_num_threads(threads)
    assert out["native"] == out["python"]
    assert out["native"][2] > 0, "nothing was copied back: it tested nothing"
