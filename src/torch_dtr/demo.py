"""The demo: train GPT-2 (Hugging Face ``transformers``, random weights) under a byte budget.

Each contender is one of the benchmark's workers (``bench/worker.py``) in a process of its own, so the
peak resident set size (RSS) of each is real and separate: plain PyTorch, torch-dtr with no budget (its
tracked peak is what the program keeps alive, in the runtime's accounting), and torch-dtr at fractions of
that peak. The contenders take turns in rounds (A B C D, A B C D, ...), so that a shared machine's drift hits
them alike; a step time is the median of a contender's measured steps over all rounds, its ratio is against
plain PyTorch's, and the spread is the range of the ratios of single rounds. Losses and final parameters are
compared bitwise with plain PyTorch's.
"""

from __future__ import annotations

import dataclasses
import statistics

from .bench import workloads
from .bench.run import spawn
from .core import fmt_bytes
from .deps import need


def _run(spec: dict, memory: bool = False) -> dict:
    r = spawn(spec, timeout=3600, memory=memory, progress=True)
    if "error" in r:
        raise RuntimeError(f"torch_dtr demo: the {spec['label']} worker failed: {r['error']}")
    return r


def main(ratios: tuple[float, ...] = (0.5, 0.3), steps: int = 4, rounds: int = 2) -> int:
    need("transformers", "bench", "torch-dtr demo")
    size = workloads.SIZES["gpt2"]["demo"]
    per_round = max(1, -(-steps // rounds))
    print(f"torch-dtr demo: {workloads.describe('gpt2', size)}, AdamW; {rounds} rounds in which each contender "
          f"trains 1 warm-up and {per_round} measured step(s) in a process of its own, taking turns", flush=True)
    base = {"workload": "gpt2", "size": dataclasses.asdict(size), "warmup": 1, "steps": per_round}
    specs = [base | {"kind": "plain", "label": "plain"}, base | {"kind": "dtr", "budget": None, "label": "dtr"}]
    runs: list[list[dict]] = [[_run(s)] for s in specs]  # per contender, its run of each round
    peak = runs[1][0]["peak_tracked"]
    for r in ratios:
        specs.append(base | {"kind": "dtr", "budget": int(peak * r), "label": f"dtr {r:.0%}"})
        runs.append([_run(specs[-1])])
    for k in range(1, rounds):  # the next rounds, in a rotated order
        order = list(range(len(specs)))
        order = order[k % len(order):] + order[:k % len(order)]
        for i in order:
            runs[i].append(_run(specs[i]))
    rss = [_run(s | {"steps": 1}, memory=True)["peak_rss"] for s in specs]  # from one short run each
    plain = runs[0]
    plain_step = statistics.median(t for r in plain for t in r["step_times"])
    print()
    head = f"{'contender':24s} {'budget':>11s} {'peak tracked':>13s} {'peak RSS':>11s} {'step':>8s} {'vs plain':>8s} " \
           f"{'spread':>11s} {'evictions':>9s} {'remats':>7s} {'bitwise':>7s}"
    print(head)
    print("-" * len(head))
    ok = True
    for rs, peak_rss in zip(runs, rss, strict=True):
        r = rs[0]
        name = "plain PyTorch" if r["kind"] == "plain" else (
            "torch-dtr, no budget" if r["budget"] is None else f"torch-dtr, {r['budget'] / peak:.0%} of peak")
        same = all(x["losses"] == p["losses"] and x["digest"] == p["digest"] for x, p in zip(rs, plain, strict=True))
        ok &= same
        step = statistics.median(t for x in rs for t in x["step_times"])
        each = [x["step_s"] / p["step_s"] for x, p in zip(rs, plain, strict=True)]
        tracked = max(x.get("peak_tracked") or 0 for x in rs)
        print(f"{name:24s} {fmt_bytes(r['budget']) if r['budget'] else '-':>11s} "
              f"{fmt_bytes(tracked) if tracked else '-':>13s} "
              f"{fmt_bytes(peak_rss):>11s} {step:7.2f}s {step / plain_step:7.2f}x "
              f"{min(each):5.2f}-{max(each):4.2f}x {sum(x.get('evictions', 0) for x in rs):9d} "
              f"{sum(x.get('remats', 0) for x in rs):7d} {'yes' if same else 'NO':>7s}")
    print()
    print("peak tracked: bytes of live tensors (parameters, optimizer state seen as op inputs, activations), "
          "as torch-dtr counts them (for plain PyTorch: one extra step under torch-dtr without a budget); peak "
          "RSS: the whole process, Python and libraries included, from one more short run per contender with "
          "glibc's mmap threshold at 64 KiB (freed tensors go back to the OS); step: median of all measured steps; "
          "vs plain: against plain PyTorch's median; spread: the lowest and highest ratio of a single round; "
          "evictions and recomputations: totals over all rounds; bitwise: every round's losses and final "
          "parameters equal to plain PyTorch's.")
    return 0 if ok else 1


def main_device(device: str, ratios: tuple[float, ...] = (0.5, 0.3), steps: int = 4) -> int:
    """The demo on a GPU (``device="cuda"``) or on the CPU through the simulated caching allocator (``"sim"``):
    budgets are fractions of plain PyTorch's ``max_memory_allocated``, and that is what is compared."""
    import torch

    from .bench import gpu

    need("transformers", "bench", "torch-dtr demo")
    if device == "cuda" and not torch.cuda.is_available():
        print("torch-dtr demo --device cuda: no CUDA device here; --device sim runs it on the CPU through the "
              "simulated allocator")
        return 2
    size = workloads.SIZES["gpt2"]["demo"]
    print(f"torch-dtr demo on {device}: {workloads.describe('gpt2', size)}, AdamW, {steps} measured steps after "
          f"1 warm-up, each contender in its own process", flush=True)
    base = {"device": device, "workload": "gpt2", "size": dataclasses.asdict(size), "warmup": 1, "steps": steps}
    runs = [gpu.spawn(base | {"kind": "plain", "label": "plain PyTorch"}, 3600)]
    if "error" in runs[0]:
        raise RuntimeError(f"torch_dtr demo: plain PyTorch failed: {runs[0]['error']}")
    peak = runs[0]["max_allocated"]
    runs.append(gpu.spawn(base | {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"}, 3600))
    floor = runs[1].get("floor", 0)
    for r in ratios:  # below 1.25x the single-op floor no schedule has room to recompute: 1.25x it then
        b = max(int(peak * r), int(1.25 * floor))
        label = f"torch-dtr, {b / peak:.0%}" + ("" if b == int(peak * r) else " (floor)")
        runs.append(gpu.spawn(base | {"kind": "dtr", "budget": b, "label": label}, 3600))
    plain = runs[0]
    head = (f"{'contender':22s} {'budget':>11s} {'max allocated':>14s} {'max reserved':>13s} {'step':>9s} "
            f"{'vs plain':>8s} {'evictions':>9s} {'remats':>7s} {'bitwise':>7s}")
    print()
    print(head)
    print("-" * len(head))
    ok = True
    for r in runs:
        if "error" in r:
            ok = False
            print(f"{r['label']:22s} failed: {r['error']}")
            continue
        same = r["losses"] == plain["losses"] and r["digest"] == plain["digest"]
        ok &= same and (r.get("budget") is None or r["max_allocated"] <= r["budget"])
        print(f"{r['label']:22s} {fmt_bytes(r['budget']) if r.get('budget') else '-':>11s} "
              f"{fmt_bytes(r['max_allocated']):>14s} {fmt_bytes(r['max_reserved']):>13s} "
              f"{r['step_s'] * 1e3:7.1f}ms {r['step_s'] / plain['step_s']:7.2f}x {r.get('evictions', 0):9d} "
              f"{r.get('remats', 0):7d} {'yes' if same else 'NO':>7s}")
    print()
    print("max allocated / reserved: the allocator's peaks (torch.cuda.max_memory_allocated / _reserved, or the "
          "simulated allocator's); a budget bounds max allocated; bitwise: losses and final parameters equal to plain "
          "PyTorch's (deterministic algorithms).")
    return 0 if ok else 1
