"""The bytes a compiled region's graphs allocate, in the order they run (NOTE [ Compiled regions under a
budget ] 2).

A value is counted from the op that makes it to the last op that reads it or a view of it; a graph's outputs
are held to its end (the caller keeps them). Inductor inlines a pointwise op into the pointwise ops and
reductions that read it, so such a value is never written to memory and what it reads lives on to its readers:
it is written only where a reader cannot inline it (a matrix product, a convolution, any kernel of its own), the
graph returns it, or inductor's thresholds for values read more than once say so (``_written``). A pointwise
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


# what inductor's lowering (torch 2.6-2.13) realizes of a pointwise value rather than inlining it into its readers
# (GraphLowering.run_node, StorageBox.should_realize_on_reuse): ops it calls heavy on the CPU, and its thresholds
# on the buffers an inlined expression reads and the ops it holds, (CPU, other devices)
_HEAVY = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
_READS = 4  # realize_reads_threshold: more reads than this, read by more than one op
_ACC_READS = {True: 12, False: 8}  # realize_*acc_reads_threshold: more than this, whatever reads it
_OPS = {True: 50, False: 30}  # realize_*opcount_threshold: more ops than this, read by more than one op


def _written(nodes: list[fx.Node], refs: dict[fx.Node, dict[int, int]],
             inline: bool = True) -> tuple[set[fx.Node], dict[fx.Node, set[int]]]:
    """The ops whose values inductor writes to memory, and for every node the storages reading it reads: its own
    where it is written (or an input), else those its inlined expression reads. ``inline=False``: every pointwise
    value read by more than one op is written."""
    kinds = {n: _kind(n) for n in nodes if n.op == "call_function"}
    cpu = all(t.device.type == "cpu" for n in nodes for t in _tensors(n.meta.get("val")))

    def readers(n: fx.Node) -> Iterable[fx.Node]:
        for u in n.users:
            if kinds.get(u) == "view":
                yield from readers(u)
            else:
                yield u

    out: set[fx.Node] = set()
    src: dict[fx.Node, set[int]] = {}
    made: set[int] = set()  # storages written (or handed in)
    heavy: dict[fx.Node, bool] = {}
    ops: dict[fx.Node, int] = {}
    for n in nodes:
        k = kinds.get(n)
        ins = [a for a in n.all_input_nodes if a in src]
        reads = set().union(*(src[a] for a in ins))
        if k == "view":
            own = refs[n].keys() & made
            src[n] = set(own) if own else reads
            heavy[n], ops[n] = any(heavy.get(a, False) for a in ins), sum(ops.get(a, 0) for a in ins)
            continue
        if k == "pointwise":
            inl = [a for a in ins if a not in out and kinds.get(a) in ("pointwise", "view")]
            heavy[n] = getattr(n.target, "overloadpacket", n.target).__name__ in _HEAVY or any(heavy[a] for a in inl)
            ops[n] = 1 + sum(ops[a] for a in inl)
            rs = list(readers(n))
            many = len(n.users) > 1
            if (any(u.op == "output" or kinds.get(u) == "kernel" for u in rs) or len(reads) > _ACC_READS[cpu]
                    or (many and (not inline or (cpu and heavy[n]) or ops[n] > _OPS[cpu] or len(reads) > _READS))):
                out.add(n)
            else:
                src[n] = reads  # inlined: its readers read what it reads
                continue
        elif k in ("kernel", "reduction"):
            out.add(n)
        src[n] = set(refs[n])
        made |= refs[n].keys()
        heavy[n], ops[n] = False, 0
    return out, src


def graph_bytes(gm: fx.GraphModule, given: dict[int, int] | None = None, inline: bool = True) -> GraphBytes:
    """``gm``'s bytes as it runs. ``given``: input storages (key -> bytes) that the graph is handed as its own,
    alive when it starts and freed after their last reader (a backward's saved values and incoming gradients);
    other inputs are not counted (they live on outside it). ``inline``: ``_written``'s."""
    nodes = list(gm.graph.nodes)
    refs = {n: _storages(n) for n in nodes}
    inputs: set[int] = set()
    for n in nodes:
        if n.op == "placeholder":
            inputs |= refs[n].keys()
    written, src = _written(nodes, refs, inline)
    end = len(nodes)
    last: dict[int, int] = {}
    reads: dict[fx.Node, set[int]] = {}
    for i, n in enumerate(nodes):
        reads[n] = set().union(*(src.get(a, refs[a].keys()) for a in n.all_input_nodes))
        for k in reads[n]:  # an inlined value is read where its readers run, later: the last reader wins
            last[k] = end if n.op == "output" else i
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
            dying = [size[k] for k in reads[n] if k in size and last.get(k) == i] if n in pointwise else []
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
    gradients, as the backward frees them and makes its own. The larger of two counts: values read more than once
    inlined as inductor's lowering decides, and all of them written. Inductor's scheduler then fuses and orders
    for peak memory, which neither models; where the two differ the larger errs towards keeping the budget (the
    first alone fell 7-10% short on MLPs, the second 13% on GPT-2 at activation memory budget 0.3)."""
    return max(_region_bytes(fw, bw, True), _region_bytes(fw, bw, False))


def _region_bytes(fw: fx.GraphModule, bw: fx.GraphModule, inline: bool) -> int:
    f = graph_bytes(fw, inline=inline)
    # the backward's own inputs: saved values the forward made and incoming gradients (not the forward's inputs,
    # which it may save too: parameters and the batch, named primals_*)
    given: dict[int, int] = {}
    for n in bw.graph.find_nodes(op="placeholder"):
        if not n.name.startswith("primals"):
            given.update(_storages(n))
    saved = sum(given.values())
    tangents = sum(sum(_storages(n).values()) for n in bw.graph.find_nodes(op="placeholder")
                   if n.name.startswith("tangents"))
    b = graph_bytes(bw, given, inline)
    # what the forward holds but the backward does not read (its outputs to the caller) stays alive meanwhile
    return max(f.peak, max(0, f.held + tangents - saved) + b.peak)
