"""PyTorch's operator database through the compiled front end: the first float32 sample of every operator that
supports float32 on CPU, nothing evicted and everything evicted after every op, bitwise against plain PyTorch
(as tests/eager/test_conformance.py does for the Python front end); every cost the kernel models in C++ equals
the Python model's (NOTE [ Modelled costs ] 4)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from torch_dtr import native

pytest.importorskip("expecttest")
pytestmark = [pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eager"))
import conformance  # noqa: E402

OPS = conformance.ops_for(torch.float32)


def _evict_all(kind, _s):
    if kind == "op":
        rt = native.current().rt
        for s in list(rt.candidates):
            if not s.locks:
                rt.evict(s)


def check(op, sample, mode):
    try:
        want_out, want_grad = conformance._run(op, sample)
    except Exception as e:  # noqa: BLE001 - the op's own failure on this sample
        return "plain_raises", f"{type(e).__name__}: {e}"
    ext = native.load()
    ext.check_costs(True)  # every miss of the kernel's cost cache answered in C++ is compared with Python's model
    s = native.enable()
    try:
        if mode == "all_evicted":
            s.rt.listen(_evict_all)
        got_out, got_grad = conformance._run(op, sample)
        s.rt.check()
    except Exception as e:  # noqa: BLE001 - reported
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        native.disable()
        mismatch = ext.check_costs(False)
    if mismatch:
        return "differs", f"the kernel's cost model: {mismatch}"
    values = conformance.name(op) not in conformance.UNDEFINED
    close = conformance.name(op) in conformance.NONDETERMINISTIC
    if len(got_out) != len(want_out) or len(got_grad) != len(want_grad):
        return "differs", "output or gradient counts differ"
    for i, (a, b) in enumerate(zip(want_out + want_grad, got_out + got_grad, strict=True)):
        why = conformance._same(a, b, values or i >= len(want_out), close)
        if why:
            return "differs", f"value {i}: {why}"
    return "equal", ""


@pytest.mark.parametrize("op", OPS, ids=[conformance.name(o) for o in OPS])
def test_first_sample_bitwise_in_both_modes_native(op):
    bad = []
    for _, sample in conformance.samples(op, torch.float32, 1):
        for mode in conformance.MODES:
            status, detail = check(op, sample, mode)
            if status in ("differs", "raises"):
                bad.append(f"{mode}: {status}: {detail}")
    assert not bad, "; ".join(bad)
