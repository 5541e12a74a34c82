"""Small, fast model builders for the end-to-end equivalence tests.

Every builder returns ``(model, make_batch, loss_fn)``:

- ``model``: an ``nn.Module`` (built from the global torch RNG: seed before calling the builder);
- ``make_batch(seed) -> (inputs, targets)``: a deterministic batch for that seed. ``inputs`` is a tuple
  of positional arguments for ``model`` (a dict for keyword arguments);
- ``loss_fn(output, targets) -> scalar tensor``.

The models are chosen to cover the semantics a rematerializing runtime must preserve: views and in-place
ops (ReLU(inplace), residual adds, ``index_add_``), randomness (dropout everywhere), BatchNorm's in-place
running statistics, data-dependent control flow and shapes (``.item()`` on managed values, ``nonzero``,
``topk``) and many short-lived tensors (tree recursion). A plain training step takes 5-40 ms on one core;
under torch_dtr without a budget 50-200 ms. Activations dominate the parameters, so budgets of 50% and
30% of the unconstrained peak stay well above the constant bytes.
"""

from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- 1. MLP
def mlp():
    # activations (batch 512 x width 48, twelve layers) dominate the parameters, so that a budget of 30% of
    # the unconstrained peak leaves room for evictions
    acts = [nn.ReLU(), nn.GELU(), nn.Tanh(), nn.SiLU(), nn.ReLU(), nn.GELU(), nn.Tanh(), nn.SiLU(), nn.ReLU(),
            nn.GELU(), nn.Tanh()]
    layers: list[nn.Module] = [nn.Linear(16, 48)]
    for act in acts:
        layers += [act, nn.Linear(48, 48)]
    layers[-1] = nn.Linear(48, 10)
    model = nn.Sequential(*layers)

    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(512, 16, generator=g)
        y = torch.randint(0, 10, (512,), generator=g)
        return (x,), y

    return model, make_batch, F.cross_entropy


# ---------------------------------------------------------------- 2. CNN: BatchNorm, dropout, residuals
class _ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.drop = nn.Dropout2d(0.1)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)), inplace=True)
        h = self.drop(h)
        h = self.bn2(self.conv2(h))
        h += x  # in-place residual add
        return F.relu(h)


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(inplace=True))
        self.block1 = nn.Sequential(_ResBlock(8), _ResBlock(8), _ResBlock(8))
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block2 = nn.Sequential(_ResBlock(16), _ResBlock(16))
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = self.stem(x)
        h = self.block1(h)
        h = self.down(h)
        h = self.block2(h) + h  # out-of-place outer skip
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(self.drop(h))


def cnn():
    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(8, 3, 16, 16, generator=g),), torch.randint(0, 10, (8,), generator=g)

    return _CNN(), make_batch, F.cross_entropy


# ---------------------------------------------------------------- 3. transformer stack
class _Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(p)

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + self.drop(a)
        return x + self.drop(self.ff(self.ln2(x)))


class _Transformer(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 32, heads: int = 4, layers: int = 2, seq: int = 32,
                 p: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(_Block(d, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.drop(self.tok(ids) + self.pos[:t])
        for b in self.blocks:
            x = b(x, mask)
        return self.out(self.ln(x))


def transformer():
    vocab = 50

    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (8, 32), generator=g)
        return (ids,), torch.roll(ids, -1, dims=1)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return _Transformer(vocab), make_batch, loss_fn


# ---------------------------------------------------------------- 4. LSTM-cell loop, data-dependent length
class _LSTMLoop(nn.Module):
    """Runs an ``LSTMCell`` for a number of steps read from the data, and stops early when the hidden
    state's mean magnitude (a managed value, read with ``.item()``) passes a threshold."""

    def __init__(self, d_in: int = 8, d_h: int = 48, n_out: int = 5) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(d_in, d_h)
        self.head = nn.Linear(d_h, n_out)
        self.d_h = d_h

    def forward(self, x, lengths):
        b = x.shape[0]
        steps = int(lengths.max())  # from the batch's values
        h = torch.zeros(b, self.d_h)
        c = torch.zeros(b, self.d_h)
        outs = []
        for t in range(steps):
            h_new, c_new = self.cell(x[:, t], (h, c))
            keep = (t < lengths).float().unsqueeze(1)  # sequences that already ended keep their state
            h = keep * h_new + (1 - keep) * h
            c = keep * c_new + (1 - keep) * c
            outs.append(h)
            # data-dependent early exit on a managed value: with the harness's seeds, the three training
            # steps stop after 9 of 10, 7 of 12 and 4 of 11 steps
            if t >= 3 and h.abs().mean().item() > 0.068:
                break
        return self.head(torch.stack(outs, 1).mean(1))


def lstm_loop():
    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 16, 8, generator=g)
        lengths = (x[:, :, 0].abs().sum(1) * 0.7).long().clamp(4, 16)  # derived from the values
        y = torch.randint(0, 5, (32,), generator=g)
        return (x, lengths), y

    return _LSTMLoop(), make_batch, F.cross_entropy


# ---------------------------------------------------------------- 5. recursive tree network
def _random_tree(rng: random.Random, leaves: list[int]):
    if len(leaves) == 1:
        return leaves[0]
    k = rng.randint(1, len(leaves) - 1)
    return (_random_tree(rng, leaves[:k]), _random_tree(rng, leaves[k:]))


class _TreeRNN(nn.Module):
    """A gated recursive network over a binary tree whose shape comes from the batch's seed. The batch
    holds ``B`` token sequences that share the tree's shape: leaf ``i`` reads column ``i`` of the token
    matrix, so every node is a ``(B, d)`` tensor. Every node's logits are kept until the loss."""

    def __init__(self, vocab: int = 30, d: int = 32, n_out: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.combine = nn.Linear(2 * d, d)
        self.gate = nn.Linear(2 * d, d)
        self.node_out = nn.Linear(d, n_out)
        self.head = nn.Linear(d, n_out)

    def node(self, tree, tokens, logits):
        if isinstance(tree, int):
            h = self.emb(tokens[:, tree])
        else:
            hl = self.node(tree[0], tokens, logits)
            hr = self.node(tree[1], tokens, logits)
            both = torch.cat([hl, hr], dim=1)
            g = torch.sigmoid(self.gate(both))
            h = g * torch.tanh(self.combine(both)) + (1 - g) * 0.5 * (hl + hr)
        logits.append(self.node_out(h))
        return h

    def forward(self, tree, tokens):
        per_node: list[torch.Tensor] = []
        root = self.node(tree, tokens, per_node)
        return self.head(root), torch.stack(per_node, 1)


def tree_rnn():
    def make_batch(seed: int):
        rng = random.Random(seed)
        n = rng.randint(8, 14)
        tree = _random_tree(rng, list(range(n)))  # shape depends on the seed
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 30, (64, n), generator=g)
        return (tree, tokens), torch.randint(0, 3, (64,), generator=g)

    def loss_fn(out, y):
        root_logits, per_node = out
        # root classification plus a small term over every node's logits
        return F.cross_entropy(root_logits, y) + 0.1 * torch.logsumexp(per_node, dim=2).mean()

    return _TreeRNN(), make_batch, loss_fn


# ---------------------------------------------------------------- 6. mixture of experts
class _MoELayer(nn.Module):
    def __init__(self, d: int, experts: int, k: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d)) for _ in range(experts)
        )
        self.k, self.n = k, experts

    def forward(self, h):
        probs = torch.softmax(self.gate(h), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)  # data-dependent routing
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        flat_idx = idx.reshape(-1)
        flat_w = w.reshape(-1)
        token_of = torch.arange(h.shape[0]).repeat_interleave(self.k)
        for e, expert in enumerate(self.experts):
            sel = (flat_idx == e).nonzero().squeeze(1)  # data-dependent size
            if sel.numel() == 0:
                continue
            tokens = token_of.index_select(0, sel)
            out = expert(h.index_select(0, tokens)) * flat_w.index_select(0, sel).unsqueeze(1)
            y.index_add_(0, tokens, out)  # in-place scatter into a managed buffer
        # load-balancing auxiliary loss: routed-token counts (scatter_add) times mean gate probability
        counts = torch.zeros(self.n).scatter_add(0, flat_idx, torch.ones_like(flat_w))
        aux = self.n * (counts / flat_idx.numel() * probs.mean(0)).sum()
        return h + y, aux


class _MoE(nn.Module):
    def __init__(self, d: int = 32, experts: int = 4, k: int = 2, hidden: int = 64, n_out: int = 6,
                 layers: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.layers = nn.ModuleList(_MoELayer(d, experts, k, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, n_out)

    def forward(self, x):
        h = torch.tanh(self.inp(x))  # (tokens, d)
        aux = 0
        for layer in self.layers:
            h, a = layer(h)
            aux = aux + a
        return self.out(self.norm(h)), aux


def moe():
    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(256, 16, generator=g)
        return (x,), torch.randint(0, 6, (256,), generator=g)

    def loss_fn(out, y):
        logits, aux = out
        return F.cross_entropy(logits, y) + 0.01 * aux

    return _MoE(), make_batch, loss_fn


# ---------------------------------------------------------------- 7. GPT-2 (Hugging Face, random weights)
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab = 100
    cfg = GPT2Config(
        vocab_size=vocab, n_positions=32, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, n_inner=128, use_cache=False,
        attn_implementation="eager",
        bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg)
    assert model.config._attn_implementation == "eager"

    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (16, 32), generator=g)
        return {"input_ids": ids}, ids

    def loss_fn(out, ids):
        logits = out.logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    return model, make_batch, loss_fn


# ---------------------------------------------------------------- 8. ResNet (Hugging Face, random weights)
def hf_resnet():
    # The stem (7x7 conv, BatchNorm, max pool at 16x16) has the largest tensors, and its backward needs
    # about 40% of the unconstrained peak: 30% is below the minimal budget (the test raises it).
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[16, 16], depths=[3, 3], layer_type="basic",
        num_labels=10, downsample_in_first_stage=False,
    )
    model = ResNetForImageClassification(cfg)

    def make_batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        pixels = torch.randn(16, 3, 32, 32, generator=g)
        return {"pixel_values": pixels}, torch.randint(0, 10, (16,), generator=g)

    def loss_fn(out, y):
        return F.cross_entropy(out.logits, y)

    return model, make_batch, loss_fn


BUILDERS = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer": transformer,
    "lstm_loop": lstm_loop,
    "tree_rnn": tree_rnn,
    "moe": moe,
    "gpt2": gpt2,
    "hf_resnet": hf_resnet,
}
HF_MODELS = ("gpt2", "hf_resnet")
