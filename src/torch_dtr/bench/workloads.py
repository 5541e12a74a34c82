"""Benchmark workloads: real architectures nobody here wrote (Hugging Face ``transformers``, random
weights, no downloads) and one dynamic model whose graph changes every step.

A workload builds ``(model, batches, step)``: ``step(batch, before_backward)`` runs one training step
(forward, loss, backward, optimizer step) and returns the loss; ``before_backward()`` is called between
the forward and the backward pass (the memory timeline shades them). ``blocks(model)`` returns the lists
of repeated blocks that the checkpointing alternatives wrap.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..deps import need


@dataclass(frozen=True)
class Size:
    batch: int
    layers: int
    width: int
    seq: int  # GPT-2: tokens; ResNet: image side; LSTM: mean sequence length


SIZES: dict[str, dict[str, Size]] = {
    "gpt2": {"full": Size(4, 6, 512, 256), "quick": Size(2, 2, 128, 64), "demo": Size(8, 4, 256, 256)},
    "resnet50": {"full": Size(8, 50, 0, 128), "quick": Size(4, 8, 0, 64)},
    "lstm": {"full": Size(32, 1, 768, 96), "quick": Size(8, 1, 128, 24)},
    # GPT-2 small as released (vocabulary 50257), for GPUs (bench --device cuda)
    "gpt2-small": {"full": Size(4, 12, 768, 1024), "quick": Size(2, 2, 128, 64)},
}
DESCRIPTIONS = {
    "gpt2": "GPT-2 (transformers GPT2LMHeadModel), {layers} layers, width {width}, sequence {seq}, batch {batch}, "
            "vocabulary 16 x width",
    "gpt2-small": "GPT-2 small (transformers GPT2LMHeadModel), {layers} layers, width {width}, sequence {seq}, "
                  "batch {batch}, vocabulary 50257",
    "resnet50": "ResNet (transformers ResNetForImageClassification), depths {depths}, {seq}x{seq} images, "
                "batch {batch}",
    "lstm": "LSTM-cell loop, width {width}, batch {batch}, sequence length drawn from the data each step "
            "(mean {seq})",
}


def describe(name: str, size: Size) -> str:
    return DESCRIPTIONS[name].format(depths=_resnet_depths(size), **size.__dict__)


def _resnet_depths(size: Size) -> list[int]:
    return [3, 4, 6, 3] if size.layers == 50 else [1, 1, 1, 1]


def gpt2(layers: int, width: int, heads: int, seq: int, vocab: int) -> nn.Module:
    """GPT-2 (``transformers.GPT2LMHeadModel``) with random weights, in training mode, eager attention.

    The config sets what transformers would otherwise warn about on every construction: begin/end token
    ids inside the (small) vocabulary, and the loss the model computes from ``labels``.
    """
    transformers = need("transformers", "bench", "the GPT-2 workload")
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq, vocab_size=vocab,
                                  attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # the default it picks anyway, named so that it does not warn
    model.train()
    return model


def build(name: str, size: Size, steps: int, seed: int = 0) -> tuple[nn.Module, list[Any], Callable]:
    """The model (seeded), ``steps`` batches, and the training step function."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name in ("gpt2", "gpt2-small"):
        vocab = 50257 if name == "gpt2-small" else 16 * size.width
        model = gpt2(size.layers, size.width, max(1, size.width // 64), size.seq, vocab)
        batches = [torch.randint(0, vocab, (size.batch, size.seq), generator=g) for _ in range(steps)]

        def forward(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
            return m(input_ids=ids, labels=ids).loss
    elif name == "resnet50":
        transformers = need("transformers", "bench", "the ResNet workload")
        cfg = transformers.ResNetConfig(
            depths=_resnet_depths(size), num_labels=100,
            hidden_sizes=[256, 512, 1024, 2048] if size.layers == 50 else [64, 128, 256, 512],
            embedding_size=64 if size.layers == 50 else 32)
        model = transformers.ResNetForImageClassification(cfg)
        batches = [(torch.randn(size.batch, 3, size.seq, size.seq, generator=g),
                    torch.randint(0, 100, (size.batch,), generator=g)) for _ in range(steps)]

        def forward(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return m(pixel_values=b[0], labels=b[1]).loss
    elif name == "lstm":
        model = _LSTMLoop(size.width)
        rng = random.Random(seed)
        batches = []
        for _ in range(steps):
            n = rng.randint(size.seq * 3 // 4, size.seq * 5 // 4)
            batches.append((torch.randn(size.batch, n, 32, generator=g),
                            torch.randint(0, 10, (size.batch,), generator=g)))

        def forward(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return F.cross_entropy(m(b[0]), b[1])
    else:
        raise ValueError(f"torch_dtr bench: unknown workload {name!r}; choose from {sorted(SIZES)}")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(m: nn.Module, batch: Any, before_backward: Callable[[], None] | None = None) -> torch.Tensor:
        loss = forward(m, batch)
        if before_backward is not None:
            before_backward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return model, batches, step


class _LSTMLoop(nn.Module):
    """An LSTM cell stepped in Python; it stops early when the running state says so (data-dependent)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.cell = nn.LSTMCell(width, width)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[0], self.cell.hidden_size)
        xs = torch.tanh(self.inp(x))
        for t in range(x.shape[1]):
            h, c = self.cell(self.drop(xs[:, t]), (h, c))
            if t > 8 and float(h.detach().abs().mean()) < 1e-4:  # data-dependent exit (rarely taken)
                break
        return self.out(h)


CHECKPOINTABLE = ("gpt2", "gpt2-small", "resnet50")  # workloads with repeated blocks for torch.utils.checkpoint


def blocks(name: str, model: nn.Module) -> list[nn.ModuleList]:
    """The lists of repeated blocks that checkpointing wraps (per workload)."""
    if name in ("gpt2", "gpt2-small"):
        return [model.transformer.h]
    if name == "resnet50":
        return [stage.layers for stage in model.resnet.encoder.stages]
    return []


class _Segment(nn.Module):
    """Runs consecutive blocks under one non-reentrant checkpoint (the blocks' inputs are not kept)."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        def run(h: torch.Tensor) -> torch.Tensor:
            for p in self.parts:
                h = p(h, *args, **kwargs)
            return h

        return checkpoint(run, hidden, use_reentrant=False)


def checkpoint_blocks(name: str, model: nn.Module, every: str) -> int:
    """Wrap the model's blocks with ``torch.utils.checkpoint``: each block (``every="block"``) or segments
    of ceil(sqrt(n)) consecutive blocks (``every="sqrt"``, Chen et al.). Returns the number of segments.
    What a user writes for this is about 12 lines (the ``_Segment`` class and this loop)."""
    lists = blocks(name, model)
    if not lists:
        raise ValueError(f"torch_dtr bench: workload {name!r} has no repeated blocks to checkpoint")
    n = sum(len(lst) for lst in lists)
    k = 1 if every == "block" else math.ceil(math.sqrt(n))
    count = 0
    for lst in lists:
        parts = list(lst)
        segs = [_Segment(parts[i:i + k]) for i in range(0, len(parts), k)]
        lst._modules.clear()
        for i, s in enumerate(segs):
            lst.add_module(str(i), s)
        count += len(segs)
    return count


def digest(model: nn.Module) -> str:
    """A hash of every parameter's bytes: equal digests are bitwise equal parameters."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
