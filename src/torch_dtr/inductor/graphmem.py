"""The bytes a compiled region's graphs allocate, in the order they run (NOTE [ Compiled regions under a
budget ] 2).

A value is counted from the op that makes it to the last op that reads it or a view of it; a graph's outputs
are held to its end (the caller keeps them). Inductor fuses a pointwise op into the pointwise ops and
reductions that read it, so such a value is never written to memory: it is counted only where a reader
cannot fuse it (a matrix product, a convolution, any kernel of its own) or the graph returns it. A pointwise
kernel writes its output into an input of the same bytes whose last reader it is (inductor's in-place buffers).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

# reductions inductor lowers to loops of its own, into which the pointwise ops that feed them fuse
_REDUCTIONS = frozenset({"sum", "mean", "var_mean", "var", "std", "amax", "amin", "max", "min", "argmax", "argmin",
                         "prod", "logsumexp", "any", "all", "norm", "linalg_vector_norm"})


@dataclass(frozen=True)
class GraphBytes:
    peak: int  # the most bytes alive at once while the graph runs (fresh ones, and inputs it was given)
    held: int  # fresh bytes the outputs hold when it returns


def _hint(x: Any) -> int:
    if isinstance(x, torch.SymInt):
        node = x.node
        return int(node.hint if node.hint is not None else node.shape_env.size_hint(node.expr))
    return int(x)


def _tensors(val: Any) -> Iterable[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        yield val
    elif isinstance(val, (list, tuple)):
        for v in val:
            yield from _tensors(v)


def _storages(n: fx.Node) -> dict[int, int]:
    """The storages (key -> bytes) of the values node ``n`` stands for."""
    out: dict[int, int] = {}
    for t in _tensors(n.meta.get("val")):
        if t.layout != torch.strided:
            continue
        s = t.untyped_storage()
        out[s._cdata] = _hint(s.nbytes())
    return out


def _kind(n: fx.Node) -> str:
    """"view", "pointwise", "reduction" or "kernel" (anything that writes its output with a kernel of its own)."""
    t = n.target
    if t is operator.getitem:
        return "view"
    schema = getattr(t, "_schema", None)
    if schema is not None and schema.returns and schema.returns[0].alias_info is not None \
            and not schema.returns[0].alias_info.is_write:
        return "view"
    if torch.Tag.pointwise in getattr(t, "tags", ()):
        return "pointwise"
    packet = getattr(t, "overloadpacket", None)
    if packet is not None and packet.__name__ in _REDUCTIONS:
        return "reduction"
    return "kernel"


def _written(nodes: list[fx.Node]) -> set[fx.Node]:
    """The ops whose values inductor writes to memory."""
    kinds = {n: _kind(n) for n in nodes if n.op == "call_function"}

    def readers(n: fx.Node) -> Iterable[fx.Node]:
        for u in n.users:
            if kinds.get(u) == "view":
                yield from readers(u)
            else:
                yield u

    out = set()
    for n, k in kinds.items():
        if k in ("kernel", "reduction"):
            out.add(n)
        elif k == "pointwise":
            rs = set(readers(n))
            if len(rs) > 1 or any(u.op == "output" or kinds.get(u) == "kernel" for u in rs):
                out.add(n)
    return out


def graph_bytes(gm: fx.GraphModule, given: dict[int, int] | None = None) -> GraphBytes:
    """``gm``'s bytes as it runs. ``given``: input storages (key -> bytes) that the graph is handed as its own,
    alive when it starts and freed after their last reader (a backward's saved values and incoming gradients);
    other inputs are not counted (they live on outside it)."""
    nodes = list(gm.graph.nodes)
    refs = {n: _storages(n) for n in nodes}
    inputs: set[int] = set()
    for n in nodes:
        if n.op == "placeholder":
            inputs |= refs[n].keys()
    end = len(nodes)
    last: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            for k in refs[a]:
                last[k] = end if n.op == "output" else i
    written = _written(nodes)
    pointwise = {n for n in written if _kind(n) == "pointwise"}
    frees: dict[int, list[int]] = {}
    size: dict[int, int] = dict(given or {})
    live = sum(size.values())
    for k in size:
        frees.setdefault(last.get(k, -1), []).append(k)
    live -= sum(size[k] for k in frees.pop(-1, ()))
    peak = live
    for i, n in enumerate(nodes):
        inplace = 0
        if n in written:
            # a pointwise kernel writes an output in place of an input of the same bytes that dies here
            dying = [size[k] for a in n.all_input_nodes for k in refs[a] if k in size and last.get(k) == i] \
                if n in pointwise else []
            for k, b in refs[n].items():
                if k in inputs or k in size:
                    continue
                size[k] = b
                live += b
                frees.setdefault(max(last.get(k, i), i), []).append(k)
                if b in dying:
                    dying.remove(b)
                    inplace += b
        peak = max(peak, live - inplace)
        for k in frees.pop(i, ()):
            live -= size[k]
    return GraphBytes(peak, live)


def region_bytes(fw: fx.GraphModule, bw: fx.GraphModule) -> int:
    """The most bytes a training region holds at once beyond what lives outside it: its forward's peak, or, in
    its backward, what the forward left (its outputs, the values saved for the backward) with the incoming
    gradients, as the backward frees them and makes its own."""
    f = graph_bytes(fw)
    # the backward's own inputs: saved values the forward made and incoming gradients (not the forward's inputs,
    # which it may save too: parameters and the batch, named primals_*)
    given: dict[int, int] = {}
    for n in bw.graph.find_nodes(op="placeholder"):
        if not n.name.startswith("primals"):
            given.update(_storages(n))
    saved = sum(given.values())
    tangents = sum(sum(_storages(n).values()) for n in bw.graph.find_nodes(op="placeholder")
                   if n.name.startswith("tangents"))
    b = graph_bytes(bw, given)
    # what the forward holds but the backward does not read (its outputs to the caller) stays alive meanwhile
    return max(f.peak, max(0, f.held + tangents - saved) + b.peak)
