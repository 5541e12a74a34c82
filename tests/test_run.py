"""`torch-dtr run` (and `python -m torch_dtr`): a script trains under a budget unchanged, with the same results as
plain PyTorch, and a summary at exit; mistakes get one line and a non-zero exit; the bare command lists commands."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh()) for _ in range(16)])
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(512, 128), torch.randn(512, 128)
    for _ in range(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    torch.save([p.detach() for p in model.parameters()], sys.argv[1])
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    """
)


def _dtr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch_dtr", *args], capture_output=True, text=True, timeout=600,
                          check=False)


def _plain(tmp_path) -> object:
    """SCRIPT written to tmp_path/train.py and run plainly once (its parameters in tmp_path/plain.pt)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, str(script), str(tmp_path / "plain.pt")], capture_output=True, text=True,
                           timeout=600, check=False)
    assert plain.returncode == 0, plain.stderr
    return script


def _mib(text: str, what: str) -> float:
    m = re.search(what + r" ([\d.]+) (KiB|MiB)", text)
    assert m, text
    return float(m.group(1)) * (1 if m.group(2) == "MiB" else 1 / 1024)


def test_a_script_trains_unchanged_and_bitwise_at_the_budget_its_run_without_one_printed(tmp_path):
    script = _plain(tmp_path)
    free = _dtr("run", str(script), str(tmp_path / "free.pt"))
    assert free.returncode == 0, free.stderr
    peak = _mib(free.stderr, "tracked peak")
    m = re.search(r"learned budget .*, at which its first 2 optimizer steps replay: torch-dtr run --budget (\d+) ",
                  free.stderr)
    assert m, free.stderr
    budget = m.group(1)
    assert int(budget) < peak * 2**20 * 0.8, (budget, peak)
    p = _dtr("run", "--budget", budget, str(script), str(tmp_path / "dtr.pt"))
    assert p.returncode == 0, p.stderr
    evictions = int(re.search(r"(\d+) evictions", p.stderr).group(1))
    assert evictions > 0 and _mib(p.stderr, "tracked peak") <= int(budget) / 2**20 + 0.005, p.stderr  # (2 decimals)
    want, got = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "dtr.pt")
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert _dtr("run", "--budget", budget, str(script), str(tmp_path / "x.pt"), "3").returncode == 3  # its exit code


def test_device_cpu_bounds_all_cpu_tensor_memory_at_75_of_its_count_bitwise(tmp_path):
    script = _plain(tmp_path)
    free = _dtr("run", "--device", "cpu", str(script), str(tmp_path / "free.pt"))
    assert free.returncode == 0, free.stderr
    whole = _mib(free.stderr, r"peak \(all CPU tensor memory\)")
    tracked = _mib(_dtr("run", str(script), str(tmp_path / "t.pt")).stderr, "tracked peak")
    assert whole > tracked  # AdamW's moments and the gradients are counted too
    budget = int(whole * 0.75 * 2**20)
    p = _dtr("run", "--budget", str(budget), "--device", "cpu", str(script), str(tmp_path / "dtr.pt"))
    assert p.returncode == 0, p.stderr
    assert int(re.search(r"(\d+) evictions", p.stderr).group(1)) > 0
    want, got = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "dtr.pt")
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    p = _dtr("run", "--device", "gpu", str(script))
    assert p.returncode == 2 and "invalid choice: 'gpu'" in p.stderr


def test_mistakes_get_one_line_and_a_budget_error_its_message(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    p = _dtr("run", str(tmp_path / "missing.py"))
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no script" in p.stderr
    p = _dtr("run", "--budget", "lots", str(script), str(tmp_path / "x.pt"))
    assert p.returncode == 2 and "cannot read budget 'lots'" in p.stderr and "Traceback" not in p.stderr
    p = _dtr("run", "--policy", "nope", str(script))
    assert p.returncode == 2 and "unknown policy 'nope'" in p.stderr
    p = _dtr("run", "--budget", "64KiB", str(script), str(tmp_path / "x.pt"))
    assert p.returncode == 1 and "cannot be kept" in p.stderr and "Traceback" not in p.stderr
    assert re.search(r"Budget to try: .*: torch-dtr run --budget \d+ \S*train.py", p.stderr), p.stderr
    assert "learned budget" not in p.stderr  # (a run cut short by a BudgetError learns nothing whole)


@pytest.mark.parametrize("args", [[], ["--version"]])
def test_the_bare_command_lists_what_it_does(args):
    p = _dtr(*args)
    assert p.returncode == 0, p.stderr
    if args:
        assert re.match(r"torch-dtr \d+\.\d+\.\d+ \(torch ", p.stdout)
    else:
        assert all(c in p.stdout for c in ("run", "record", "simulate", "bench", "demo"))
