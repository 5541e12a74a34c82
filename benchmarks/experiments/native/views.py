"""An op that makes no memory (``x.t()``) and the small GPT-2 of benchmarks/dispatch.py at no budget, plain against
the native front end, alternated in one process: microseconds per ``t()`` and the GPT-2 step's ratio to plain
(median of five rounds). For an A/B of two source trees, run it in each with its own extension folder:

    TORCH_EXTENSIONS_DIR=/tmp/ext_a PYTHONPATH=src python benchmarks/experiments/native/views.py
"""

import statistics
import time

import torch

from torch_dtr import native
from torch_dtr.bench import workloads


def main() -> None:
    torch.set_num_threads(1)
    x0 = torch.randn(64, 64, requires_grad=True)

    def t_loop(n: int = 20000) -> float:
        x = x0 * 1
        t = time.perf_counter()
        for _ in range(n):
            x.t()
        return (time.perf_counter() - t) / n * 1e6

    model, batches, step = workloads.build("gpt2", workloads.SIZES["gpt2"]["quick"], 4)

    def gpt2_step(k: int = 20) -> float:
        times = []
        for i in range(k):
            t = time.perf_counter()
            step(model, batches[i % 4])
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    gpt2_step(5)
    res: dict[str, list[float]] = {"t() plain": [], "t() native": [], "gpt2 plain": [], "gpt2 native": []}
    for _ in range(5):
        res["t() plain"].append(t_loop())
        res["gpt2 plain"].append(gpt2_step())
        native.enable(None)
        res["t() native"].append(t_loop())
        res["gpt2 native"].append(gpt2_step())
        native.disable()
    med = {k: statistics.median(v) for k, v in res.items()}
    ratio = med["gpt2 native"] / med["gpt2 plain"]
    print(f"t(): plain {med['t() plain']:.2f} us, native {med['t() native']:.2f} us; small GPT-2 step: plain "
          f"{med['gpt2 plain']:.2f} ms, native {med['gpt2 native']:.2f} ms ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
