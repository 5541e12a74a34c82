"""The demo: train GPT-2 (Hugging Face ``transformers``, random weights) under a byte budget.

Each contender is one of the benchmark's workers (``bench/worker.py``) in a process of its own, so the
peak resident set size (RSS) of each is real and separate: plain PyTorch, torch-dtr with no budget (its
tracked peak is what the program keeps alive, in the runtime's accounting), and torch-dtr at fractions of
that peak. Losses are compared bitwise with plain PyTorch.
"""

from __future__ import annotations

import dataclasses

from .bench import workloads
from .bench.run import spawn
from .core import fmt_bytes
from .deps import need


def _run(spec: dict, memory: bool = False) -> dict:
    r = spawn(spec, timeout=3600, memory=memory, progress=True)
    if "error" in r:
        raise RuntimeError(f"torch_dtr demo: the {spec['label']} worker failed: {r['error']}")
    return r


def main(ratios: tuple[float, ...] = (0.5, 0.3), steps: int = 4) -> int:
    need("transformers", "bench", "torch-dtr demo")
    size = workloads.SIZES["gpt2"]["demo"]
    print(f"torch-dtr demo: {workloads.describe('gpt2', size)}, AdamW, {steps} measured steps after 1 warm-up, "
          f"each contender in its own process", flush=True)
    base = {"workload": "gpt2", "size": dataclasses.asdict(size), "warmup": 1, "steps": steps}
    specs = [base | {"kind": "plain", "label": "plain"}, base | {"kind": "dtr", "budget": None, "label": "dtr"}]
    runs = [_run(s) for s in specs]
    peak = runs[1]["peak_tracked"]
    for r in ratios:
        specs.append(base | {"kind": "dtr", "budget": int(peak * r), "label": f"dtr {r:.0%}"})
        runs.append(_run(specs[-1]))
    for s, r in zip(specs, runs, strict=True):  # peak RSS from a short run of each contender set up for it
        r["peak_rss"] = _run(s | {"steps": 1}, memory=True)["peak_rss"]
    plain = runs[0]
    print()
    head = f"{'contender':24s} {'budget':>11s} {'peak tracked':>13s} {'peak RSS':>11s} {'step':>8s} {'vs plain':>8s} " \
           f"{'evictions':>9s} {'remats':>7s} {'same loss':>9s}"
    print(head)
    print("-" * len(head))
    for r in runs:
        name = "plain PyTorch" if r["kind"] == "plain" else (
            "torch-dtr, no budget" if r["budget"] is None else f"torch-dtr, {r['budget'] / peak:.0%} of peak")
        same = "yes" if r["losses"] == plain["losses"] else "NO"
        print(f"{name:24s} {fmt_bytes(r['budget']) if r['budget'] else '-':>11s} "
              f"{fmt_bytes(r['peak_tracked']) if r.get('peak_tracked') else '-':>13s} "
              f"{fmt_bytes(r['peak_rss']):>11s} {r['step_s']:7.2f}s {r['step_s'] / plain['step_s']:7.2f}x "
              f"{r.get('evictions', 0):9d} {r.get('remats', 0):7d} {same:>9s}")
    print()
    print("peak tracked: bytes of live tensors (parameters, optimizer state seen as op inputs, activations), "
          "as torch-dtr counts them (for plain PyTorch: one extra step under torch-dtr without a budget); peak "
          "RSS: the whole process, Python and libraries included, from one more short run per contender with "
          "glibc's mmap threshold at 64 KiB (freed tensors go back to the OS); step times: median of the "
          "measured steps, default allocator; evictions and recomputations: totals over all steps.")
    return 0 if all(r["losses"] == plain["losses"] for r in runs) else 1
