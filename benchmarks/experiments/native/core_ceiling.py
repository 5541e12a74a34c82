"""What the native front end would cost with a core that costs nothing: the ceiling of any faster core.

Each contender trains in a process of its own and the processes take turns (``benchmarks/steady.py``): plain
PyTorch; the fallback's floor (``native.passthrough`` with the front end's CPU allocator: every op boxed and
passed down, nothing else); the native front end at no budget; and the same with the session's entries from the
kernel (``before``, ``ran``, the handle deaths, the queue) replaced by functions that return at once. The last
keeps the kernel's own work (scan, recipes, payloads, handles, the cost cache) and the crossing into Python with
the argument lists it builds, and drops everything the core does: no core, compiled or written in C++, can take
the front end below it with this kernel (one in C++ would also save the crossing). The stand-ins are interpreted
Python functions, so their own calls (one or two per managed op) stay in the figure: it bounds the kernel's cost
from above. Nothing is evicted (no budget); the skipped core keeps no records, so those runs are timed only.

    PYTHONPATH=src TORCH_DTR_CORE=compiled python benchmarks/experiments/native/core_ceiling.py [WORKLOAD ...]
        [--rounds 30] [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import steady  # noqa: E402

from torch_dtr.native.session import Session  # noqa: E402

WHO = ("plain", "fallback", "native", "native, core skipped")


def _skip_core() -> None:
    """Every session's entries from the kernel return at once (new constants are still seen: their leaves get the
    plain-gradient hook, so that the optimizer's step runs as it does with the core)."""
    init = Session.__init__

    def patched(self: Session, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        ext = self.ext

        def before(ins, need, name, dead, consts, writes, plain=0, views=None):  # noqa: ANN001, ANN202
            for t, key, nbytes in consts:
                self._see(t, key, nbytes, name)
            return ([], "plain") if writes else []

        def ran(name, cost, ins, nbytes, values, recipe, held, read, wrote, dead, plain=0, views=None):  # noqa: ANN001, ANN202
            extra = wrote is not None and wrote[1] in ("version", "copy")
            return [None] * (len(nbytes) + extra), -1

        def flush() -> None:
            if self.active:
                ext.take_views()
                ext.take_dead()

        self.before, self.ran, self.flush = before, ran, flush
        self.queued = lambda views: None
        self.dropped = lambda dead: None
        self.constants_died = lambda gone: None

    Session.__init__ = patched  # type: ignore[method-assign]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        who = sys.argv[3]
        if who == "native, core skipped":
            _skip_core()
            who = "native"
        steady.child(sys.argv[2], who, int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt2"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8, help="steps per turn (a multiple of the 4 batches)")
    ap.add_argument("--warm", type=int, default=5)
    a = ap.parse_args()
    for wl in a.workloads:
        turns = steady.measure(wl, list(WHO), a.rounds, a.steps, a.warm, "cpu", script=__file__)
        times = {w: [t["s"] for t in v] for w, v in turns.items()}
        base = statistics.median(times["plain"])
        print(f"{wl}: processes taking turns, {a.rounds} rounds of {a.steps} steps; median step, ratio to plain's, "
              f"range of the per-round ratios")
        for w, v in times.items():
            per = sorted(t / p for t, p in zip(v, times["plain"], strict=True))
            print(f"  {w:22s} {statistics.median(v) * 1e3:8.2f} ms  {statistics.median(v) / base:.3f}x  "
                  f"({per[0]:.2f}-{per[-1]:.2f})")


if __name__ == "__main__":
    main()
