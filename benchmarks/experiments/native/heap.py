"""The C heap under the native front end (docs/native.md, Host memory on the CPU): the bench's LSTM loop at no
budget, each contender in a process of its own: the bytes in use at their peak and the heap's size (glibc's
``mallinfo2``, read after every managed op), and the process's peak RSS. Writes docs/native-heap.md.

    python benchmarks/experiments/native/heap.py [--steps 4]

Contenders: plain PyTorch, the Python front end, the native front end with its CPU allocator (NOTE [ Native front
end ] 7) and without it (c10's own, switched back after ``enable``). Linux with glibc only. About 2 minutes.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KINDS = ("plain", "python", "native", "native, c10's allocator")


class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _one(kind: str, steps: int) -> dict:
    import torch

    import torch_dtr
    from torch_dtr import native
    from torch_dtr.bench import workloads

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Info
    model, batches, step = workloads.build("lstm", workloads.SIZES["lstm"]["full"], steps)
    peak = {"in_use": 0, "heap": 0}

    def sample(*_: object) -> None:
        m = libc.mallinfo2()
        peak["in_use"] = max(peak["in_use"], m.uordblks + m.hblkhd)
        peak["heap"] = max(peak["heap"], m.arena)

    if kind == "python":
        torch_dtr.enable()
        torch_dtr.runtime().listen(sample)
    elif kind.startswith("native"):
        native.enable()
        if kind != "native":
            native.load().cpu_blocks(False)
        native.current().rt.listen(sample)
    for i, b in enumerate(batches):
        torch.manual_seed(100 + i)
        step(model, b)
        sample()
    return peak | {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "docs" / "native-heap.md"))
    a = ap.parse_args()
    if a.one:
        print(json.dumps(_one(a.one, a.steps)))
        return 0
    if platform.libc_ver()[0] != "glibc":
        print("glibc only (mallinfo2)", file=sys.stderr)
        return 1
    rows = []
    for kind in KINDS:
        print(f"{kind} ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--one", kind, "--steps", str(a.steps)], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(f"| {kind} | {r['in_use'] / 2**20:.0f} MiB | {r['heap'] / 2**20:.0f} MiB | "
                    f"{r['rss'] / 2**30:.2f} GiB |")
    text = "\n".join([
        "# The C heap under the native front end", "",
        f"Written by `python benchmarks/experiments/native/heap.py --steps {a.steps}` on {datetime.date.today()}, "
        f"{platform.machine()}, glibc {platform.libc_ver()[1]}. The bench's LSTM loop (width 768) at no budget, "
        f"{a.steps} training steps, each contender in its own process; bytes in use and heap size: the largest "
        "after any managed op (plain PyTorch: after each step), from `mallinfo2`; peak RSS: `ru_maxrss`. See "
        "docs/native.md, Host memory on the CPU.", "",
        "| contender | bytes in use (peak) | C heap (peak) | peak RSS |", "| --- | ---: | ---: | ---: |",
        *rows, ""])
    Path(a.out).write_text(text)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
