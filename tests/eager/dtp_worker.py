"""CPU ranks (gloo) train an MLP under a partition plan (NOTE [ Partition plans live ]): the plan is made from
one recorded plain iteration at a per-rank budget, parameters and batch placed with DTensor, each rank under
``torch_dtr.enable(budget)`` (or plain). Prints one JSON line: per rank, the losses, a digest of its local
parameters, the plan's placements and torch-dtr's counters. Used by test_dtp.py (in a subprocess, with a
timeout).

    [DTP_PLAN=dp|fsdp|tp|dtp] [DTP_MODEL=mlp|gpt2] python tests/eager/dtp_worker.py WORLD plain|dtr|single \
        [BUDGET] [PLAN_BUDGET]

``single``: one process, no mesh, the same model and batch: the reference losses.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WIDTH, DEPTH, BATCH, STEPS = 256, 4, 64, 3
MODEL = os.environ.get("DTP_MODEL", "mlp")  # or "gpt2": the bench's GPT-2, small, dropout off
PEAKS: list[int] = []  # torch-dtr's peak in each step, this process
COMMS: list[dict] = []  # collectives per step, this process
DIVERGE = bool(os.environ.get("DTP_DIVERGE"))
TIMES: list[float] = []  # seconds per step, this process


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    if MODEL == "gpt2":
        from torch_dtr.bench.workloads import gpt2

        m = gpt2(2, 128, 2, 64, 2048)
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0  # DTensor draws its own random numbers: the losses compare with dropout off
        return m
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Tanh(), torch.nn.Linear(4 * WIDTH, WIDTH)]
    return torch.nn.Sequential(*layers)


def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if MODEL == "gpt2":
        return torch.randint(0, 2048, (4, 64), generator=g)
    return torch.randn(BATCH, WIDTH, generator=g)


def _loss(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if MODEL == "gpt2":
        return model(input_ids=x, labels=x).loss
    return model(x).pow(2).mean()


class _Comms:
    """Counts the collectives DTensor runs (its own and the follower's) and the bytes they send, per step."""

    def __init__(self) -> None:
        import torch.distributed._functional_collectives as funcol

        self.counts: dict[str, float] = {}
        if not hasattr(funcol, "_dtp_counts"):
            funcol._dtp_counts = [None]
            for n in ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
                      "all_gather_tensor", "reduce_scatter_tensor"):
                setattr(funcol, n, functools.partial(_counted, getattr(funcol, n), n, funcol._dtp_counts))
        funcol._dtp_counts[0] = self.counts

    def __enter__(self) -> _Comms:
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed._functional_collectives as funcol

        funcol._dtp_counts[0] = None


def _counted(f, name: str, where: list, x: torch.Tensor, *a, **k):
    c = where[0]
    if c is not None:
        c[name] = c.get(name, 0) + 1
        c["bytes"] = c.get("bytes", 0) + x.numel() * x.element_size()
    return f(x, *a, **k)


def _train(model: torch.nn.Module, x: torch.Tensor, value, follow=None) -> list[float]:
    import contextlib

    from torch.distributed.tensor.experimental import implicit_replication

    import torch_dtr
    from torch_dtr import dtp

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    losses = []
    for i in range(STEPS):
        xb = x[: x.shape[0] // 2] if DIVERGE and i == 1 else x  # the second step diverges from the traced one
        t0 = time.perf_counter()
        comm = _Comms()
        with comm, follow or contextlib.nullcontext():  # the plan's placements op by op, or DTensor's own choices
            with implicit_replication():  # tensors the model makes itself (GPT-2's position ids) are replicated
                loss = _loss(model, xb)
                loss.backward()
            dtp.reduce_grads(model)
            opt.step()
            opt.zero_grad()
        if torch_dtr.enabled():
            PEAKS.append(torch_dtr.stats().peak_bytes)
            torch_dtr.reset_peak()
        COMMS.append({str(k): v for k, v in comm.counts.items()})
        losses.append(value(loss))
        TIMES.append(time.perf_counter() - t0)
    return losses


def _plan(world: int, budget: int | None, kind: str):
    from torch_dtr import dtp

    m = _model()
    x = _batch()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)

    def step() -> None:
        _loss(m, x).backward()
        opt.step()
        opt.zero_grad()

    step()  # the optimizer's states exist from here
    return dtp.plan(m, step, world, budget, batch=x, kind=kind)


def _all_to_all_check(world: int) -> dict:
    """Every Shard(a) -> Shard(b) of a few tensors by ``dtp._all_to_all`` against DTensor's ``redistribute``: plain,
    then under torch-dtr at a budget that evicts (the all-to-all's output is a collective's: pinned). Under
    no_grad, so that ops on plain tensors are managed (NOTE [ Managed vs constant ] 5)."""
    from torch.distributed.device_mesh import init_device_mesh

    import torch_dtr

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    bad: list = []
    checked = 0
    for managed in (False, True):
        if managed:
            torch_dtr.enable(budget=384 << 10)
        with torch.no_grad():
            for shape in [(8, 12), (4, 8, 16), (2, 4, 8, 4), (12, 4, 8)]:
                full = torch.randn(*shape, generator=g)
                for a in range(len(shape)):
                    for b in range(len(shape)):
                        if a != b and shape[a] % world == 0 and shape[b] % world == 0:
                            checked += 1
                            if not _same_shards(full, a, b, mesh):
                                bad.append([list(shape), a, b, managed])
    st = torch_dtr.stats()
    torch_dtr.disable()
    return {"checked": checked, "mismatches": bad, "evictions": st.evictions, "ops": st.ops}


def _same_shards(full: torch.Tensor, a: int, b: int, mesh) -> bool:
    from torch.distributed.tensor import Shard, distribute_tensor

    import torch_dtr
    from torch_dtr.dtp import _all_to_all

    t = distribute_tensor(full, mesh, [Shard(a)])
    base = t._local_tensor.sum() + torch.arange(16384.0)
    ballast = [base * k for k in range(8)]  # 512 KiB: evictions
    got = _all_to_all(t, a, b, mesh)
    want = t.redistribute(mesh, [Shard(b)])
    sums = [float(x.sum()) for x in ballast]  # (read back after the all-to-all: recomputed where evicted)
    return (tuple(got.placements) == (Shard(b),) and got.shape == want.shape
            and torch.equal(torch_dtr.unwrap(got._local_tensor), torch_dtr.unwrap(want._local_tensor))
            and sums == [float(x.sum()) for x in ballast])


def rank_main(rank: int, world: int, port: int, mode: str, budget: int | None, plan_budget: int | None,
              q: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    import torch_dtr
    from torch_dtr import dtp

    out: dict = {"rank": rank}
    if mode == "alltoall":
        q.put(out | _all_to_all_check(world))
        dist.destroy_process_group()
        return
    place = _plan(world, plan_budget, os.environ.get("DTP_PLAN", "dtp"))
    out["plan"] = {"name": place.name, "batch": place.batch, "params": place.params,
                   "modelled_peak": place.peak_bytes}
    mesh = init_device_mesh("cpu", (world,))
    model = dtp.distribute(_model(), mesh, place)
    x = dtp.distribute_batch(_batch(), mesh, place)
    if mode == "dtr":
        torch_dtr.enable(budget)
    try:
        how = os.environ.get("DTP_FOLLOW", "")
        follow = dtp.Follower(mesh, place, enforce=how != "observe") if how else None
        out["losses"] = _train(model, x, lambda loss: torch_dtr.unwrap(loss.full_tensor()).item(), follow)
        if follow is not None:
            out["follow"] = dataclasses.asdict(follow.stats)
    except Exception as e:  # reported, so that the test shows what failed on which rank
        out["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    finally:
        if mode == "dtr":
            st = dataclasses.asdict(torch_dtr.stats())
            torch_dtr.disable()
            out |= {k: st[k] for k in ("evictions", "rematerializations", "peak_bytes", "floor_bytes")}
            out["peak_bytes"] = max([st["peak_bytes"], *PEAKS])  # (reset after every step)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.to_local().detach().contiguous().numpy().tobytes())
    out["digest"] = h.hexdigest()[:16]
    out["step_seconds"] = TIMES
    out["comms"] = COMMS
    out["step_peaks"] = PEAKS
    q.put(out)
    dist.destroy_process_group()


def main() -> None:
    world, mode = int(sys.argv[1]), sys.argv[2]
    budget = int(sys.argv[3]) if len(sys.argv) > 3 else None
    plan_budget = int(sys.argv[4]) if len(sys.argv) > 4 else budget
    plan_budget = None if plan_budget is not None and plan_budget < 0 else plan_budget  # -1: plan without one
    if mode == "single":
        print(json.dumps([{"losses": _train(_model(), _batch(), lambda loss: loss.item())}]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, mode, budget, plan_budget, q))
             for r in range(world)]
    for p in procs:
        p.start()
    results = sorted((q.get(timeout=240) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join(timeout=60)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
