"""Page faults per training step (docs/native.md, Page faults, and constants swept in part): the small GPT-2
(``torch-dtr bench --quick`` size, one thread) as plain PyTorch, as plain PyTorch with the native front end's CPU
allocator alone (``blocks``: NOTE [ Native front end ] 7, its kept blocks included) and under the native front end
at no budget; contenders interleaved in one process, ``STEPS`` timed steps per contender and round after two
untimed ones. Prints ms per step (median) and minor page faults per step (``getrusage``) per round.

    PYTHONPATH=src python benchmarks/experiments/native/faults.py [ROUNDS] [STEPS]
"""

import resource
import statistics
import sys
import time

import torch

from torch_dtr import native
from torch_dtr.bench import workloads


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    torch.set_num_threads(1)
    model, batches, step = workloads.build("gpt2", workloads.SIZES["gpt2"]["quick"], 4)
    for b in batches[:3]:
        step(model, b)
    ext = native.load()
    out: dict[str, list[str]] = {"plain": [], "blocks": [], "native": []}
    for _ in range(rounds):
        for who, row in out.items():
            if who == "blocks":
                ext.cpu_blocks(True)
            elif who == "native":
                native.enable(None)
            for b in batches[:2]:
                step(model, b)
            f0, times = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
            for i in range(steps):
                t = time.perf_counter()
                step(model, batches[i % len(batches)])
                times.append(time.perf_counter() - t)
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps
            if who == "blocks":
                ext.cpu_blocks(False)
            elif who == "native":
                native.disable()
            row.append(f"{statistics.median(times) * 1e3:6.2f} ms ({faults:5.0f})")
    for who, row in out.items():
        print(f"{who:7s}" + "  ".join(row))


if __name__ == "__main__":
    main()
