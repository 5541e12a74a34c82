"""One side of an A/B comparison of the native front end at no budget: microseconds added per managed op on the
small-op chain, the small LSTM loop and the small GPT-2 (``torch-dtr bench --quick`` sizes), and a GPT-2 of 12
narrow layers (148 parameters: what the kernel does per constant per op shows), plain and native
steps interleaved in one process, median of ``ROUNDS`` rounds. Run it in two checkouts, each with its own
extension build (``TORCH_EXTENSIONS_DIR``), alternating; set ``TORCH_DTR_CORE=compiled`` for the compiled core.

    PYTHONPATH=src TORCH_EXTENSIONS_DIR=/tmp/extA python benchmarks/experiments/native/ab.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from torch_dtr import native
from torch_dtr.bench import workloads


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch.set_num_threads(1)
    w = torch.randn(64, 64, requires_grad=True)
    nxt = [0]

    def chain() -> None:
        y = w
        for _ in range(200):
            y = y * 1.0001 + 0.5
        y.sum().backward()
        w.grad = None

    def bench(name: str, size=None):
        model, batches, step = workloads.build(name, size or workloads.SIZES[name]["quick"], 4)

        def run() -> None:
            nxt[0] += 1
            step(model, batches[nxt[0] % len(batches)])

        return run

    for name, fn, k in (("small ops", chain, 20), ("lstm", bench("lstm"), 8), ("gpt2", bench("gpt2"), 8),
                       ("gpt2 x 12", bench("gpt2", workloads.Size(2, 12, 64, 32)), 4)):
        fn()
        native.enable(None)
        fn()
        n0 = native.stats()["managed_ops"]
        fn()
        ops = native.stats()["managed_ops"] - n0
        native.disable()
        plain, nat = [], []
        for _ in range(rounds):
            for out, on in ((plain, False), (nat, True)):
                nxt[0] = 0  # every mode of a round on the same batches
                if on:
                    native.enable(None)
                t = time.perf_counter()
                for _ in range(k):
                    fn()
                out.append((time.perf_counter() - t) / k)
                if on:
                    native.disable()
        a, b = statistics.median(plain), statistics.median(nat)
        print(f"{name:9s} managed ops/step {ops:5d}  plain {a * 1e3:7.2f} ms  native {b * 1e3:7.2f} ms  "
              f"{b / a:.3f}x  +{(b - a) / ops * 1e6:.2f} us per op")


if __name__ == "__main__":
    main()
