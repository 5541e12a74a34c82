"""Rematerializing one output of a multi-output op can break the budget (peak > budget, no BudgetError).

``Runtime._recompute`` reserves only the bytes of the op's outputs that are *not* resident, and that
``reserve`` may evict a *resident sibling output* of the same op (an op's outputs are not locked while it
is recomputed). The recipe then runs, and the loop over ``op.outputs`` finds the sibling non-resident and
allocates it again: tracked bytes end above the budget by the sibling's size. ``Runtime.check()`` fails with
"peak ... > budget ...". (Correct outcomes: keep within the budget, or raise BudgetError.)

Seen in tests/eager/test_equivalence.py on GPT-2 near its minimal budget: aten::native_layer_norm returns
(out, mean, rstd); rematerializing ``out`` evicted the 2 KiB ``mean``/``rstd`` and re-added them
(overshoots of 275-3609 B). Any multi-output op can do it (native_dropout, native_batch_norm, topk, ...).

Run: python tests/eager/repros/remat_evicts_sibling_output.py   (exit 1 while the bug is present)
"""

import sys

from torch_dtr.core.runtime import BudgetError, InternalError, Runtime


def main() -> bool:
    # one recipe with two outputs of 100 B each; b stays resident, a is evicted
    rt = Runtime(budget=None)
    op = rt.ran([], 1.0, lambda: ["a", "b"], "two_outputs")
    a = rt.output(op, 100, "a")
    b = rt.output(op, 100, "b")
    a.refs = b.refs = 1  # both have handles
    rt.evict(a)  # tracked 100: b resident, a evicted
    rt.reset_peak()  # peak 100
    rt.budget = 150
    try:
        rt.rematerialize(a)  # reserve(100) evicts b (the only candidate), then both outputs come back: 200 B
    except BudgetError as e:  # also correct: the budget cannot hold a and b
        print("OK: BudgetError:", str(e)[:60], "...")
        return True
    print("tracked", rt.memory.tracked, "peak", rt.memory.peak, "budget", rt.budget)
    try:
        rt.check()
    except InternalError as e:
        print("BUG:", e)
        return False
    print("OK")
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
