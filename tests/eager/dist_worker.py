"""Two CPU ranks (gloo) train a small MLP, with or without torch-dtr, under one of: FSDP2 (``fully_shard``
per layer, then the whole model; ``fsdp_keep``: with ``reshard_after_forward=False``), DDP, or tensor
parallelism (``parallelize_module``, column- then row-wise). Prints one JSON line: per rank, the losses, a
digest of the rank's parameters (local shards) and torch-dtr's counters. Used by test_distributed.py, which
runs it in a subprocess with a timeout (a hang fails).

    python tests/eager/dist_worker.py fsdp|fsdp_keep|ddp|tp plain|dtr|dtr_swap [BUDGET_BYTES]

(``dtr_swap``: torch-dtr with its host tier, ``enable(swap=True)``.) The front end is the test's
(``TORCH_DTR_FRONT``, inherited: tests/eager/conftest.py); each rank reports the one that ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, WIDTH, DEPTH, BATCH, STEPS = 2, 64, 6, 512, 3


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


def _model(program: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if program == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (WORLD,))
        model = torch.nn.Sequential(*[_Block() for _ in range(DEPTH // 2)])
        for m in model:
            parallelize_module(m, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return model
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                  for _ in range(DEPTH)])
    if program == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    keep = program == "fsdp_keep"  # parameters stay unsharded from forward to backward: recipes stay valid
    for m in model:
        fully_shard(m, reshard_after_forward=not keep)
    fully_shard(model, reshard_after_forward=not keep)
    return model


def rank_main(rank: int, port: int, program: str, mode: str, budget: int | None, q: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    import torch_dtr

    model = _model(program)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    x = torch.randn(BATCH, WIDTH)
    out: dict = {"rank": rank}
    if mode != "plain":
        torch_dtr.enable(budget, swap=mode.endswith("_swap"))
        out["front"] = torch_dtr.front()  # which front end ran: the test's (TORCH_DTR_FRONT, inherited)
    try:
        losses = []
        for _ in range(STEPS):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(torch_dtr.unwrap(loss).item())
        out["losses"] = losses
    except Exception as e:  # reported, so that the test shows what failed on which rank
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        if mode != "plain":
            st = dataclasses.asdict(torch_dtr.stats())
            torch_dtr.disable()
            out |= {"evictions": st["evictions"], "remats": st["rematerializations"], "peak": st["peak_bytes"],
                    "floor": st["floor_bytes"], "swaps_out": st["swaps_out"] or 0, "swaps_in": st["swaps_in"] or 0}
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(local.detach().contiguous().numpy().tobytes())
    out["digest"] = h.hexdigest()[:16]
    q.put(out)
    dist.destroy_process_group()


def main() -> None:
    program, mode = sys.argv[1], sys.argv[2]
    budget = int(sys.argv[3]) if len(sys.argv) > 3 else None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, program, mode, budget, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=240) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
