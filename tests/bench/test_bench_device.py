"""`torch-dtr bench --device sim` runs the GPU plan (budgets on the allocator's count, checkpointing, the
largest batch under a cap) on the CPU through the simulated caching allocator, and writes its report."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_device_bench_on_the_simulated_allocator_writes_a_report(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "torch_dtr.cli", "bench", "--device", "sim", "--quick", "--model", "gpt2",
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((out / "benchmarks-sim.json").read_text())
    w = res["workloads"]["gpt2"]
    by = {c["label"]: c for c in w["contenders"]}
    plain = by["plain PyTorch"]
    assert plain["max_allocated"] > 0 and plain["step_s"] > 0
    budgeted = [c for c in w["contenders"] if c["kind"] == "dtr" and c.get("budget")]
    labels = [c["label"] for c in budgeted]
    # 50% and 30% (or 1.25x the floor), each recomputing only and with the host tier; at ckpt's memory
    assert len(budgeted) == 5 and labels[:2] == ["torch-dtr 50%", "torch-dtr + host copies 50%"], labels
    for c in budgeted:
        assert c["max_allocated"] <= c["budget"], c
        if c is budgeted[-1] and c.get("error", "").startswith("BudgetError"):  # ckpt's memory may be below it
            continue
        assert "error" not in c, c["error"]
        assert c["bitwise"], f"{c['label']}: losses or parameters differ from plain PyTorch's"
    assert by["checkpoint every block"]["bitwise"] and by["torch-dtr, no budget"]["bitwise"]
    save = next(c for c in w["contenders"] if c["kind"] == "save_on_cpu")
    assert save["bitwise"] and save["max_allocated"] > 0
    scale = {s["label"]: s for s in w["scale"]}
    assert scale["plain PyTorch"]["batch"] >= 2, "plain's own peak is the cap: its base batch fits"
    assert scale["torch-dtr, no budget"]["batch"] >= scale["plain PyTorch"]["batch"]
    md = (out / "benchmarks-sim.md").read_text()
    assert md.startswith("# torch-dtr on a simulated device") and "| plain PyTorch |" in md
    assert "Largest batch under a cap" in md


def test_device_bench_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    p = subprocess.run([sys.executable, "-m", "torch_dtr.cli", "bench", "--device", "cuda", "--quick"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 2 and "no CUDA device here" in p.stderr
