"""Whether an optimizer's step could gain by bypassing the native front end's fallback: the fallback's floor
(``torch_dtr.native.passthrough(blocks=True)``: every op passed straight down) timed with every op crossing it,
and with the ops inside ``optimizer.step()`` not crossing it (the passthrough switched off by step hooks), beside
plain PyTorch, interleaved in one process, median of 15 rounds of 8 steps.

    PYTHONPATH=src TORCH_DTR_CORE=compiled python benchmarks/experiments/native/step_floor.py [gpt2|lstm|resnet50]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from dispatch import _workload  # noqa: E402

from torch_dtr import native  # noqa: E402


def main() -> None:
    fn = _workload(sys.argv[1] if len(sys.argv) > 1 else "gpt2")[0]
    ext = native.load()
    for _ in range(5):
        fn()
    skip = [False]

    def pre(*_: object) -> None:  # (a pre-hook returns None or new arguments)
        if skip[0]:
            ext.set_passthrough(False)

    def post(*_: object) -> None:
        if skip[0]:
            ext.set_passthrough(True)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
    times: dict[str, list[float]] = {"plain": [], "floor": [], "floor, step bypassed": []}
    for _ in range(15):
        for who in times:
            skip[0] = who == "floor, step bypassed"
            if who == "plain":
                fn()
                t0 = time.perf_counter()
                for _ in range(8):
                    fn()
            else:
                with native.passthrough(blocks=True):
                    fn()
                    t0 = time.perf_counter()
                    for _ in range(8):
                        fn()
            times[who].append((time.perf_counter() - t0) / 8)
            skip[0] = False
    med = {who: statistics.median(v) * 1e3 for who, v in times.items()}
    print(", ".join(f"{who} {v:.2f} ms ({v / med['plain']:.3f}x)" for who, v in med.items()))


if __name__ == "__main__":
    main()
