"""Which allocations pass a native budget on CUDA: the MLP of tests/native/test_device_native.py (budget 60% of
plain's peak) under the native front end with PyTorch's allocation history recorded; prints each allocation at
which the allocator's count passed the budget (bytes over, size, the Python frames that asked), grouped by where.

    PYTHONPATH=src python benchmarks/experiments/native/overshoot.py [RATIO]
"""

from __future__ import annotations

import collections
import sys

import torch

from torch_dtr import native


def run(budget: int | None, record: bool = False) -> tuple[list[float], int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU())
                                  for _ in range(8)], torch.nn.Linear(1024, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    g = torch.Generator(device="cuda").manual_seed(1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if record:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    start = torch.cuda.memory_allocated()
    if budget is not None:
        native.enable(budget)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(8192, 1024, device="cuda", generator=g)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    if budget is not None:
        st = native.stats()
        print(f"core: peak counted {st['peak_bytes']:,} B, outside {st['outside_bytes']:,} B, syncs {st['syncs']}, "
              f"evictions {st['evictions']}")
        native.disable()
    torch.cuda.synchronize()
    if record:
        where(torch.cuda.memory._snapshot(), start, budget or 0)
        torch.cuda.memory._record_memory_history(enabled=None)
    return losses, torch.cuda.max_memory_allocated()


def where(snapshot: dict, start: int, budget: int) -> None:
    cur, over = start, collections.defaultdict(lambda: [0, 0, 0])
    shown = 0
    for e in snapshot["device_traces"][0]:
        a, size = e["action"], int(e.get("size", 0))
        if a == "alloc":
            cur += size
            if cur > budget:
                frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])
                          if "torch_dtr" not in f["filename"]][:5]
                key = " < ".join(frames[:3])
                o = over[key]
                o[0] += 1
                o[1] = max(o[1], cur - budget)
                o[2] = max(o[2], size)
                if shown < 6:
                    shown += 1
                    print(f"over by {cur - budget:,} B at an allocation of {size:,} B: " + " < ".join(frames))
        elif a == "free_completed":
            cur -= size
    print(f"{len(over)} places passed the budget:")
    for key, (n, most, size) in sorted(over.items(), key=lambda kv: -kv[1][1]):
        print(f"  {n:4d} times, up to {most:,} B over, largest {size:,} B: {key}")


def main() -> None:
    ratio = float(sys.argv[1]) if len(sys.argv) > 1 else 0.6
    losses, peak = run(None)
    budget = int(peak * ratio)
    got, got_peak = run(budget, record=True)
    print(f"plain peak {peak:,} B; budget {budget:,} B ({ratio:.0%}); native peak {got_peak:,} B "
          f"({got_peak - budget:+,} B); bitwise {got == losses}")


if __name__ == "__main__":
    main()
