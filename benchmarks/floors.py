"""Smallest feasible budgets against the single-op floor (issue 13's target: <= 1.25x), per test model.

    python benchmarks/floors.py [--opt sgd] [--models mlp cnn ...] [--policy P] [--banish N]
                                [--out docs/floors.md]

For each model of ``tests/eager/models.py`` (3 training steps, the equivalence tests' harness, one intra-op
thread): the unconstrained tracked peak, the single-op floor of that run (NOTE [ The single-op floor ]:
constants and pinned storages plus the largest op's inputs and outputs), and the smallest feasible budget
found by the tests' bisection (``harness.min_feasible_budget``: no BudgetError and at most 4 recomputations
per op, confirmed twice; 8 halvings or 1% of the peak). Then a second table: the recomputations of the same 3
steps at fixed budgets (25% to 70% of each model's peak; ``-``: BudgetError), where a change that saves
recomputation away from the smallest budget shows. Writes Markdown; takes a few minutes.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "eager"
KEEP = "<!-- kept by floors.py: written by hand from here -->"


GRID = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)


def _remats(harness, builder, opt: str, budget: int) -> str:
    import torch_dtr  # noqa: PLC0415

    try:
        return str(harness.run_dtr(builder, opt, budget, check=False).stats.rematerializations)
    except torch_dtr.BudgetError:
        return "-"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--policy", default=None, help="eviction policy (default: the library's default)")
    ap.add_argument("--banish", type=int, default=None, help="enable(banish_depth=...); 0: never banish "
                    "(default: the library's default)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "floors.md"))
    a = ap.parse_args()
    sys.path.insert(0, str(TESTS))
    import harness  # noqa: PLC0415 (lives in tests/eager)
    import models  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    harness.POLICY = a.policy
    harness.BANISH = a.banish
    from torch_dtr.core.policies import DEFAULT_POLICY  # noqa: PLC0415
    from torch_dtr.eager.front import DEFAULT_BANISH_DEPTH  # noqa: PLC0415
    policy = a.policy or DEFAULT_POLICY
    banish = DEFAULT_BANISH_DEPTH if a.banish is None else a.banish
    rows = []
    grid: dict[str, list[str]] = {}
    for name in a.models or list(models.BUILDERS):
        t0 = time.perf_counter()
        b = models.BUILDERS[name]
        st = harness.unconstrained_stats(b, a.opt)
        low = harness.min_feasible_budget(b, a.opt)
        peak, floor = st.peak_bytes, st.floor_bytes
        rows.append((name, peak, floor, low, st.floor_op))
        grid[name] = [_remats(harness, b, a.opt, int(r * peak)) for r in GRID]
        print(f"{name}: peak {peak} floor {floor} ({floor / peak:.0%}) smallest {low} ({low / peak:.0%}, "
              f"{low / floor:.2f}x floor); recomputations at {', '.join(f'{r:.0%}' for r in GRID)}: "
              f"{' '.join(grid[name])} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    lines = [
        "# Smallest feasible budgets and the single-op floor",
        "",
        f"Written by `python benchmarks/floors.py --opt {a.opt} --policy {policy} --banish {banish}` on "
        f"{datetime.date.today()} (2 CPU cores, one intra-op thread, modelled costs, policy {policy}, "
        f"banish_depth={banish}). Budgets count constants. The floor is a "
        "lower bound for any schedule; issue 13's target is a smallest feasible budget <= 1.25x of it.",
        "",
        "| model | peak (KiB) | single-op floor (KiB) | floor / peak | smallest feasible / peak | "
        "smallest / floor | target met | op setting the floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, peak, floor, low, op in rows:
        lines.append(f"| {name} | {peak / 1024:.0f} | {floor / 1024:.0f} | {floor / peak:.0%} | {low / peak:.0%} | "
                     f"{low / floor:.2f}x | {'yes' if low <= 1.25 * floor else 'no'} | `{op}` |")
    lines += ["", "Recomputations over the 3 steps at fixed budgets (fractions of each model's peak; `-`: "
              "BudgetError). Modelled costs: the same in every run.", "",
              "| model | " + " | ".join(f"{r:.0%}" for r in GRID) + " |", "| --- " * (len(GRID) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in grid.items()]
    out = Path(a.out)
    old = out.read_text() if out.exists() else ""
    kept = old[old.index(KEEP):] if KEEP in old else ""  # comparisons written by hand stay
    out.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
