"""Modelled vs measured recomputation costs on the tests' models: outcome and counters of repeated runs.

    python benchmarks/experiments/costs_ab.py [--models tree_rnn mlp lstm_loop] [--fractions 0.3 0.4 0.5] [--runs 2]

Each model of ``tests/eager/models.py`` trains 3 steps with Adam (the equivalence tests' harness, one
intra-op thread) at each fraction of its unconstrained peak, ``--runs`` times with ``costs="model"`` and as
many with ``costs="time"``, in this process. Prints per run: (evictions, recomputations, peak bytes) or the
exception. docs/design.md (Decisions: modelled costs) quotes a run of it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "eager"))
import harness  # noqa: E402
import models  # noqa: E402
import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tree_rnn", "mlp", "lstm_loop"])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.4, 0.5])
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name in a.models:
        b = models.BUILDERS[name]
        peak = harness.unconstrained_peak(b, "adam")
        for f in a.fractions:
            outs = []
            for costs in ["model"] * a.runs + ["time"] * a.runs:
                try:
                    r = harness.run_dtr(b, "adam", int(f * peak), max_remats=harness.remat_cap(b, "adam"),
                                        costs=costs)
                    outs.append((costs, r.stats.evictions, r.stats.rematerializations, r.stats.peak_bytes))
                except Exception as e:  # noqa: BLE001 - the outcome is what is measured
                    outs.append((costs, type(e).__name__))
            print(name, f, outs, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
