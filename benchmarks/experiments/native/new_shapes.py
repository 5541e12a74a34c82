"""The native front end on a program whose shapes are new every step (an LSTM cell loop over a batch whose
sequence length, and so the shapes of its input projection and their gradients, changes each step and never
repeats), at no budget: microseconds added per managed op over plain PyTorch, plain and native steps interleaved
in one process (median of rounds), and the kernel's cost-cache misses per step with how many it answered in C++
(NOTE [ Modelled costs ] 4). Run it in two checkouts for an A/B (``TORCH_EXTENSIONS_DIR`` apart).

    PYTHONPATH=src python benchmarks/experiments/native/new_shapes.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from torch_dtr import native


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = 64
    inp, cell, out = torch.nn.Linear(32, width), torch.nn.LSTMCell(width, width), torch.nn.Linear(width, 10)
    # (batch, length) pairs, each used once by the native front end (plain runs the same ones first)
    shapes = [(b, n) for b in range(4, 21) for n in range(8, 33)]
    order = torch.randperm(len(shapes), generator=torch.Generator().manual_seed(1)).tolist()
    shapes = [shapes[i] for i in order]

    def step(b: int, n: int) -> None:
        xs = torch.tanh(inp(torch.randn(b, n, 32)))
        h = c = torch.zeros(b, width)
        for t in range(n):
            h, c = cell(xs[:, t], (h, c))
        torch.nn.functional.cross_entropy(out(h), torch.zeros(b, dtype=torch.long)).backward()

    ext = native.load()
    for b, n in shapes[-3:]:
        step(b, n)
    plain, ours, per_step = [], [], []
    for r in range(rounds):
        mine = shapes[6 * r:6 * r + 6]
        t = time.perf_counter()
        for b, n in mine:
            step(b, n)
        plain.append(time.perf_counter() - t)
        native.enable(None)
        c0 = ext.counters()
        t = time.perf_counter()
        for b, n in mine:  # shapes the native front end has not seen: its caches miss
            step(b, n)
        ours.append(time.perf_counter() - t)
        c1 = ext.counters()
        native.disable()
        per_step.append({k: (c1.get(k, 0) - c0.get(k, 0)) / 6 for k in ("managed_ops", "cost_misses", "costs_here")})
    p, n = statistics.median(plain), statistics.median(ours)
    c = per_step[-1]
    print(f"6 steps: plain {p * 1e3:.1f} ms, native {n * 1e3:.1f} ms ({n / p:.2f}x); "
          f"{(n - p) / 6 / c['managed_ops'] * 1e6:.2f} us added per managed op ({c['managed_ops']:.0f} a step); "
          f"cost misses {c['cost_misses']:.0f} a step, {c.get('costs_here', 0):.0f} answered in C++")


if __name__ == "__main__":
    main()
