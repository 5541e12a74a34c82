"""Two CPU ranks (gloo) train a small MLP under FSDP2 (``fully_shard`` per layer, then the whole model), with
or without torch-dtr; prints one JSON line: per rank, the losses, a digest of the local parameter shards
and torch-dtr's counters. Used by test_fsdp.py, which runs it in a subprocess with a timeout (a hang fails).

    python tests/eager/fsdp_worker.py plain|dtr [BUDGET_BYTES]
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, WIDTH, DEPTH, BATCH, STEPS = 2, 64, 6, 512, 3


def rank_main(rank: int, port: int, mode: str, budget: int | None, q: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.fsdp import fully_shard

    import torch_dtr

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                  for _ in range(DEPTH)])
    for m in model:
        fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    x = torch.randn(BATCH, WIDTH)
    out: dict = {"rank": rank}
    if mode == "dtr":
        torch_dtr.enable(budget=budget)
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
        if mode == "dtr":
            st = torch_dtr.stats()
            torch_dtr.disable()
            out |= {"evictions": st.evictions, "remats": st.rematerializations, "peak": st.peak_bytes,
                    "floor": st.floor_bytes}
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(local.detach().contiguous().numpy().tobytes())
    out["digest"] = h.hexdigest()[:16]
    q.put(out)
    dist.destroy_process_group()


def main() -> None:
    mode = sys.argv[1]
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, mode, budget, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=240) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
