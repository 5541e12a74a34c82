"""Per-op cost of two source trees, alternated in fresh processes (A B A B ...), for small programs.

    python benchmarks/experiments/ab_dispatch.py OLD_TREE NEW_TREE [--rounds 3] [--demo-size]

Each round runs ``benchmarks/dispatch.py``'s measurement (plain, no-op mode, no budget, budget above the
peak, interleaved, 9 repeats) on the small elementwise chain, the small GPT-2 and the small LSTM, once
with OLD_TREE/src first on the path and once with NEW_TREE/src, and prints us per managed op and the
ratios to plain; ``--demo-size`` adds the demo's GPT-2 (4x256, sequence 256, batch 8, 5 repeats). A tree
is a checkout (``git worktree add /tmp/old <commit>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import dispatch as D
from torch_dtr.bench import workloads


def demo_gpt2():
    model, batches, step = workloads.build("gpt2", workloads.Size(8, 4, 256, 256), 4)
    it = iter(range(10**9))
    return (lambda: step(model, batches[next(it) % len(batches)])), "demo gpt2"


progs = [("small ops", D._small_ops, 9), ("gpt2 small", lambda: D._workload("gpt2"), 9),
         ("lstm small", lambda: D._workload("lstm"), 9)]
if sys.argv[2] == "1":
    progs.append(("gpt2 demo", demo_gpt2, 5))
out = {}
for label, make, repeats in progs:
    fn, _ = make()
    r = D.measure(fn, repeats)
    out[label] = {"us no budget": round(r["us_per_op"]["no budget"], 1),
                  "us budget": round(r["us_per_op"]["budget above peak"], 1),
                  "ratio no budget": round(r["ratio"]["no budget"], 3),
                  "ratio budget": round(r["ratio"]["budget above peak"], 3)}
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--demo-size", action="store_true", help="also the demo's GPT-2 (slow: ~1 min a process)")
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(a.rounds):
        for side in ("old", "new"):
            tree = os.path.abspath(getattr(a, side))
            env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"))
            cmd = [sys.executable, "-c", CHILD, tree, "1" if a.demo_size else "0"]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows[side].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {i + 1} {side}: {rows[side][-1]}", file=sys.stderr, flush=True)
    for prog in rows["old"][0]:
        for key in rows["old"][0][prog]:
            vals = {s: sorted(r[prog][key] for r in rows[s]) for s in rows}
            old, new = vals["old"], vals["new"]
            print(f"{prog:10s} {key:16s} old {old[0]}-{old[-1]}  new {new[0]}-{new[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
