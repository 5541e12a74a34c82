"""The README and the docs stay honest: the README's Python blocks run as written (the quick start at its
tiny size; a block for CUDA where there is one), and every relative link in README.md, benchmarks/README.md
and docs/*.md names a file that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 2, "the quick start and the GPU block"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_runs(i: int) -> None:
    # the blocks run in one process, in order, as a reader pastes them; each block must end with the session
    # disabled. A block that uses CUDA runs its CUDA part only where CUDA is (it is guarded by is_available)
    code = "\n".join(BLOCKS[: i + 1]).replace("    ...", "    pass")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       check=False)
    assert p.returncode == 0, f"README block {i + 1} failed:\n{BLOCKS[i]}\n{p.stderr[-2000:]}"
    if "cuda" in BLOCKS[i] and not torch.cuda.is_available():
        pytest.skip("ran; its CUDA part needs a CUDA device")


def test_the_quick_starts_budget_is_about_half_its_peak() -> None:
    """What its comment says: the quick start run without a budget (its own code, the budget taken out) peaks
    at about twice "3MiB" (measured 2026-11-29: 6.26 MiB, so 3 MiB is 48% of it)."""
    block = BLOCKS[0]
    assert 'budget="3MiB"' in block and "half this program's peak" in block
    code = block.replace('budget="3MiB"', "budget=None").replace(
        "assert stats.peak_bytes <= stats.budget_bytes and stats.rematerializations > 0", "print(stats.peak_bytes)")
    assert "print(stats.peak_bytes)" in code
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    peak = int(p.stdout.split()[-1])
    assert 0.4 <= 3 * 2**20 / peak <= 0.6, f"3 MiB is {3 * 2**20 / peak:.0%} of the peak without a budget ({peak} B)"


def _links(path: Path) -> list[str]:
    text = path.read_text()
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", m) and not m.startswith("#")]


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path: Path) -> None:
    broken = [link for link in _links(path) if not (path.parent / link.split("#")[0]).exists()]
    assert not broken, f"{path.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_readme_is_short_and_has_no_history() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 8192, f"README.md is {len(text.encode())} bytes; keep it under 8 KB"
    assert not re.search(r"\bissue \d+", text, re.I), "issue numbers belong in the issue tracker"


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_no_doc_is_over_25_kb(path: Path) -> None:
    n = len(path.read_bytes())
    assert n < 25_000, f"docs/{path.name} is {n} bytes; keep every doc under 25 KB (history belongs in git)"


def test_design_doc_is_short_and_has_no_history() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    assert len(text.encode()) < 20_000, f"docs/design.md is {len(text.encode())} bytes; keep it under 20 KB"
    assert not re.search(r"\bissue \d+", text, re.I), "issue numbers belong in the issue tracker"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated history belongs in docs/decisions.md"


def test_the_readme_cpu_table_is_its_record() -> None:
    """Issue 55: the README's CPU figures are computed from the bench's committed record (docs/benchmarks.json) by
    ``python -m torch_dtr.bench.report --readme``; a hand edit, or a record rerun without regenerating, fails here."""
    import json

    from torch_dtr.bench.report import readme_with_table

    record = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    text = (ROOT / "README.md").read_text()
    assert readme_with_table(text, record) == text, "run: python -m torch_dtr.bench.report --readme"
    assert f"torch {record['machine'].split('torch ')[1][:4]}, {record['date']}" in text, "the table's conditions"


def test_the_readme_gpu_figures_are_their_records() -> None:
    """The README's GPU paragraph is computed from the lent sessions' records (docs/gpu/*.json) by
    ``python -m torch_dtr.bench.report --readme``: ranges over every session that ran a contender (not the best
    one), and how many budgeted runs passed their budget; a hand edit or a new record fails here."""
    from torch_dtr.bench.gpu_figures import BEGIN, END, paragraph, with_paragraph

    text = (ROOT / "README.md").read_text()
    assert with_paragraph(text, ROOT / "docs" / "gpu") == text, "run: python -m torch_dtr.bench.report --readme"
    said = text.split(BEGIN)[1].split(END)[0]
    assert "passed" in said and "1.00x" in said, said  # the budgets passed are said, and the default's best is in range
    assert paragraph(ROOT / "docs" / "gpu") in said


def test_gpu_figures_count_a_passed_budget(tmp_path: Path) -> None:
    """A record whose run passed its budget is counted as passed, with its excess, and a range covers every
    session: the paragraph cannot show only the best run or hide a budget passed."""
    import json
    import shutil

    from torch_dtr.bench.gpu_figures import paragraph

    src = ROOT / "docs" / "gpu"
    for f in src.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    before = paragraph(tmp_path)
    rec = json.loads((src / "h100-2026-11-27-native-6.json").read_text())
    for c in rec["workloads"]["gpt2-small"]["contenders"]:
        if c["label"] == "torch-dtr native 50%, compiled core":
            c["max_allocated"] = c["budget"] + 5000 * 2**20  # 5,000 MiB over
            c["step_s"] *= 3
    (tmp_path / "h100-2099-01-01-native-9.json").write_text(json.dumps(rec))
    after = paragraph(tmp_path)
    assert after != before
    assert "not always within the budget" in after and "5000.0 MiB" in after
    assert "(4 sessions: H100, H200)" in after


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_distributed_reports_are_their_records(tmp_path: Path, device: str) -> None:
    """docs/distributed.md and docs/distributed-cuda.md are rendered from their records (docs/distributed.json; the
    GPU record the CUDA report names) by ``benchmarks/distributed.py --report-only``, budget held column included:
    a hand edit, or a record rerun without rewriting the report, fails here."""
    import shutil

    name = "distributed-cuda.md" if device == "cuda" else "distributed.md"
    shutil.copy(ROOT / "docs" / name, tmp_path / name)
    shutil.copy(ROOT / "docs" / "distributed.json", tmp_path / "distributed.json")
    subprocess.run([sys.executable, "benchmarks/distributed.py", "--report-only", "--device", device, "--out",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    assert (tmp_path / name).read_text() == (ROOT / "docs" / name).read_text(), \
        f"run: python benchmarks/distributed.py --report-only --device {device}"
    if device == "cuda":  # the budgets the host tier passed are said, with their excess
        assert "NO, +22.2 MiB" in (tmp_path / name).read_text()
