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
