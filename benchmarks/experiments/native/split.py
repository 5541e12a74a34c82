"""Where the native front end's host time per managed op goes, on this machine: one op (relu of a 64x64 tensor
that requires grad) in a loop, plain; under a do-nothing dispatch mode; under the native front end; and under the
native front end with the session's ``ran`` (the core's Feed) replaced by a function that returns at once (the
kernel and the crossing into Python without the core's work). Microseconds per op, median of rounds.

    PYTHONPATH=src python benchmarks/experiments/native/split.py [cpu|cuda] [ROUNDS]
"""

import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_dtr import native
from torch_dtr.native.session import Session


class Noop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _quick_ran(name, cost, ins, nbytes, values, recipe, held, read, wrote, dead, plain=0, views=None):
    return [None] * len(nbytes), -1  # (handles die unseen by the core: for timing only)


def _skip_core() -> None:
    """Every later session's ``ran`` (the core's Feed, bound per session) returns at once."""
    init = Session.__init__

    def patched(self, *a, **k):
        init(self, *a, **k)
        self.ran = _quick_ran
        self.dropped = lambda dead: None
        self.flush = lambda: None

    Session.__init__ = patched


def main() -> None:
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(1)
    x0 = torch.randn(64, 64, device=dev, requires_grad=True)

    def loop(n: int = 5000) -> float:
        x = x0 * 1
        for _ in range(200):
            torch.relu(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            torch.relu(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    res: dict[str, list[float]] = {"plain": [], "do-nothing mode": [], "native": [], "native, core skipped": []}
    for _ in range(rounds):
        res["plain"].append(loop())
        with Noop():
            res["do-nothing mode"].append(loop())
        native.enable(None)
        res["native"].append(loop())
        native.disable()
    # last: the core never hears of the handles made here (their deaths are dropped unseen)
    _skip_core()
    for _ in range(rounds):
        native.enable(None)
        res["native, core skipped"].append(loop())
        native.disable()
    base = statistics.median(res["plain"])
    print(f"relu 64x64 on {dev}, us per op (median of {rounds}):")
    for k, v in res.items():
        m = statistics.median(v)
        print(f"  {k:22s} {m:7.2f}  (+{m - base:.2f})")


if __name__ == "__main__":
    main()
