"""Eviction-search time of two source trees, alternated in fresh processes (A B A B ...).

    python benchmarks/experiments/search_ab.py OLD_TREE NEW_TREE [--rounds 3] [--live]

Each round replays the shared LSTM log at 0.3 of its peak (``simulate``'s ``search_seconds``, the default
policy) once with OLD_TREE/src first on the path and once with NEW_TREE/src; ``--live`` adds two training
steps of the bench's LSTM loop at 50% of its peak (over its 3 batches) after a warm-up step (its ``search_seconds`` and
recomputations). The choices must be the same when only the search's speed changed: the recomputation
counts are printed next to the times. A tree is a checkout (``git worktree add /tmp/old <commit>``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

LOGS = Path(__file__).resolve().parents[3] / "shared" / "dtr-logs"

SIM = """
import sys
from pathlib import Path
from torch_dtr.sim import log, replay
o = replay.simulate(log.read(Path(sys.argv[1]) / "lstm-seq128.log"), ratio=0.3)
print(f"sim lstm-seq128 at 0.3: search {o.search_seconds:.3f} s, {o.rematerializations} recomputations")
"""

LIVE = """
import torch, torch_dtr
from torch_dtr.bench import workloads
size = workloads.SIZES["lstm"]["full"]
model, batches, step = workloads.build("lstm", size, 3)
torch.set_num_threads(2)
peak = 0
for b in batches:  # the peak over the run's batches, as the bench's search takes it (lengths differ)
    torch_dtr.enable(budget=None)
    step(model, b)
    peak = max(peak, torch_dtr.stats().peak_bytes)
    torch_dtr.disable()
torch_dtr.enable(budget=int(peak * 0.5))
rt = torch_dtr.runtime()
step(model, batches[0])
s0, r0 = rt.search_seconds, rt.rematerializations
step(model, batches[1])
step(model, batches[2])
print(f"live lstm at 50%, 2 steps: search {rt.search_seconds - s0:.3f} s, {rt.rematerializations - r0} recomputations")
"""


def _run(tree: str, code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve() / "src"))
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return p.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--logs", default=str(LOGS))
    a = ap.parse_args()
    for r in range(a.rounds):
        for label, tree in (("old", a.old), ("new", a.new)):
            print(f"round {r + 1} {label}: {_run(tree, SIM, a.logs)}", flush=True)
            if a.live:
                print(f"round {r + 1} {label}: {_run(tree, LIVE)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
