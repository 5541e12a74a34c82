"""`torch-dtr demo` (the README's main job) runs end to end: plain PyTorch and torch-dtr train GPT-2 to the
same losses, the budgeted run stays within its budget, and the table is printed."""

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_trains_under_a_budget_with_plain_pytorchs_losses():
    cmd = [sys.executable, "-m", "torch_dtr.cli", "demo", "--steps", "1", "--ratios", "0.5"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]  # exit 1 means the losses differed
    rows = {line.split("  ")[0]: line for line in p.stdout.splitlines()
            if line.startswith(("plain PyTorch", "torch-dtr,"))}
    assert set(rows) == {"plain PyTorch", "torch-dtr, no budget", "torch-dtr, 50% of peak"}, p.stdout
    budgeted = rows["torch-dtr, 50% of peak"].split()
    assert budgeted[-1] == "yes" and int(budgeted[-3]) > 0  # same losses; evictions happened
    sizes = re.findall(r"([\d.]+) (KiB|MiB|GiB)", rows["torch-dtr, 50% of peak"])
    budget, tracked = (float(v) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[u] for v, u in sizes[:2])
    assert tracked <= budget
