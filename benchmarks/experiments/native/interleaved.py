"""Plain PyTorch, a do-nothing dispatch mode and the native front end at no budget, interleaved in one process
on one model: rounds of a few steps per contender, the order turned each round, the median round per contender.
A host whose speed drifts between processes (a lent GPU host's did by up to 1.7x: docs/gpu/notes.md) then moves
every contender alike, and the ratios stay comparable. The core is chosen at import: set
``TORCH_DTR_CORE=compiled`` for the compiled one (run the script once per core).

    PYTHONPATH=src python benchmarks/experiments/native/interleaved.py [cpu|cuda] WORKLOAD [WORKLOAD ...]
        [--size full|quick] [--rounds 5] [--steps 3] [--threads N]

Prints a table per workload; with ``OUT`` set, writes OUT/interleaved-DEVICE-CORE.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_dtr import native
from torch_dtr.bench import workloads
from torch_dtr.core.compiled import is_compiled


class Noop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def measure(device: str, name: str, size_name: str, rounds: int, steps: int) -> dict:
    model, batches, step = workloads.build(name, workloads.SIZES[name][size_name], steps)
    model.to(device)
    batches = [tuple(t.to(device) for t in b) if isinstance(b, tuple) else b.to(device) for b in batches]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def run(who: str) -> float:
        """Seconds per step of ``steps`` steps under ``who``, on the same batches every round."""
        mode = Noop() if who == "mode" else None
        if who == "native":
            native.enable(None)
        elif mode is not None:
            mode.__enter__()
        try:
            sync()
            t = time.perf_counter()
            for b in batches:
                step(model, b)
            sync()
            return (time.perf_counter() - t) / len(batches)
        finally:
            if who == "native":
                native.disable()
            elif mode is not None:
                mode.__exit__(None, None, None)

    who_all = ["plain", "mode", "native"]
    for who in who_all:  # warm-up: allocator pools, the kernel's caches, the optimizer's state
        run(who)
    n0 = native.stats()["managed_ops"]
    times: dict[str, list[float]] = {w: [] for w in who_all}
    for r in range(rounds):
        order = who_all[r % 3:] + who_all[:r % 3]
        for who in order:
            times[who].append(run(who))
        print(f"  round {r + 1}/{rounds}: " + "  ".join(f"{w} {times[w][-1] * 1e3:.2f} ms" for w in who_all),
              flush=True)
    ops = (native.stats()["managed_ops"] - n0) / (rounds * steps)
    med = {w: statistics.median(v) for w, v in times.items()}
    return {"workload": name, "size": size_name, "rounds": rounds, "steps": steps, "managed_ops_per_step": ops,
            "step_ms": {w: v * 1e3 for w, v in med.items()}, "rounds_ms": {w: [x * 1e3 for x in v]
                                                                            for w, v in times.items()},
            "ratio": {w: med[w] / med["plain"] for w in who_all}}


def main() -> int:
    args = sys.argv[1:]

    def opt(flag: str, default: str) -> str:
        if flag in args:
            i = args.index(flag)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        return default

    size_name, rounds, steps = opt("--size", "full"), int(opt("--rounds", "5")), int(opt("--steps", "3"))
    threads = int(opt("--threads", "0"))
    if threads:
        torch.set_num_threads(threads)
    device = args[0] if args else "cpu"
    names = args[1:] or ["gpt2", "lstm", "resnet50"]
    core = "compiled" if is_compiled() else "interpreted"
    print(f"{device}, {core} core, {size_name} sizes, {rounds} rounds of {steps} steps per contender, "
          f"{torch.get_num_threads()} intra-op threads", flush=True)
    out = []
    for name in names:
        print(f"{name}:", flush=True)
        r = measure(device, name, size_name, rounds, steps)
        out.append(r)
        print(f"{name:9s} plain {r['step_ms']['plain']:8.2f} ms   mode {r['ratio']['mode']:.3f}x   native "
              f"{r['ratio']['native']:.3f}x   ({r['managed_ops_per_step']:.0f} managed ops a step; native adds "
              f"{(r['step_ms']['native'] - r['step_ms']['plain']) * 1e3 / r['managed_ops_per_step']:.1f} us per "
              "op)", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"interleaved-{device}-{core}.json"), "w") as f:
            json.dump({"device": device, "core": core, "torch": torch.__version__, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
