"""Ordinary training programs that no other test ran (2026-11-25): double backward, retained graphs, hooks,
gradient clipping and accumulation, autocast, inference passes, state_dict round trips, torch.utils.checkpoint
inside torch-dtr, channels_last (and torch.func at the end: it runs unmanaged). Each runs three times on the
same seeds: plain, under torch-dtr with everything evicted at the marked points (``mark``), and under
torch-dtr at half of the unconstrained tracked peak or 1.3x its single-op floor, whichever is larger; every
value the program returns must be bitwise equal to plain's, and the evicting runs must have recomputed or
evicted something."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from util import came_back, evict_all, plain

import torch_dtr

BUDGET_FRACTION = 0.5  # of the program's unconstrained tracked peak, constants included ...
FLOOR_MARGIN = 1.3  # ... or this much above its single-op floor, whichever is larger


class Marks:
    """``mark()`` evicts everything in the evicting run and does nothing otherwise."""

    def __init__(self, evict: bool) -> None:
        self.evict = evict

    def __call__(self) -> None:
        if self.evict:
            evict_all()


def _mlp(width: int = 32, depth: int = 6) -> torch.nn.Module:
    """Linear(width, 2 width), Tanh, then ``depth - 1`` x (Linear, GELU), then Linear(2 width, 1)."""
    layers: list[torch.nn.Module] = [torch.nn.Linear(width, 2 * width), torch.nn.Tanh()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(2 * width, 2 * width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(2 * width, 1))


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor, mark: Marks) -> torch.Tensor:
    """The usual update: evict at the mark, zero the gradients, backward, step. Returns the loss, plain."""
    mark()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return plain(loss)


def gradient_penalty(mark: Marks) -> list[torch.Tensor]:
    """WGAN-GP: the penalty on the input gradient needs a second backward through the first."""
    torch.manual_seed(0)
    net = _mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    out = []
    for _ in range(2):
        x = torch.randn(128, 32, requires_grad=True)
        score = net(x)
        mark()
        (g,) = torch.autograd.grad(score.sum(), x, create_graph=True)
        mark()
        loss = score.mean() + 10.0 * ((g.norm(2, dim=1) - 1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(plain(loss))
    return out + [plain(p) for p in net.parameters()]


def retained_graph(mark: Marks) -> list[torch.Tensor]:
    """Two losses backward through one graph, the first with ``retain_graph=True``."""
    torch.manual_seed(0)
    net = _mlp()
    x = torch.randn(128, 32)
    h = net(x)
    mark()
    h.square().mean().backward(retain_graph=True)
    first = [plain(p.grad) for p in net.parameters()]
    mark()
    h.abs().mean().backward()
    return first + [plain(p.grad) for p in net.parameters()]


def hooks(mark: Marks) -> list[torch.Tensor]:
    """A tensor hook that rescales a gradient, a forward hook that keeps activations, a backward hook."""
    torch.manual_seed(0)
    net = _mlp()
    kept: list[torch.Tensor] = []
    seen: list[torch.Tensor] = []
    net[1].register_forward_hook(lambda _m, _i, o: kept.append(o))
    net[3].register_full_backward_hook(lambda _m, _gi, go: seen.append(go[0].detach().clone()))
    x = torch.randn(128, 32)
    h = net[0](x)
    h.register_hook(lambda g: g * 0.5)
    y = net[1:](h)
    mark()
    y.sum().backward()
    return [plain(p.grad) for p in net.parameters()] + [plain(k) for k in kept] + [plain(s) for s in seen]


def clipped_adam_with_accumulation(mark: Marks) -> list[torch.Tensor]:
    """Four micro-batches accumulate gradients, clip_grad_norm_ and AdamW step; three steps."""
    torch.manual_seed(0)
    net = _mlp()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        for _ in range(4):
            x, y = torch.randn(512, 32), torch.randn(512, 1)
            loss = F.mse_loss(net(x), y) / 4
            mark()
            loss.backward()
            losses.append(loss.item())
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        losses.append(norm.item())
        opt.step()
    return [torch.tensor(losses)] + [plain(p) for p in net.parameters()]


def autocast_bf16(mark: Marks) -> list[torch.Tensor]:
    """Mixed precision on CPU: the forward under autocast (bfloat16 matmuls), the loss in float32."""
    torch.manual_seed(0)
    net = _mlp()
    x, y = torch.randn(128, 32), torch.randn(128, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = net(x)
    mark()
    loss = F.mse_loss(pred.float(), y)
    loss.backward()
    return [plain(loss)] + [plain(p.grad) for p in net.parameters()]


def eval_between_steps(mark: Marks) -> list[torch.Tensor]:
    """Train, evaluate under inference_mode and under no_grad with dropout off, train again."""
    torch.manual_seed(0)
    hidden = [m for _ in range(5) for m in (torch.nn.Linear(64, 64), torch.nn.Dropout(0.3), torch.nn.ReLU())]
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), *hidden, torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = []
    for _ in range(2):
        net.train()
        loss = net(torch.randn(512, 32)).square().mean()
        _step(opt, loss, mark)
        net.eval()
        with torch.inference_mode():
            out.append(plain(net(torch.randn(4, 32))))
        with torch.no_grad():
            out.append(plain(net(torch.randn(4, 32))))
        out.append(plain(loss))
    return out


def state_dict_round_trip(mark: Marks) -> list[torch.Tensor]:
    """Save model and optimizer with torch.save mid-training, load them into fresh objects, continue."""
    torch.manual_seed(0)
    net = _mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        loss = net(torch.randn(512, 32)).square().mean()
        _step(opt, loss, mark)
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    torch.manual_seed(1)
    net2 = _mlp()
    net2.load_state_dict(state["model"])
    opt2 = torch.optim.Adam(net2.parameters(), lr=1e-2)
    opt2.load_state_dict(state["opt"])
    loss = net2(torch.randn(512, 32)).square().mean()
    _step(opt2, loss, mark)
    return [plain(loss)] + [plain(p) for p in net2.parameters()]


def per_sample_grads(mark: Marks) -> list[torch.Tensor]:
    """torch.func: per-sample gradients with vmap(grad(...)) over a functional call."""
    torch.manual_seed(0)
    net = _mlp(16)
    params = {k: v.detach() for k, v in net.named_parameters()}
    x, y = torch.randn(8, 16), torch.randn(8, 1)

    def loss_one(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(torch.func.functional_call(net, p, (xi[None],)), yi[None])

    grads = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    mark()
    return [plain(grads[k]) for k in sorted(grads)]


def checkpointed_blocks(mark: Marks) -> list[torch.Tensor]:
    """torch.utils.checkpoint around each block, inside torch-dtr: both recompute."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.2), torch.nn.GELU())
                                 for _ in range(4))
    h = torch.randn(128, 32, requires_grad=True)
    x = h
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    mark()
    x.square().mean().backward()
    return [plain(h.grad)] + [plain(p.grad) for p in blocks.parameters()]


def channels_last_cnn(mark: Marks) -> list[torch.Tensor]:
    """A small CNN in channels_last memory format with batch norm, two SGD steps."""
    torch.manual_seed(0)
    convs = [m for _ in range(4)
             for m in (torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())]
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), *convs, torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(8, 4)).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    out = []
    for _ in range(2):
        x = torch.randn(16, 3, 32, 32).to(memory_format=torch.channels_last)
        loss = F.cross_entropy(net(x), torch.randint(0, 4, (16,)))
        out.append(_step(opt, loss, mark))
    return out + [plain(p) for p in net.parameters()] + [plain(b) for b in net.buffers()]


def gan(mark: Marks) -> list[torch.Tensor]:
    """Two networks and two optimizers: D on real and detached fake samples, then G through D."""
    torch.manual_seed(0)
    g, d = _mlp(16), _mlp(32)
    g[-1] = torch.nn.Linear(32, 32)
    opt_g, opt_d = torch.optim.Adam(g.parameters(), lr=1e-3), torch.optim.Adam(d.parameters(), lr=1e-3)
    out = []
    for _ in range(2):
        real, z = torch.randn(128, 32), torch.randn(128, 16)
        fake = g(z)
        d_loss = F.softplus(-d(real)).mean() + F.softplus(d(fake.detach())).mean()
        _step(opt_d, d_loss, mark)
        g_loss = F.softplus(-d(fake)).mean()
        _step(opt_g, g_loss, mark)
        out += [plain(d_loss), plain(g_loss)]
    return out + [plain(p) for p in [*g.parameters(), *d.parameters()]]


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def tied_weights_custom_function_and_ema(mark: Marks) -> list[torch.Tensor]:
    """A language-model head tied to its embedding, a custom autograd.Function, an EMA copy of the weights
    updated in place under no_grad, and losses logged with .item() every step."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 32, padding_idx=0)
    body = _mlp(32)
    body[-1] = torch.nn.Linear(64, 32)
    params = [*emb.parameters(), *body.parameters()]
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    logged = []
    for _ in range(3):
        tokens = torch.randint(0, 100, (64, 8))
        h = _Square.apply(body(emb(tokens)))
        logits = h @ emb.weight.t()
        loss = F.cross_entropy(logits.reshape(-1, 100), torch.randint(0, 100, (64 * 8,)))
        _step(opt, loss, mark)
        with torch.no_grad():
            for e, p in zip(ema, params, strict=True):
                e.lerp_(p, 0.1)
        logged.append(loss.item())
    return [torch.tensor(logged)] + [plain(p) for p in params] + [plain(e) for e in ema]


def spectral_and_weight_norm(mark: Marks) -> list[torch.Tensor]:
    """Parametrizations: spectral_norm (power iteration writes its buffers in place) and weight_norm."""
    torch.manual_seed(0)
    net = _mlp()
    torch.nn.utils.parametrizations.spectral_norm(net[2])
    torch.nn.utils.parametrizations.weight_norm(net[4])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = []
    for _ in range(2):
        loss = net(torch.randn(128, 32)).square().mean()
        out.append(_step(opt, loss, mark))
    return out + [plain(p) for p in net.parameters()] + [plain(b) for b in net.buffers()]


def packed_gru_and_attention(mark: Marks) -> list[torch.Tensor]:
    """Variable-length sequences: a packed GRU, then multi-head attention with a key padding mask."""
    torch.manual_seed(0)
    gru = torch.nn.GRU(16, 32, batch_first=True)
    attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    lengths = torch.tensor([12, 9, 7, 3])
    x = torch.randn(4, 12, 16)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
    out, _ = gru(packed)
    seq, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    pad = torch.arange(12)[None] >= lengths[:, None]
    y, w = attn(seq, seq, seq, key_padding_mask=pad)
    mark()
    loss = y.masked_fill(pad[..., None], 0).square().sum() + w.sum()
    loss.backward()
    return [plain(loss), plain(w)] + [plain(p.grad) for p in [*gru.parameters(), *attn.parameters()]]


def reentrant_checkpoint_and_freezing(mark: Marks) -> list[torch.Tensor]:
    """Reentrant torch.utils.checkpoint, then the first layer frozen (requires_grad_(False)) mid-training."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    net = _mlp()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = []
    for step in range(3):
        if step == 2:
            net[0].requires_grad_(False)
        x = torch.randn(128, 32, requires_grad=True)
        h = checkpoint(net[:5], x, use_reentrant=True)
        loss = net[5:](h).square().mean()
        _step(opt, loss, mark)
        out += [plain(loss), plain(x.grad)]
    return out + [plain(p) for p in net.parameters()]


def vae_with_grad_scaler(mark: Marks) -> list[torch.Tensor]:
    """A VAE step: reparameterized Normal sample, KL and log-prob terms, bf16 autocast and a GradScaler,
    a cosine learning-rate schedule."""
    torch.manual_seed(0)
    enc, dec = _mlp(32), _mlp(8)
    enc[-1], dec[-1] = torch.nn.Linear(64, 16), torch.nn.Linear(16, 32)
    params = [*enc.parameters(), *dec.parameters()]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    out = []
    for _ in range(2):
        x = torch.randn(128, 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mu, log_var = enc(x).float().chunk(2, dim=1)
            q = torch.distributions.Normal(mu, (0.5 * log_var).exp())
            z = q.rsample()
            recon = dec(z).float()
        kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum(1).mean()
        loss = F.mse_loss(recon, x) + kl - q.log_prob(z).mean() * 0.0
        mark()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        out.append(plain(loss))
    return out + [plain(p) for p in params]


def transformer_encoder_train_and_fast_path_eval(mark: Marks) -> list[torch.Tensor]:
    """nn.TransformerEncoder with a padding mask: a training step, then eval under no_grad, where PyTorch
    takes its fused fast path (nested tensors for the padded batch)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    opt = torch.optim.Adam(enc.parameters(), lr=1e-3)
    x = torch.randn(8, 10, 32)
    pad = torch.arange(10)[None] >= torch.tensor([10, 8, 7, 7, 5, 4, 3, 2])[:, None]
    enc.train()
    loss = enc(x, src_key_padding_mask=pad).masked_fill(pad[..., None], 0).square().mean()
    _step(opt, loss, mark)
    enc.eval()
    with torch.no_grad():
        y = enc(x, src_key_padding_mask=pad)
    return [plain(loss), plain(y.masked_fill(pad[..., None], 0))] + [plain(p) for p in enc.parameters()]


def unet_decoder_with_renormed_embedding(mark: Marks) -> list[torch.Tensor]:
    """Upsampling and transposed convolutions with a skip concatenation, conditioned on an embedding
    with max_norm (its forward renormalizes rows of the weight in place)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 8, max_norm=1.0)
    down = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    up = torch.nn.ConvTranspose2d(8, 8, 2, stride=2)
    head = torch.nn.Conv2d(16 + 8, 3, 3, padding=1)
    params = [*emb.parameters(), *down.parameters(), *up.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    out = []
    for _ in range(2):
        x, label = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        skip = torch.cat([F.interpolate(down(x), scale_factor=2, mode="bilinear", align_corners=False),
                          up(F.relu(down(x)))], dim=1)
        cond = emb(label)[:, :, None, None].expand(-1, -1, 32, 32)
        loss = F.mse_loss(head(torch.cat([skip, cond], dim=1)), x)
        out.append(_step(opt, loss, mark))
    return out + [plain(p) for p in params]


def retrieval_with_data_dependent_indexing(mark: Marks) -> list[torch.Tensor]:
    """Top-k neighbours by cdist, gather, scatter_add into buckets, sort, a vector-Jacobian backward with
    ``backward(gradient=...)``, an in-place write into a non-leaf's view, a gradient set by hand."""
    torch.manual_seed(0)
    keys = torch.randn(256, 16, requires_grad=True)
    q = torch.randn(32, 16, requires_grad=True)
    d = torch.cdist(q, keys)
    vals, idx = d.topk(5, dim=1, largest=False)
    near = keys[idx]  # (32, 5, 16)
    mixed = (near * F.softmax(-vals, dim=1)[..., None]).sum(1)
    mixed[:, 0] += 1.0  # an in-place write through a view of a non-leaf
    buckets = torch.zeros(8, 16).scatter_add(0, (idx[:, :1] % 8).expand(-1, 16), mixed)
    ranked, order = buckets.norm(dim=1).sort(descending=True)
    mark()
    out = buckets[order] * ranked[:, None]
    out.backward(gradient=torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    q.grad = q.grad * 0.5  # set by hand, as gradient surgery does
    return [plain(out), plain(keys.grad), plain(q.grad), plain(order)]


PROGRAMS: dict[str, Callable[[Marks], list[torch.Tensor]]] = {
    f.__name__: f for f in (gradient_penalty, retained_graph, hooks, clipped_adam_with_accumulation, autocast_bf16,
                            eval_between_steps, state_dict_round_trip, checkpointed_blocks,
                            channels_last_cnn, gan, tied_weights_custom_function_and_ema, spectral_and_weight_norm,
                            packed_gru_and_attention, reentrant_checkpoint_and_freezing, vae_with_grad_scaler,
                            transformer_encoder_train_and_fast_path_eval, unet_decoder_with_renormed_embedding,
                            retrieval_with_data_dependent_indexing)
}


def _same(got: list[torch.Tensor], want: list[torch.Tensor], how: str) -> None:
    assert len(got) == len(want), how
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{how}: value {i}: {a.dtype}{tuple(a.shape)} vs plain's " \
                                                          f"{b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{how}: value {i} differs from plain by {(a.double() - b.double()).abs().max()}"


def _under(program: Callable[[Marks], list[torch.Tensor]], budget: int | None, evict: bool):
    torch_dtr.enable(budget=budget)
    try:
        got = program(Marks(evict))
        st = torch_dtr.stats()
        torch_dtr.runtime().check()
    finally:
        torch_dtr.disable()
    return got, st


# Known to fail their budget on the compiled front end, with the measurement. Strict: a fix shows up as XPASS.
KNOWN_DEFAULT = {
    "checkpointed_blocks": "BudgetError at 1.3x its single-op floor (104.65 KiB, floor 80.5 KiB) while recomputing "
                           "a mul inside a checkpointed block: it asks for 112.5 KiB (1.40x); the Python front end "
                           "trains at 1.3x (measured 2026-11-28)",
    # since the CPU cost weights (NOTE [ Modelled costs ] 5) they rank these programs' tiny ops otherwise; both train
    # at 1.05x this budget, and at it without the weights (measured 2026-12-02)
    "packed_gru_and_attention": "BudgetError at 50% of its peak (303.9 KiB) recomputing a gelu: it asks for 305.8 KiB",
    "reentrant_checkpoint_and_freezing": "BudgetError at 1.3x its single-op floor (104.6 KiB) recomputing an add: it "
                                         "asks for 108.6 KiB",
}


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an op the size predictor cannot size fails the test
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_matches_plain_evicted_and_at_half_its_peak_or_1_3x_its_floor(name, dtr_front, request):
    if dtr_front == "default" and name in KNOWN_DEFAULT:
        request.applymarker(pytest.mark.xfail(strict=True, raises=torch_dtr.BudgetError, reason=KNOWN_DEFAULT[name]))
    program = PROGRAMS[name]
    want = program(Marks(False))
    got, st = _under(program, None, True)
    _same(got, want, f"{name}, everything evicted at the marks")
    assert came_back(st) > 0, f"{name}: nothing came back after evicting everything"
    _, free = _under(program, None, False)
    budget = max(int(BUDGET_FRACTION * free.peak_bytes), int(FLOOR_MARGIN * free.floor_bytes))
    assert budget < free.peak_bytes, f"{name}: its floor ({free.floor_bytes} B) is too near its peak to test"
    how = f"{name}, budget {budget} B ({budget / free.peak_bytes:.0%} of its peak {free.peak_bytes} B)"
    got, st = _under(program, budget, False)
    _same(got, want, how)
    assert st.peak_bytes <= budget, f"{how}: tracked peak {st.peak_bytes} B over the budget"
    assert st.evictions > 0, f"{how}: nothing was evicted"


def test_torch_func_transforms_run_unmanaged_and_match_plain():
    # vmap(grad(...)) computes below torch-dtr's dispatch mode: only the parameters' detach reaches it, so
    # nothing inside is tracked or evicted (docs/design.md, Known limits); the values stay plain's
    want = per_sample_grads(Marks(False))
    got, st = _under(per_sample_grads, None, True)
    _same(got, want, "per_sample_grads")
    params = len(list(_mlp(16).parameters()))
    assert st.ops == params and st.floor_op == "aten.detach.default" and st.rematerializations == 0, st


def test_keeping_every_detached_loss_for_20_steps_holds_only_the_scalars():
    # losses.append(loss.detach()): each held loss's recipe reads the step's graph; once the optimizer step
    # changes the weights the recipe can never run again, so the loss is pinned and the graph behind it freed
    torch.manual_seed(0)
    net = _mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    torch_dtr.enable(budget="400KB")
    try:
        losses, seen = [], []
        for _ in range(20):
            loss = net(torch.randn(128, 32)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            del loss
            st = torch_dtr.stats()
            rt = torch_dtr.runtime()  # resident or in the host tier (DTR_TEST_SWAP=1: the scalars move out)
            seen.append((sum(s.nbytes for s in rt.live if s.resident or s.host is not None), st.live_storages))
        assert st.evictions > 0
        torch_dtr.runtime().check()
    finally:
        torch_dtr.disable()
    # one 4-byte scalar and one record more per step, nothing else
    assert [(b - seen[0][0], n - seen[0][1]) for b, n in seen] == [(4 * k, k) for k in range(20)], seen


def _random_program(mark: Marks) -> list[torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(64, 64, requires_grad=True)
    h = torch.tanh(torch.randn(32, 64) @ w)
    mask = torch.empty_like(h).bernoulli_(0.8, generator=g)  # dropout drawn from the user's own generator
    q = (h * mask / 0.8).view(32, 4, 16).transpose(0, 1)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3, is_causal=True)
    out = (a + 0.01 * torch.randn(a.shape, generator=g)).sum()
    mark()
    torch.manual_seed(123)  # the program reseeds both streams between its forward and backward
    g.manual_seed(99)
    mark()
    out.backward()
    return [plain(out), plain(w.grad), torch.rand(3), torch.rand(3, generator=g)]


def test_recomputed_randomness_ignores_reseeding_between_forward_and_backward():
    # every random op recomputed after both streams were reseeded draws what it drew the first time, and
    # the streams continue as in plain PyTorch
    want = _random_program(Marks(False))
    got, st = _under(_random_program, None, True)
    _same(got, want, "random program")
    assert came_back(st) > 0
