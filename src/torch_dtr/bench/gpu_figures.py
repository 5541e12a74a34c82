"""The README's GPU figures, computed from the records of the lent GPU sessions (docs/gpu/*.json), so that a figure
and its record cannot disagree (tests/test_readme.py regenerates the paragraph and compares).

    python -m torch_dtr.bench.report --readme     # rewrites the README's CPU table and this paragraph

What it says, and from which rows: the compiled front end with the compiled core (``kind`` "native",
``compiled_core`` true) and the Python front end (``kind`` "dtr") on GPT-2 small, each a range over every session
that ran it (not the best one), with the sessions' devices and dates; checkpointing every block; and how many runs
with a budget passed it (``max_memory_allocated`` above the budget), on any workload (the records
docs/benchmarks-cuda.md lists, each run once) and under torch.distributed (docs/gpu/*-distributed*.json, one rank
each, whose budgets are in the contenders' names).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 2**20
BEGIN = "<!-- GPU figures: python -m torch_dtr.bench.report --readme -->"
END = "<!-- end of GPU figures -->"
WORKLOAD = "gpt2-small"


@dataclass(frozen=True)
class Run:
    """One contender of one session, as the figures need it."""

    record: str  # the file's name
    device: str  # "H100", "H200"
    date: str
    torch: str  # "2.11"
    workload: str
    label: str
    kind: str
    core: bool  # the compiled core
    ratio: float | None  # step time / plain's in the same session
    budget: int | None
    peak: int | None  # max_memory_allocated
    plain_peak: int | None
    bitwise: bool | None


def _device(machine: str) -> str:
    m = re.search(r"\b([AHB]\d{2,3})\b", machine)
    return m.group(1) if m else machine.split(" (")[0]


def listed(folder: Path) -> set[str] | None:
    """The bench records docs/benchmarks-cuda.md lists (it drops those of code since changed in what they measure);
    None where there is no such page beside ``folder`` (every record counts)."""
    doc = folder.parent / "benchmarks-cuda.md"
    if not doc.exists():
        return None
    return set(re.findall(r"\| docs/gpu/([\w.-]+\.json) \|", doc.read_text()))


def runs(folder: Path) -> list[Run]:
    """Every contender of every bench record in ``folder`` (sessions of ``benchmarks/gpu_session.py``) that
    docs/benchmarks-cuda.md lists; a run a record holds twice, identical, counts once."""
    out, seen = [], set()
    keep = listed(folder)
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        if not isinstance(rec, dict) or "workloads" not in rec or (keep is not None and path.name not in keep):
            continue
        machine = rec.get("machine", "")
        torch_v = re.search(r"torch (\d+\.\d+)", machine)
        for name, w in rec["workloads"].items():
            cs = w.get("contenders", [])
            cs = list(cs.values()) if isinstance(cs, dict) else cs
            plain = next((c for c in cs if c.get("kind") == "plain"), {})
            p_step = plain.get("step_s")
            for c in cs:
                step = c.get("step_s")
                key = (path.name, name, c.get("label"), step, c.get("max_allocated"))
                if key in seen:
                    continue
                seen.add(key)
                out.append(Run(path.name, _device(machine), rec.get("date", ""), torch_v.group(1) if torch_v else "?",
                               name, c.get("label", ""), c.get("kind", ""), bool(c.get("compiled_core")),
                               step / p_step if step and p_step else None, c.get("budget"), c.get("max_allocated"),
                               plain.get("max_allocated"), c.get("bitwise")))
    return out


def distributed_budgets(folder: Path) -> list[tuple[int, int]]:
    """(budget, peak) of every rank of every run under torch.distributed with a budget (docs/gpu/*distributed*.json:
    the budget is in the contender's name, "at N MiB" or "at R% of plain")."""
    out = []
    for path in sorted(folder.glob("*distributed*.json")):
        raw = json.loads(path.read_text()).get("raw", {})
        for runs_of in raw.values():
            plain = max((r["peak"] for r in runs_of.get("plain", []) if "peak" in r), default=None)
            for label, ranks in runs_of.items():
                m = re.search(r" at (\d+) MiB", label)
                p = re.search(r" at (\d+)% of plain", label)
                budget = int(m.group(1)) * MiB if m else int(plain * int(p.group(1)) / 100) if p and plain else None
                if budget is None:
                    continue
                out += [(budget, r["peak"]) for r in ranks if isinstance(r, dict) and "peak" in r]
    return out


def _range(rs: list[Run]) -> str:
    xs = [r.ratio for r in rs if r.ratio is not None]
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}x-{hi:.2f}x"


def _sessions(rs: list[Run]) -> str:
    n = len({r.record for r in rs})
    return f"{n} session{'s' if n > 1 else ''}: {', '.join(sorted({r.device for r in rs}))}"


def _pick(rs: list[Run], kind: str, core: bool | None, budget: str) -> list[Run]:
    """The GPT-2 small runs of ``kind`` (and core) that finished, at ``budget``: "none", or a share like "50%"."""
    out = []
    for r in rs:
        if r.workload != WORKLOAD or r.kind != kind or r.ratio is None or (core is not None and r.core != core):
            continue
        if "profiled" in r.label or "host copies" in r.label or "expandable off" in r.label:
            continue
        if (budget == "none" and r.budget is None and "no budget" in r.label) or (
                budget != "none" and re.search(rf"\b{budget}(?: \(|,|$)", r.label)):
            out.append(r)
    return out


def _over(budget: int | None, peak: int | None) -> float | None:
    """MiB by which ``peak`` passed ``budget``; None where it held (or either is unknown)."""
    return (peak - budget) / MiB if budget and peak is not None and peak > budget else None


def paragraph(folder: Path) -> str:
    """The README's GPU paragraph from the records in ``folder`` (docs/gpu)."""
    rs = runs(folder)
    native_none, native_half = _pick(rs, "native", True, "none"), _pick(rs, "native", True, "50%")
    py = {b: _pick(rs, "dtr", None, b) for b in ("none", "50%", "37%")}
    ckpt = [r for r in rs if r.workload == WORKLOAD and r.kind == "ckpt_block" and r.ratio and r.peak and r.plain_peak]
    if not native_none or not native_half or not all(py.values()) or not ckpt:
        raise ValueError(f"torch_dtr: the GPU records in {folder} lack a run the README quotes")
    shown = native_none + native_half + [r for v in py.values() for r in v] + ckpt
    bitwise = sum(bool(r.bitwise) for r in shown)
    held = all(r.budget is not None and _over(r.budget, r.peak) is None for r in native_half)
    c = ckpt[0]
    budgeted = [r for r in rs if r.budget and r.peak is not None]
    passed = [r for r in budgeted if _over(r.budget, r.peak) is not None]
    dist = distributed_budgets(folder)
    dist_passed = [(b, p) for b, p in dist if p > b]
    over = [_over(r.budget, r.peak) or 0.0 for r in passed] + [(p - b) / MiB for b, p in dist_passed]
    dates = sorted({r.date for r in rs})
    torch_vs = ", ".join(sorted({r.torch for r in shown}))
    return (
        f"**GPU** ({dates[0]} to {dates[-1]}, torch {torch_vs}, code changed since; "
        f"[docs/benchmarks-cuda.md](docs/benchmarks-cuda.md)), GPT-2 small (12x768, sequence 1024, batch 4, "
        f"AdamW), {'all' if bitwise == len(shown) else f'{bitwise} of {len(shown)} runs'} bitwise "
        f"equal to plain. Default (compiled front end and core): {_range(native_none)} at no budget "
        f"({_sessions(native_none)}), {_range(native_half)} at 50% ({_sessions(native_half)}), "
        f"{'within' if held else 'not always within'} the budget. Python front end: {_range(py['none'])} at no "
        f"budget, {_range(py['50%'])} at 50%, {_range(py['37%'])} at 37%. Checkpointing every block: {c.ratio:.2f}x "
        f"at {(c.peak or 0) / (c.plain_peak or 1):.0%} of plain's {(c.plain_peak or 0) / 2**30:.1f} GiB. "
        f"Budgets were passed in {len(passed)} of {len(budgeted)} budgeted bench runs (any "
        f"workload; {sum('host copies' in r.label for r in passed)} with `swap=True`) and in {len(dist_passed)} of "
        f"{len(dist)} one-rank runs under torch.distributed, by {min(over):.1f}-{max(over):.1f} MiB."
    )


def with_paragraph(readme: str, folder: Path) -> str:
    """``readme`` with the text between ``BEGIN`` and ``END`` replaced by ``paragraph(folder)``."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"the README has no lines {BEGIN!r} ... {END!r} to put the GPU figures between")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + paragraph(folder) + "\n" + END + tail


def figures(folder: Path) -> dict[str, Any]:
    """The runs behind the paragraph, for a reader checking it by hand (``--json``)."""
    return {"runs": [r.__dict__ for r in runs(folder)], "distributed": distributed_budgets(folder)}
