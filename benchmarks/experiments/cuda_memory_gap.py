"""Where torch-dtr's extra device memory at no budget comes from (one-off, CUDA): the bench MLP of
``benchmarks/distributed.py`` (no DDP, and DDP on one NCCL rank), plain and under ``torch_dtr.enable()``, with
PyTorch's allocator history recorded; prints each run's peak and the blocks alive at the peak, grouped by the
innermost frame of torch-dtr or of the program that allocated them.

    python benchmarks/experiments/cuda_memory_gap.py [--width 1024 --depth 8 --batch 8192]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed import Block  # noqa: E402


def where(frames: list[dict]) -> str:
    """The innermost torch-dtr frame and the innermost frame of the program (or optimizer, DDP, autograd)."""
    ours = theirs = "-"
    for f in frames:
        name = f.get("filename", "")
        here = f"{name.split('/')[-1]}:{f.get('line')} {f.get('name')}"
        if "torch_dtr" in name:
            if ours == "-":
                ours = here
        elif any(k in name for k in ("benchmarks", "torch/optim", "torch/nn/parallel", "torch/autograd")):
            if theirs == "-":
                theirs = here
    return f"{ours} | {theirs}"


def live_at_peak(trace: list[dict]) -> tuple[int, dict[str, int]]:
    live: dict[int, tuple[int, str]] = {}
    cur = peak = 0
    best: dict[int, tuple[int, str]] = {}
    for e in trace:
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = (e["size"], where(e.get("frames", [])))
            cur += e["size"]
            if cur > peak:
                peak, best = cur, dict(live)
        elif a in ("free_completed",) and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
    groups: dict[str, int] = collections.Counter()
    for size, key in best.values():
        groups[key] += size
    return peak, groups


def run(kind: str, dtr: bool, size: dict) -> tuple[int, dict[str, int]]:
    import torch_dtr

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(size["width"]) for _ in range(size["depth"])]).cuda()
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(size["batch"], size["width"], device="cuda")
    for step in range(2):
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.memory._record_memory_history(max_entries=200000)
        if dtr:
            torch_dtr.enable()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dtr:
            torch_dtr.disable()
    torch.cuda.synchronize()
    mx = torch.cuda.max_memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, groups = live_at_peak(snap["device_traces"][0])
    print(f"{kind} {'torch-dtr' if dtr else 'plain'}: max_memory_allocated {mx / 2**20:.1f} MiB, "
          f"replayed peak {peak / 2**20:.1f} MiB", flush=True)
    del model, opt, x, loss
    torch.cuda.empty_cache()
    return mx, groups


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8192)
    a = ap.parse_args()
    size = {"width": a.width, "depth": a.depth, "batch": a.batch}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("nccl", rank=0, world_size=1)
    for kind in ("mlp", "ddp"):
        _, g0 = run(kind, False, size)
        _, g1 = run(kind, True, size)
        keys = sorted(set(g0) | set(g1), key=lambda k: -(g1.get(k, 0) - g0.get(k, 0)))
        print(f"{kind}: blocks alive at the peak, MiB (plain, torch-dtr), largest differences first")
        for k in keys[:12]:
            print(f"  {g0.get(k, 0) / 2**20:9.1f} {g1.get(k, 0) / 2**20:9.1f}  {k}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
