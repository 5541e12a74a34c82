"""What a compiled front end would cost per op: a C++ boxed fallback (floor.cpp) against torch-dtr's Python path.

    python benchmarks/experiments/native/floor.py [--rounds 5] [--steps 15]

Builds floor.cpp with torch's JIT extension loader (needs a C++ compiler and ninja; about 30 s the first time),
then times the small-op chain of benchmarks/phases.py (200 x (mul, add) on 64x64 and its backward) in one
process, interleaved in rounds: plain PyTorch, a do-nothing Python dispatch mode, the C++ fallback tagging
outputs only, the C++ fallback keeping DTR's per-op records, and torch-dtr with no budget. Prints microseconds
added per managed op over plain. Not shipped: an experiment that decides whether a compiled front end is worth
building.
"""

from __future__ import annotations

import argparse
import collections
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

import torch_dtr

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from phases import _chain, _median, _Noop  # noqa: E402  (the same chain, clock and mode as phases.py's floor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args()
    t0 = time.perf_counter()
    ext = load("dtr_floor", [str(Path(__file__).with_name("floor.cpp"))], extra_cflags=["-O2"])
    claimed = ext.claim()
    print(f"built in {time.perf_counter() - t0:.0f} s; ops given the fallback as kernel: {claimed}", file=sys.stderr)
    base = torch.randn(64, 64)
    plain = _chain(base.clone().requires_grad_(True))
    tag = _chain(ext.manage(base.clone(), False).requires_grad_(True))
    book = _chain(ext.manage(base.clone(), True).requires_grad_(True))
    n0 = ext.counters()[0]
    book()
    ops = ext.counters()[0] - n0
    times: dict[str, list[float]] = collections.defaultdict(list)
    for r in range(a.rounds):
        plain()
        times["plain"].append(_median(plain, a.steps))
        with _Noop():
            plain()
            times["a do-nothing Python dispatch mode"].append(_median(plain, a.steps))
        ext.manage(base, False)  # sets the mode: tag only
        tag()
        times["C++ fallback: run below the bit, tag outputs"].append(_median(tag, a.steps))
        ext.manage(base, True)  # records
        book()
        times["C++ fallback with DTR's per-op records"].append(_median(book, a.steps))
        torch_dtr.enable(budget=None)
        try:
            plain()
            times["torch-dtr (Python), no budget"].append(_median(plain, a.steps))
        finally:
            torch_dtr.disable()
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
    p = statistics.median(times.pop("plain"))
    print(f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {ops} managed ops per step; plain step {p * 1e3:.2f} ms; "
          f"{a.rounds} rounds x {a.steps} steps")
    mode = (statistics.median(times["a do-nothing Python dispatch mode"]) - p) / ops * 1e6
    print("| what runs the ops | us added per op | of the mode's |\n| --- | ---: | ---: |")
    for k, v in times.items():
        us = (statistics.median(v) - p) / ops * 1e6
        spread = [(x - p) / ops * 1e6 for x in v]
        print(f"| {k} | {us:.1f} ({min(spread):.1f}-{max(spread):.1f}) | {us / mode:.2f}x |")


if __name__ == "__main__":
    main()
