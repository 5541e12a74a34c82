"""`torch-dtr bench --quick` writes a well-formed report and plots (the timings themselves are not checked)."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quick_bench_writes_report_and_plots(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "torch_dtr.cli", "bench", "--quick", "--model", "gpt2", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    md = (out / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks")
    assert "## gpt2:" in md and "torch-dtr bench --quick --model gpt2" in md
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    header = next(r for r in rows if r.startswith("| contender"))
    ncols = header.count("|")
    table = [r for r in rows[rows.index(header) + 2:] if r.count("|") == ncols]
    labels = [r.split("|")[1].strip() for r in table]
    assert "plain PyTorch" in labels and "torch-dtr 100%" in labels and "checkpoint every block" in labels
    plain = table[labels.index("plain PyTorch")]
    assert plain.split("|")[4].strip() == "1.00x"  # the ratio column of the reference
    results = json.loads((out / "benchmarks.json").read_text())
    w = results["workloads"]["gpt2"]
    assert w["search"]["peak_tracked"] > 0 and 0 < w["search"]["min_ratio"] <= 1
    assert w["contenders"]["plain PyTorch"]["step_s"] > 0
    for kind in ("timeline", "frontier"):
        png = out / "img" / f"bench_gpt2_{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
        assert f"img/bench_gpt2_{kind}.png" in md
