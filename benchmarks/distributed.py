"""What torch-dtr buys per rank under FSDP2, DDP and tensor parallelism (CPU, gloo): writes docs/distributed.md.

    python benchmarks/distributed.py [--out docs] [--world 2] [--steps 4]

Each program (an MLP of 8 blocks, width 512, batch 1024, AdamW) runs on WORLD spawned ranks, once per contender:
plain, activation checkpointing of every block (``torch.utils.checkpoint``; FSDP2 and DDP), torch-dtr with no
budget, and torch-dtr at a budget halfway between its single-op floor and its peak. Memory is torch-dtr's
tracked peak per rank (for plain and checkpointing: one more run under torch-dtr without a budget, which keeps
exactly what the program keeps); step: the median of the steps after one warm-up, on rank 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint

WIDTH, DEPTH, BATCH = 512, 8, 1024


class Block(torch.nn.Module):
    def __init__(self, ckpt: bool = False) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)
        self.ckpt = ckpt

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False) if self.ckpt else self.inner(x)


def build(program: str, ckpt: bool, world: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(ckpt) for _ in range(DEPTH)])
    if program == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if program == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        for m in model:
            parallelize_module(m, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return model
    from torch.distributed.fsdp import fully_shard

    keep = program == "fsdp, reshard_after_forward=False"
    for m in model:
        fully_shard(m, reshard_after_forward=not keep)
    fully_shard(model, reshard_after_forward=not keep)
    return model


def rank_main(rank: int, world: int, port: int, spec: dict, q: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch_dtr

    model = build(spec["program"], spec["ckpt"], world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    x = torch.randn(BATCH, WIDTH)
    out: dict = {"rank": rank}
    if spec["dtr"]:
        torch_dtr.enable(budget=spec["budget"])
    try:
        times = []
        for _ in range(spec["steps"]):
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            dist.barrier()
            times.append(time.perf_counter() - t0)
        out["step_s"] = statistics.median(times[1:])
    except Exception as e:  # reported, not raised: the other ranks would hang
        out["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        if spec["dtr"]:
            st = torch_dtr.stats()
            torch_dtr.disable()
            out |= {"peak": st.peak_bytes, "floor": st.floor_bytes, "evictions": st.evictions,
                    "remats": st.rematerializations}
    q.put(out)
    dist.destroy_process_group()


def run(spec: dict, world: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, spec, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = sorted((q.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    rows = []
    for program in ("fsdp", "fsdp, reshard_after_forward=False", "ddp", "tp"):
        base = {"program": program, "steps": a.steps, "budget": None}
        contenders = [("plain", {"ckpt": False, "dtr": False})]
        if program != "tp":
            contenders.append(("checkpoint every block", {"ckpt": True, "dtr": False}))
        contenders.append(("torch-dtr, no budget", {"ckpt": False, "dtr": True}))
        results = {}
        for label, c in contenders:
            print(f"{program}: {label}", file=sys.stderr, flush=True)
            r = run(base | c, a.world)
            if not c["dtr"]:  # its tracked memory: the same program under torch-dtr without a budget
                r0 = run(base | c | {"dtr": True, "steps": 2}, a.world)
                for x, y in zip(r, r0, strict=True):
                    x["peak"] = y.get("peak")
            results[label] = r
        free = results["torch-dtr, no budget"]
        budget = (max(r["floor"] for r in free) + min(r["peak"] for r in free)) // 2
        print(f"{program}: torch-dtr at {budget} B", file=sys.stderr, flush=True)
        results["torch-dtr, halfway between floor and peak"] = run(base | {"ckpt": False, "dtr": True,
                                                                          "budget": budget}, a.world)
        plain = results["plain"][0]
        for label, r in results.items():
            r0 = r[0]
            rows.append((program, label, max(x.get("peak") or 0 for x in r), r0.get("step_s"),
                         r0.get("step_s", 0) / plain["step_s"] if r0.get("step_s") else None,
                         r0.get("evictions", "-"), r0.get("remats", "-"), r0.get("error", "")))
    lines = ["# torch-dtr under torch.distributed", "",
             f"Measured {datetime.date.today().isoformat()}, {a.world} CPU ranks (gloo) on {os.cpu_count()} cores, "
             f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}. Command: "
             f"`python benchmarks/distributed.py --world {a.world} --steps {a.steps}`. An MLP of {DEPTH} residual "
             f"blocks (width {WIDTH}, 4x expansion, GELU), batch {BATCH} per rank, AdamW. Memory: the largest "
             "rank's tracked peak (parameters, optimizer state and activations the rank holds); step: rank 0's "
             "median after one warm-up.", "",
             "| program | contender | tracked peak per rank | step | vs plain | evictions | recomputations | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for program, label, peak, step, ratio, ev, rm, err in rows:
        lines.append(f"| {program} | {label} | {peak / 2**20:.1f} MiB | "
                     f"{'-' if step is None else f'{step * 1e3:.0f} ms'} | {'-' if ratio is None else f'{ratio:.2f}x'}"
                     f" | {ev} | {rm} | {err} |")
    lines += ["", "FSDP2's reshards pin what each layer computed from its parameters (NOTE [ Resharded parameters ]) "
              "and collectives' outputs are never recomputed, so under FSDP2 and tensor parallelism torch-dtr can "
              "evict only what lies between them; with `reshard_after_forward=False` FSDP2 keeps each layer's "
              "parameters from its forward to its backward and nothing is pinned. Two ranks share two cores "
              "here: step times move by about 10% between runs (torch-dtr below plain is that noise); read the "
              "memory column.", ""]
    path = Path(a.out) / "distributed.md"
    path.write_text("\n".join(lines))
    (Path(a.out) / "distributed.json").write_text(json.dumps(rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
