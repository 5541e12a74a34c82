"""Partition plans applied live: a model's parameters and batch placed across a device mesh with DTensor.

    place = dtp.plan(model, lambda: step(model, x), devices=2, budget=64 << 20)   # one plain iteration, traced
    dtp.distribute(model, mesh, place)                                           # parameters become DTensors
    x = dtp.distribute_batch(x, mesh, place)
    ... loss.backward(); dtp.reduce_grads(model); opt.step() ...                 # grads as their parameters

NOTE [ Partition plans live ]
1. ``plan`` records one iteration of the plain program (``recorder.record``, modelled costs: the same plan in
   every process), plans it (``core.partition.Planner.search`` at the per-device budget) and returns where each
   parameter and the batch go: replicated, or sharded on a dimension. Every rank computes the same plan from
   the same recording; nothing is sent.
2. ``distribute`` turns each parameter into a DTensor with its placement; DTensor's own sharding propagation
   then places each op and redistributes where placements meet (the plan's per-op choices are not enforced:
   where DTensor picks another strategy for an op, the plan's modelled time is not what runs). Collectives run
   under torch-dtr's session per rank, their outputs never replayed on one rank alone (NOTE [ Managed vs
   constant ] 7). Tensors the model makes itself (position ids) need DTensor's ``implicit_replication()``
   around the step; gradients go to their parameters' placements before the optimizer (``reduce_grads``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .core.partition import Link, Place, Planner, R
from .recorder import record
from .sim import log as L
from .sim import partition as sp


@dataclass(frozen=True)
class Placement:
    params: dict[str, Place]  # parameter name -> R or a shard dimension
    batch: Place
    step_seconds: float  # modelled, per device
    peak_bytes: int  # modelled per device, without eviction
    name: str  # the plan that won: dp, fsdp, tp or dtp


def plan(model: torch.nn.Module, step: Callable[[], object], devices: int, budget: int | None = None,
         gbps: float = 10.0, batch: torch.Tensor | None = None, kind: str = "dtp") -> Placement:
    """NOTE [ Partition plans live ] 1. ``step()`` runs one plain iteration (it is run once, recorded);
    ``batch``: the input tensor whose placement to report (the first constant the iteration reads that is not
    model state, if not given). ``kind``: the planner's plan (``dtp``) or a fixed one (``dp``, ``fsdp``,
    ``tp``)."""
    names = {id(p): n for n, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.log"
        with record(path, costs="model") as rec:
            step()
            log_names = {n: rec.name(p) for p, n in ((p, names[id(p)]) for p in model.parameters())}
            batch_name = rec.name(batch) if batch is not None else None
        lg = L.read(path)
    g = sp.graph(lg)
    planner = Planner(g, Link(devices, gbps * 1e9))
    order = [i.name for i in lg.measured if type(i) is L.Constant]  # log names of the graph's constants, in order
    consts = [i for i, t in enumerate(g.tensors) if t.const and t.base == i]
    index = dict(zip(order, consts, strict=True))
    chosen = planner.search(budget) if kind == "dtp" else planner.fixed(kind)
    cost = planner.cost(chosen)
    params = {n: chosen.consts.get(index[ln], R) if ln in index else R for n, ln in log_names.items()}
    if batch_name is not None and batch_name in index:
        b = chosen.consts.get(index[batch_name], R)
    else:
        data = planner.data()
        b = chosen.consts.get(data[0], R) if data else R
    return Placement(params, b, cost.time, cost.peak, chosen.name)


def _dt(p: Place) -> object:
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if p < 0 else Shard(p)


def distribute(model: torch.nn.Module, mesh: object, place: Placement) -> torch.nn.Module:
    """NOTE [ Partition plans live ] 2: every parameter a DTensor placed as planned (in place)."""
    from torch.distributed.tensor import distribute_tensor

    new: dict[int, torch.nn.Parameter] = {}
    for name, p in model.named_parameters():  # (a tied parameter is listed once)
        dt = distribute_tensor(p.detach(), mesh, [_dt(place.params.get(name, R))])
        new[id(p)] = torch.nn.Parameter(dt, requires_grad=p.requires_grad)
    for mod in model.modules():  # every module that holds one, tied ones included
        for attr, p in list(mod._parameters.items()):
            if p is not None and id(p) in new:
                setattr(mod, attr, new[id(p)])
    return model


def reduce_grads(model: torch.nn.Module) -> None:
    """Each gradient in its parameter's placement (DTensor leaves a gradient as its last op made it: partial
    sums, or another shard), as the optimizer needs; call between ``backward()`` and ``step()``."""
    for p in model.parameters():
        g = p.grad
        if g is not None and hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


def distribute_batch(x: torch.Tensor, mesh: object, place: Placement) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(x, mesh, [_dt(place.batch)])
