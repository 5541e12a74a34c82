"""Partition plans applied live: a model's parameters and batch placed across a device mesh with DTensor.

    place = dtp.plan(model, lambda: step(model, x), devices=2, budget=64 << 20)   # one plain iteration, traced
    dtp.distribute(model, mesh, place)                                           # parameters become DTensors
    x = dtp.distribute_batch(x, mesh, place)
    follow = dtp.Follower(mesh, place)                                           # each op as planned (3)
    with follow:
        ... loss.backward(); dtp.reduce_grads(model); opt.step() ...             # grads as their parameters

NOTE [ Partition plans live ]
1. ``plan`` records one iteration of the plain program (``recorder.record``, modelled costs: the same plan in
   every process), plans it (``core.partition.Planner.search`` at the per-device budget) and returns where each
   parameter and the batch go: replicated, or sharded on a dimension. Every rank computes the same plan from
   the same recording; nothing is sent.
2. ``distribute`` turns each parameter into a DTensor with its placement; DTensor's own sharding propagation
   then places each op and redistributes where placements meet, from the parameters' placements alone, unless
   a ``Follower`` makes each op follow the plan (3): DTensor's own choices leave the plan's placements on 16-32%
   of the ops and hold 1.2-1.7x the followed plan's peak (the tests' MLP and a small GPT-2 on 2 and 4 ranks; at
   about 0.9 of the followed peak GPT-2 on 2 and 4 ranks and the MLP on 4 train only when followed; followed,
   the peak is 0.85-1.18x the modelled one: docs/partitioning.md). Collectives run
   under torch-dtr's session per rank, their outputs never replayed on one rank alone (NOTE [ Managed vs
   constant ] 7). Tensors the model makes itself (position ids) need DTensor's ``implicit_replication()``
   around the step; gradients go to their parameters' placements before the optimizer (``reduce_grads``).
3. ``Follower``, a dispatch mode entered around each step, runs the plan op by op. The plan keeps, for every op
   of the traced iteration, its name, its arguments' shapes, the placements its strategy wants of them and
   gives its outputs (``OpPlace``). An op with DTensor arguments is matched to the plan's next op of the same
   name and shapes within a window (32 ops); its arguments are redistributed to the wanted placements first
   (one shard dimension for another by an all-to-all, ``_all_to_all``: on a CPU mesh DTensor's own
   ``redistribute`` gathers the whole tensor, D shards per rank; below autograd: the graph keeps them as they
   were; the copy is freed after the op, so a tensor several ops want converted is converted for each, where
   the model keeps one copy to its last reader), and after it an
   output the plan reduces at once (NOTE [ Partition plans ] 6) or slices from a replicated one; DTensor's
   sharding propagation, given arguments in a strategy's placements, then runs that strategy. An argument
   written in place (the optimizer's updates), or viewed by an output whose storage is written in place, is
   never converted (``kept``): a copy would take the write. An op that matches nothing near the cursor runs
   on DTensor's own choice and the cursor stays (``unmatched``: the fallback where a step diverges from the
   traced one, another batch size or branch, or the first step making the optimizer's states). The plan holds
   only the ops on DTensors (what a parameter, its optimizer states or the batch flows into); plain ops never
   move the cursor (torch-dtr's recomputations are plain ops, and differ across ranks). Every step restarts
   at the plan's first op. ``Follower.stats`` counts all of this and the outputs that end in other placements than the
   plan's (``off_plan``); ``enforce=False`` only counts. Bitwise the same under torch-dtr as without, and on
   reruns (tests/eager/test_dtp.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .core.partition import ANY, Link, P, Place, Planner, R
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
    ops: tuple[OpPlace, ...] = ()  # the traced iteration's ops on DTensors, in program order, with placements


@dataclass(frozen=True, slots=True)
class OpPlace:
    """One op of the traced iteration as the plan runs it (NOTE [ Partition plans live ] 3)."""

    name: str  # as the recorder writes it: ``addmm.default``
    shapes: tuple[tuple[int, ...], ...]  # its tensor arguments' (logical) shapes, in the recorder's order
    ins: tuple[Place, ...]  # the placement each argument is wanted in (ANY: as it comes)
    outs: tuple[Place, ...]  # the placement each output is planned in
    reduce: tuple[Place, ...]  # per output: its placement once reduced right after the op, or ANY
    keep: frozenset[int]  # arguments never converted: written in place, or viewed by an output


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
    data = [index[batch_name]] if batch_name is not None and batch_name in index else planner.data()[:1]
    b = chosen.consts.get(data[0], R) if data else R
    # what becomes a DTensor (NOTE [ Partition plans live ] 3): the parameters, their optimizer states, the batch,
    # and what any op makes from one of them; the rest (step counts, masks made from scratch) stays plain
    dts = set(data) | {index[ln] for ln in log_names.values() if ln in index}
    dts |= {m for t in list(dts) for m in planner.groups.get(t, ())}
    ops = []
    for k, n in enumerate(g.nodes):
        if not any(i in dts or g.tensors[i].base in dts for i in n.ins):
            continue
        dts.update(n.outs)
        st = planner.strats[k][chosen.choice[k]]
        ops.append(OpPlace(n.name, tuple(g.tensors[i].shape for i in n.ins), st.ins, st.outs,
                           tuple(chosen.reduce.get(o, ANY) for o in n.outs),
                           frozenset(n.writes) | frozenset(v for v in n.views
                                                           if v >= 0 and g.tensors[g.tensors[n.ins[v]].base].written)))
    return Placement(params, b, cost.time, cost.peak, chosen.name, tuple(ops))


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


def _place_of(t: Any) -> Place:
    p = t.placements[0]
    if p.is_shard():
        return p.dim
    return P if p.is_partial() else R


def _flat(x: Any, out: list[Any]) -> None:  # the recorder's order: tensors, and tensors in lists and tuples
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif type(x) is list or type(x) is tuple:
        out.extend(y for y in x if isinstance(y, torch.Tensor))


def _swap(x: Any, new: dict[int, Any]) -> Any:
    if isinstance(x, torch.Tensor):
        return new.get(id(x), x)
    if type(x) is list or type(x) is tuple:
        return type(x)(new.get(id(y), y) if isinstance(y, torch.Tensor) else y for y in x)
    return x


def _convert(t: Any, want: Place, mesh: Any) -> Any:
    """``t`` in placement ``want``: one shard dimension for another by an all-to-all (``_all_to_all``), else
    DTensor's ``redistribute``; a shard cut from a whole tensor gets storage of its own (``_compact``)."""
    have = _place_of(t)
    if have >= 0 and want >= 0 and have != want:
        out = _all_to_all(t, have, want, mesh)
        if out is not None:
            return out
    return _compact(t.redistribute(mesh, [_dt(want)]))


def _all_to_all(t: Any, a: int, b: int, mesh: Any) -> Any:
    """``t``, sharded on dimension ``a``, sharded on ``b`` instead: each rank sends the others their pieces of its
    shard (one all-to-all) and joins what it gets along ``a``, holding about three shards at once. On a CPU mesh
    DTensor's own ``redistribute`` gathers the whole tensor first (D shards per device). None where the mesh has
    several dimensions or a dimension does not split evenly (DTensor's way then)."""
    from torch.distributed._functional_collectives import all_to_all_single, wait_tensor
    from torch.distributed.tensor import DTensor, Shard

    d = mesh.size()
    if mesh.ndim != 1 or t.shape[a] % d or t.shape[b] % d:
        return None
    loc = t._local_tensor
    order = [b] + [i for i in range(loc.dim()) if i != b]
    x = loc.permute(order).contiguous()  # dimension b first: the piece for rank j is its j-th block of rows
    y = wait_tensor(all_to_all_single(x, None, None, mesh.get_group(0)))
    del x
    pa = order.index(a)  # the block from rank i holds rank i's part of dimension a: join them there, in rank order
    y = y.view(d, y.shape[0] // d, *y.shape[1:]).movedim(0, pa)
    z = y.reshape(*y.shape[:pa], d * y.shape[pa + 1], *y.shape[pa + 2:])
    del y
    z = z.permute([order.index(i) for i in range(loc.dim())]).contiguous()
    return DTensor.from_local(z, mesh, [Shard(b)], run_check=False)


def _compact(t: Any) -> Any:
    """A shard cut from a whole tensor is a view of it (a slice; gloo's all-to-all gathers, then cuts): its own
    storage, so the whole one is freed."""
    from torch.distributed.tensor import DTensor

    loc = t._local_tensor
    if loc.untyped_storage().nbytes() <= loc.numel() * loc.element_size():
        return t
    return DTensor.from_local(loc.clone(), t.device_mesh, t.placements, run_check=False, shape=t.shape,
                              stride=t.stride())


@dataclass
class FollowStats:
    """What a ``Follower`` did (NOTE [ Partition plans live ] 3), summed over its steps."""

    followed: int = 0  # ops on DTensors matched to the plan
    converted: int = 0  # arguments redistributed before an op, or outputs sliced after one, as planned
    reduced: int = 0  # partial outputs reduced right after their op (NOTE [ Partition plans ] 6)
    kept: int = 0  # conversions the plan asked for on arguments written in place (left as they are)
    unmatched: int = 0  # DTensor ops not in the plan near its place: DTensor's own choice (the fallback)
    skipped: int = 0  # the plan's ops passed over to find the next match
    off_plan: int = 0  # outputs in another placement than the plan's, after following


class Follower(TorchDispatchMode):
    """NOTE [ Partition plans live ] 3: ``with follower:`` around each training step (forward, backward and
    the optimizer's step). ``enforce=False`` only counts where DTensor's own choices leave the plan."""

    def __init__(self, mesh: Any, place: Placement, window: int = 32, enforce: bool = True) -> None:
        super().__init__()
        if not place.ops:
            raise ValueError("torch_dtr: this Placement has no per-op plan (make it with dtp.plan())")
        self.mesh, self.ops, self.window, self.enforce = mesh, place.ops, window, enforce
        self.k = 0
        self.stats = FollowStats()
        self._names: dict[Any, str] = {}

    def __enter__(self) -> Follower:
        self.k = 0  # every step starts at the traced iteration's first op
        return super().__enter__()

    def _match(self, name: str, flat: list[Any]) -> int:
        ops, k = self.ops, self.k
        shapes = tuple(tuple(t.shape) for t in flat)
        for j in range(k, min(k + self.window, len(ops))):
            if ops[j].name == name and ops[j].shapes == shapes:
                return j
        return -1

    def _place(self, ts: list[Any], wants: tuple[Place, ...], skip: frozenset[int] = frozenset()) -> dict[int, Any]:
        from torch.distributed.tensor import DTensor

        new: dict[int, Any] = {}
        with torch.no_grad():  # below autograd: its graph holds the op's own arguments
            for i, (t, want) in enumerate(zip(ts, wants, strict=False)):
                if want == ANY or type(t) is not DTensor or id(t) in new or _place_of(t) == want:
                    continue
                if i in skip:
                    self.stats.kept += 1
                    continue
                new[id(t)] = _convert(t, want, self.mesh)
        return new

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        from torch.distributed.tensor import DTensor

        kwargs = kwargs or {}
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = str(func).removeprefix("aten.")
        flat: list[Any] = []
        for a in args:
            _flat(a, flat)
        for a in kwargs.values():
            _flat(a, flat)
        st = self.stats
        if not any(type(t) is DTensor for t in flat):  # plain: the program's (an optimizer's step count) or
            return func(*args, **kwargs)  # torch-dtr's recomputations, which differ across ranks: never matched
        j = self._match(name, flat)
        if j < 0:  # not in the traced iteration here: DTensor's own choice
            st.unmatched += 1
            return func(*args, **kwargs)
        st.followed += 1
        st.skipped += j - self.k
        self.k = j + 1
        op = self.ops[j]
        if self.enforce:
            new = self._place(flat, op.ins, op.keep)
            if new:
                st.converted += len(new)
                args = tuple(_swap(a, new) for a in args)
                kwargs = {k: _swap(v, new) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        outs: list[Any] = []
        _flat(out, outs)
        want = tuple(o if r == ANY else r for o, r in zip(op.outs, op.reduce, strict=True))
        if self.enforce and not op.keep:  # reduced at once, or sliced from a replicated output (local)
            with torch.no_grad():
                new = {id(o): _convert(o, w, self.mesh) for o, w in zip(outs, want, strict=False)
                       if type(o) is DTensor and w != ANY and w != P and _place_of(o) in (P, R) and _place_of(o) != w}
            if new:
                st.reduced += sum(1 for o in outs if id(o) in new and _place_of(o) == P)
                st.converted += sum(1 for o in outs if id(o) in new and _place_of(o) == R)
                out = _swap(out, new)
                outs = [new.get(id(o), o) for o in outs]
        st.off_plan += sum(1 for o, w in zip(outs, want, strict=False)
                           if type(o) is DTensor and w != ANY and _place_of(o) != w)
        return out
