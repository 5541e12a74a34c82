"""How often a budget near the minimum trains or thrashes: repeated runs of a test model, each in a fresh
process. Prints one line per process and a summary per budget.

    python benchmarks/near_min.py [--model tree_rnn] [--opt adam] [--policy dtr_eq] [--costs model]
                                  [--processes 4] [--fractions 0.3 0.33 0.37 0.4] [--out FILE.md]

Each process trains the model of ``tests/eager/models.py`` for 3 steps (the equivalence tests' harness,
one intra-op thread) once at every fraction of its unconstrained peak, twice over. A run "thrashes" when it
passes the tests' cap of ``REMAT_CAP_PER_OP`` rematerializations per op of the unconstrained run, and
"BudgetError" when the budget cannot be kept. docs/design.md (Known limits) quotes it for the tree RNN.
Each outcome carries the run's counters (recomputations, evictions, drops, banished recipes, tracked peak),
so the summary also says whether every process made the same choices (issue 13: 8 of 8 identical); ``--out``
appends that summary to a Markdown file (docs/determinism.md).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "eager"


def one_process(model: str, opt: str, policy: str, fractions: list[float], costs: str = "model") -> list[str]:
    """Run in a child process: the outcome at each fraction, twice over, as ``fraction:outcome`` words."""
    sys.path.insert(0, str(TESTS))
    import harness  # noqa: PLC0415 (lives in tests/eager)
    import models  # noqa: PLC0415
    import torch  # noqa: PLC0415

    import torch_dtr  # noqa: PLC0415

    torch.set_num_threads(1)
    builder = models.BUILDERS[model]
    peak = harness.unconstrained_peak(builder, opt)
    enable = torch_dtr.enable
    harness.torch_dtr.enable = lambda budget=None, **kw: enable(budget, policy=policy, **kw)
    words = []
    for frac in fractions * 2:
        try:
            res = harness.run_dtr(builder, opt, int(frac * peak), max_remats=harness.remat_cap(builder, opt),
                                  costs=costs)
            st = res.stats
            words.append(f"{frac}:trained({st.rematerializations},{st.evictions},{st.drops},{st.banished},"
                         f"{st.peak_bytes})")
        except harness.TooMuchRecomputation:
            words.append(f"{frac}:thrashed")
        except torch_dtr.BudgetError:
            words.append(f"{frac}:BudgetError")
    return words


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tree_rnn")
    ap.add_argument("--opt", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--policy", default=None, help="eviction policy (default: the library's default)")
    ap.add_argument("--costs", default="model", choices=["model", "time"])
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.3, 0.33, 0.37, 0.4])
    ap.add_argument("--out", help="append the summary as Markdown to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.policy is None:
        from torch_dtr.core.policies import DEFAULT_POLICY  # noqa: PLC0415

        a.policy = DEFAULT_POLICY
    if a.child:
        print(" ".join(one_process(a.model, a.opt, a.policy, a.fractions, a.costs)))
        return 0
    tally: dict[float, collections.Counter] = {f: collections.Counter() for f in a.fractions}
    words: dict[float, collections.Counter] = {f: collections.Counter() for f in a.fractions}  # with counters
    for i in range(a.processes):
        cmd = [sys.executable, __file__, "--child", "--model", a.model, "--opt", a.opt, "--policy", a.policy,
               "--costs", a.costs,
               "--fractions", *map(str, a.fractions)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        print(f"process {i + 1}/{a.processes}: {out}", flush=True)
        for w in out.split():
            frac, outcome = w.split(":")
            tally[float(frac)][outcome.split("(")[0]] += 1
            words[float(frac)][outcome] += 1
    print(f"\n{a.model} with {a.opt}, policy {a.policy}, costs {a.costs}: runs per outcome at each fraction "
          f"of the peak")
    runs = 2 * a.processes
    for frac, c in tally.items():
        same = max(words[frac].values())
        print(f"  {frac:.2f}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
              + f"; identical outcome and counters in {same} of {runs} runs")
    if a.out:
        import datetime  # noqa: PLC0415

        lines = [f"### {a.model} ({a.opt}, policy {a.policy}, costs {a.costs}), {datetime.date.today()}", "",
                 f"`python benchmarks/near_min.py --model {a.model} --opt {a.opt} --policy {a.policy} --costs "
                 f"{a.costs} --processes {a.processes} --fractions {' '.join(map(str, a.fractions))}`: "
                 f"{a.processes} fresh processes, each runs every budget twice.", "",
                 "| fraction of peak | outcomes | identical (outcome and counters) | counters (recomputations, "
                 "evictions, drops, banished, peak bytes) |", "| --- | --- | --- | --- |"]
        for frac, c in tally.items():
            same = max(words[frac].values())
            top = words[frac].most_common(1)[0][0]
            lines.append(f"| {frac:.2f} | " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                         + f" | {same} of {runs} | {top.split('(', 1)[1][:-1] if '(' in top else '-'} |")
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
