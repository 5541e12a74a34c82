"""What the front end needs to know about an aten operator, read once from its schema and tags."""

from __future__ import annotations

import torch

_RANDOM = torch.Tag.nondeterministic_seeded
# ops that alias an input without saying so in their schema
_UNANNOTATED_VIEWS = {"_unsafe_view", "_reshape_alias", "_unsafe_index_put", "unsafe_split", "unsafe_split_with_sizes",
                      "unsafe_chunk"}
# ops whose outputs we never evict: replaying them would repeat a side effect or cross devices, or give
# another value: linalg_lstsq's CPU "gelsy" driver (the default) reads an uninitialized pivot array, so the
# same call can return other solutions, even another rank (pytorch/pytorch#71222, #187411; fixed upstream
# after torch 2.13 by pytorch/pytorch#187436)
_NOT_REPLAYABLE = {"record_stream", "set_", "resize_", "resize_as_", "_local_scalar_dense", "linalg_lstsq"}
# ops that may copy across devices: replayable only when the output stays on the input's device
# arguments that batch-norm kernels update in training mode, whether or not the schema marks them written
_RUNNING_STATS = {"running_mean", "running_var"}
_MAY_CROSS_DEVICE = {"_to_copy", "to", "copy", "_copy_from", "_copy_from_and_resize"}
# ops whose schema says the output aliases the input, which return a new tensor when they convert or copy (they
# are CompositeImplicit, so they reach dispatch only from below autograd: a ZeroTensor's forward-mode tangent)
_MAYBE_ALIAS = {"to", "contiguous", "reshape", "reshape_as", "flatten", "type_as"}
# in-place ops that change only a tensor's view metadata (size, stride, offset), never its data
# ops whose size rule (sizes.py) is an upper bound: the exact bytes are learned after a call, per input shapes
_SIZE_BOUND = frozenset({"mkldnn_rnn_layer", "mse_loss", "smooth_l1_loss", "binary_cross_entropy", "soft_margin_loss"})
_RESTRIDE = {"t_", "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "swapdims_", "swapaxes_"}


class FuncInfo:
    """Schema facts about one OpOverload.

    - ``op``: the operator's C++ callable, for the per-op path (``func`` itself adds a Python frame).
    - ``returns[i]``: ``None`` for a fresh output, else ``(arg_pos, arg_name, writes)``: output ``i``
      aliases that argument, and ``writes`` says the op wrote it in place (``add_``, ``out=``).
    - ``mutated``: ``(arg_pos, arg_name)`` of every argument the schema marks as written.
    - ``random``: the op draws random numbers (replay its generator state when recomputing).
    - ``replayable``: running it again has no effect beyond its outputs.
    - ``cross_device``: may copy to another device; then its outputs are not replayable.
    - ``view_unannotated``: may alias an input without the schema saying so (checked by data pointer).
    - ``maybe_alias``: the schema says the output aliases an input, but it is new when the op converts (``to``).
    - ``hidden_writes``: ``(arg_pos, arg_name)`` of arguments the op writes in training mode although the
      schema does not say so (``native_batch_norm``'s running statistics), with ``training`` the position
      of the flag; see NOTE [ In-place mutation ] 4.
    - ``restrides``: changes only the view metadata of its first argument, in place (``t_``).
    - ``stats``: ``(arg_pos, arg_name)`` of running statistics the op reads or writes (batch norm, any mode);
      see NOTE [ In-place mutation ] 6.
    - ``simple``: every output is fresh, and none of the above applies (no writes, views, randomness, device
      crossing, learned sizes): the front end's short path (``Front._run_simple``) runs it.
    """

    __slots__ = ("func", "op", "name", "returns", "mutated", "random", "replayable", "view_unannotated",
                 "arg_names", "cross_device", "maybe_alias", "hidden_writes", "training", "fresh", "restrides",
                 "stats", "learns_size", "nested", "simple")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        self.func = func
        self.op = func._op  # the C++ callable (``func(...)`` is a Python call that makes this one)
        self.name = str(func)
        args = schema.arguments
        self.arg_names = tuple(a.name for a in args)
        positional = [a for a in args if not a.kwarg_only]

        def where(a: torch._C.Argument) -> tuple[int, str]:
            pos = positional.index(a) if not a.kwarg_only else 1 << 30
            return pos, a.name

        self.mutated = tuple(where(a) for a in args if a.alias_info is not None and a.alias_info.is_write)
        if func.namespace == "c10d" and func._overloadpacket.__name__.endswith("_") and args and not self.mutated:
            # c10d's in-place collectives (allreduce_, broadcast_, allgather_, recv_, ...) write their first
            # argument, which their schemas leave unmarked: a value they wrote is theirs alone (pinned), never
            # recomputed from what it was before
            self.mutated = (where(args[0]),)
        rets: list[tuple[int, str, bool] | None] = []
        for r in schema.returns:
            ai = r.alias_info
            if ai is None:
                rets.append(None)
                continue
            match = [a for a in args if a.alias_info is not None and (a.alias_info.before_set & ai.before_set)]
            if not match:
                match = [a for a in args if a.alias_info is not None]
            a = match[0]
            rets.append((*where(a), bool(a.alias_info.is_write)))
        self.returns = tuple(rets)
        # some output is a tensor with storage of its own (``.item()``'s ``_local_scalar_dense`` returns a number)
        self.fresh = any(r is None and "Tensor" in str(sr.type) for r, sr in zip(rets, schema.returns, strict=True))
        self.random = _RANDOM in func.tags
        # makes nested tensors (TransformerEncoder's fast path): not managed, so not managed for inference either
        self.nested = "_nested" in self.name
        packet = func._overloadpacket.__name__
        self.replayable = func.namespace in ("aten", "prims") and packet not in _NOT_REPLAYABLE
        self.view_unannotated = packet in _UNANNOTATED_VIEWS
        self.cross_device = packet in _MAY_CROSS_DEVICE
        self.maybe_alias = packet in _MAYBE_ALIAS and func.namespace == "aten"
        self.restrides = packet in _RESTRIDE and func.namespace == "aten"
        self.learns_size = packet in _SIZE_BOUND and func.namespace == "aten"  # NOTE [ Size prediction ] 6
        unmarked = [a for a in args if a.name in _RUNNING_STATS and (a.alias_info is None or not a.alias_info.is_write)]
        train = [a for a in args if a.name == "training"]
        self.hidden_writes = tuple(where(a) for a in unmarked) if train else ()
        self.training = where(train[0]) if train else (1 << 30, "")
        self.stats = tuple(where(a) for a in unmarked)  # running statistics read (eval) or written (training)
        self.simple = (self.fresh and self.replayable and all(r is None for r in rets) and not (
            self.mutated or self.hidden_writes or self.stats or self.random or self.view_unannotated or self.nested
            or self.cross_device or self.restrides or self.learns_size))

    def arg(self, pos_name: tuple[int, str], args: tuple, kwargs: dict) -> object:
        pos, name = pos_name
        return args[pos] if pos < len(args) else kwargs.get(name)


_INFOS: dict[torch._ops.OpOverload, FuncInfo] = {}


def info(func: torch._ops.OpOverload) -> FuncInfo:
    """The operator's facts, kept on the OpOverload itself (an attribute read costs a third of a dict lookup,
    whose key's ``__hash__`` is Python code); in a dict for one that takes no attributes."""
    try:
        return func._dtr_info  # type: ignore[attr-defined]
    except AttributeError:
        pass
    fi = _INFOS.get(func)
    if fi is None:
        fi = _INFOS[func] = FuncInfo(func)
        try:
            func._dtr_info = fi  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
    return fi
