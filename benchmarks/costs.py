"""How well the modelled costs (NOTE [ Modelled costs ]) rank ops on this CPU, and what the fitted weights change
live: writes docs/costs.md.

    python benchmarks/costs.py [--out docs] [--rounds 3] [--no-live]

1. Fit (about 1 minute): each of the bench's three workloads (``torch-dtr bench``'s full sizes) trains plainly
   under a dispatch mode that times every aten op and asks ``model_cost`` for it, without and with the weights
   (``costs.WEIGHTS``). Per op: its measured time, its modelled time, and the weight that would make its share of
   the modelled time its share of the measured one, relative to the matmuls (weight 1).
2. Live (about 6 minutes): the bench's GPT-2 at 50% and 30% of its peak and ResNet-50 and the LSTM loop at 50%, each
   in a process of its own, with the weights and without them, interleaved in rounds; the median step after the
   plan settles. Nothing else may run meanwhile (two cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default")
LIVE = (("gpt2", 0.5), ("gpt2", 0.3), ("resnet50", 0.5), ("lstm", 0.5))


def fit(workload: str, steps: int = 2) -> dict[str, list[float]]:
    """Per op name: [calls, measured s, modelled s unweighted, modelled s weighted], over ``steps`` plain steps."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from torch_dtr.bench import workloads
    from torch_dtr.eager import costs

    torch.set_num_threads(2)
    model, batches, step = workloads.build(workload, workloads.SIZES[workload]["full"], steps + 1)
    step(model, batches[0])  # warm up: the optimizer's state, allocator caches
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])

    class Timed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            dt = time.perf_counter() - t0
            if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
                return out  # a view: it computes nothing, and the runtime never recomputes it on its own
            flat = tree_flatten(out)[0]
            name = f"{func.namespace}.{func._overloadpacket.__name__}.{func._overloadname}"
            cost = costs.model_cost(func, args, kwargs, flat, "cpu")
            a = acc[name]
            a[0] += 1
            a[1] += dt
            a[2] += cost / costs.weights(name)[0]
            a[3] += cost
            return out

    for b in batches[1:]:
        with Timed():
            step(model, b)
    return dict(acc)


def _live(workload: str, ratio: float, weighted: bool, steps: int = 4, settle: int = 3) -> dict:
    code = f"""
import json, statistics, time, torch, torch_dtr
from torch_dtr.bench import workloads
from torch_dtr.eager import costs
if not {weighted}:
    costs.WEIGHTS["cpu"].clear()
torch.set_num_threads(2)
model, batches, step = workloads.build({workload!r}, workloads.SIZES[{workload!r}]["full"], {steps + settle + 1})
with torch_dtr.enable(budget=None):
    step(model, batches[0])
    peak = torch_dtr.stats().peak_bytes
times = []
with torch_dtr.enable(budget=int({ratio} * peak)):
    for i, b in enumerate(batches[1:]):
        t0 = time.perf_counter()
        step(model, b)
        if i >= {settle}:
            times.append(time.perf_counter() - t0)
    st = torch_dtr.stats()
print(json.dumps(dict(times=times, remats=st.rematerializations, remat_s=st.remat_seconds, peak=st.peak_bytes,
                      budget=st.budget_bytes, planned=st.planned)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plain(workload: str, steps: int = 4) -> list[float]:
    code = f"""
import json, time, torch
from torch_dtr.bench import workloads
torch.set_num_threads(2)
model, batches, step = workloads.build({workload!r}, workloads.SIZES[{workload!r}]["full"], {steps + 1})
step(model, batches[0])
times = []
for b in batches[1:]:
    t0 = time.perf_counter()
    step(model, b)
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fit_lines(fits: dict[str, dict[str, list[float]]]) -> tuple[list[str], dict[str, float]]:
    from torch_dtr.eager import costs

    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for per in fits.values():
        for k, v in per.items():
            total[k] = [a + b for a, b in zip(total[k], v, strict=True)]
    mm = [total[k] for k in MATMULS if k in total]
    ref = sum(v[1] for v in mm) / sum(v[2] for v in mm)  # measured / modelled seconds of the matmuls
    real = sum(v[1] for v in total.values())
    lines = ["| op | calls | measured (ms) | modelled, unweighted (ms) | fitted weight | weight in use |",
             "| --- | --- | --- | --- | --- | --- |"]
    fitted: dict[str, float] = {}
    for k, (n, t, c, _) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        if t < 0.0005 * real or c <= 0:
            continue
        w = (t / c) / ref
        if w >= 1.5 and t >= 0.001 * real:  # what rule 5 keeps: the ops the model under-rates, that take time
            fitted[k.split(".")[1]] = max(w, fitted.get(k.split(".")[1], 0.0))
        lines.append(f"| {k} | {int(n)} | {1e3 * t:.1f} | {1e3 * c:.1f} | {w:.2f} | "
                     f"{costs.WEIGHTS['cpu'].get(k.split('.')[1], 1.0):.2f} |")
    # how far the modelled shares are from the measured ones: half the sum of |differences| (0: the same ranking
    # of where time goes; 1: disjoint), over the ops that take time
    def spread(col: int) -> float:
        ops = [v for v in total.values() if v[1] >= 0.001 * real]
        m, r = sum(v[col] for v in ops), sum(v[1] for v in ops)
        return sum(abs(v[col] / m - v[1] / r) for v in ops) / 2
    summary = [f"Matmuls run at {ref:.2f}x their modelled seconds here. The modelled shares of the time differ from "
               f"the measured ones by {spread(2):.2f} without weights and {spread(3):.2f} with them (half the sum of "
               "the differences over the ops that take 0.1% of the time or more: 0 when the model puts time where "
               "it goes).", ""]
    return summary + lines, fitted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-live", action="store_true", help="only the fit")
    a = ap.parse_args()
    import torch

    t0 = time.perf_counter()
    fits = {}
    for w in ("gpt2", "resnet50", "lstm"):
        print(f"fit: timing {w}'s ops", file=sys.stderr, flush=True)
        fits[w] = fit(w)
    fit_lines, fitted = _fit_lines(fits)
    print("fitted weights:", json.dumps({k: float(f"{v:.2g}") for k, v in sorted(fitted.items())}), file=sys.stderr)
    lines = ["# Modelled costs against measured ones (CPU)", "",
             f"{datetime.date.today()}, {platform.machine()} CPU (2 threads), Python {platform.python_version()}, "
             f"torch {torch.__version__}; `python benchmarks/costs.py`.", "",
             "The eviction policy and the plans rank values by what recomputing them costs (NOTE [ Modelled costs ] "
             "in src/torch_dtr/eager/costs.py): FLOPs at a fixed rate plus bytes moved at a fixed bandwidth, times a "
             "weight per operator on the CPU (rule 5). The weights are fitted here, from one plain training step "
             "of each of the bench's three workloads, timed op by op.", "", "## The fit", "", *fit_lines, ""]
    if not a.no_live:
        rows: dict[tuple[str, float, bool], list[dict]] = defaultdict(list)
        plain: dict[str, list[float]] = defaultdict(list)
        for r in range(a.rounds):
            for w in sorted({w for w, _ in LIVE}):
                print(f"live: round {r + 1}/{a.rounds}, {w} plain", file=sys.stderr, flush=True)
                plain[w] += _plain(w)
            for w, ratio in LIVE:
                for weighted in (True, False):
                    print(f"live: round {r + 1}/{a.rounds}, {w} at {ratio:.0%}, weights {'on' if weighted else 'off'}",
                          file=sys.stderr, flush=True)
                    rows[(w, ratio, weighted)].append(_live(w, ratio, weighted))
        lines += ["## Live: the bench's workloads under a budget, with the weights and without", "",
                  f"{a.rounds} rounds; each cell: the median of steps 4-7 of 7 under the budget (after the plan "
                  "settled) over the rounds, against plain's median step from the same rounds; recomputations per "
                  "process.", "",
                  "| workload | budget | without weights | with weights | recomputations without / with |",
                  "| --- | --- | --- | --- | --- |"]
        for w, ratio in LIVE:
            base = statistics.median(plain[w])
            cells = []
            for weighted in (False, True):
                rs = rows[(w, ratio, weighted)]
                errs = [x["error"] for x in rs if "error" in x]
                if errs:
                    cells.append(f"failed: {errs[0]}")
                    continue
                med = statistics.median(t for x in rs for t in x["times"])
                cells.append(f"{med:.3f} s ({med / base:.2f}x)")
            rem = [str(rows[(w, ratio, k)][0].get("remats", "-")) for k in (False, True)]
            lines.append(f"| {w} | {ratio:.0%} | {cells[0]} | {cells[1]} | {' / '.join(rem)} |")
        lines.append("")
    lines.append(f"Total time of this script: {time.perf_counter() - t0:.0f} s.")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'costs.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
