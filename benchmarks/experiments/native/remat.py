"""A compiled DTR mechanism (remat.cpp) checked against plain PyTorch and timed against torch-dtr's Python path.

    python benchmarks/experiments/native/remat.py check   # gradients bitwise equal to plain at 100/50/30%
    python benchmarks/experiments/native/remat.py time [--rounds 3] [--steps 7]
    python benchmarks/experiments/native/remat.py choose   # the victim chosen by Python instead of C++

Each takes --device cuda (untested so far). REMAT_CPP=path builds a variant of remat.cpp instead (the check's
negative control: without RNG replay the dropout programs must come out DIFFERENT).

Builds remat.cpp with torch's JIT extension loader (a C++ compiler and ninja; about 30 s the first time). The
programs' inputs are made managed (`manage`); parameters stay plain tensors, as torch-dtr's constants. Budgets
are fractions of the managed bytes' peak at no budget, measured by the extension itself. Not shipped: an
experiment that decides whether a compiled front end is worth building, and what it must solve.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.cpp_extension import load

import torch_dtr

Step = Callable[[Callable[[torch.Tensor], torch.Tensor]], None]


def _ext():
    t0 = time.perf_counter()
    src = os.environ.get("REMAT_CPP", str(Path(__file__).with_name("remat.cpp")))  # a variant to try
    ext = load("dtr_remat", [src], extra_cflags=["-O2"])
    n = ext.claim()
    print(f"built in {time.perf_counter() - t0:.0f} s; {n} ops given the fallback as kernel", file=sys.stderr)
    return ext


def programs(device: str = "cpu") -> dict[str, tuple[nn.Module | None, Callable[[], torch.Tensor], Callable]]:
    """name -> (model, input maker, loss(model, x)), on ``device``."""
    torch.manual_seed(0)
    with torch.device(device):
        out = _programs(device)
    return {k: (m.to(device) if m is not None else None, mk, lo) for k, (m, mk, lo) in out.items()}


def _programs(device: str) -> dict[str, tuple[nn.Module | None, Callable[[], torch.Tensor], Callable]]:
    w = torch.randn(64, 64)

    def chain_loss(_m, x):
        y = x
        for _ in range(200):
            y = y * 1.0001 + 0.5
        return y.sum()

    def sin_loss(_m, x):
        y = x
        for _ in range(100):
            y = (y * 1.0001 + 0.5).sin()
        return y.sum()

    mlp = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(256, 256), nn.LayerNorm(256), nn.ReLU())])
    xm = torch.randn(64, 256)

    cell = nn.LSTMCell(32, 256)
    seq = torch.randn(60, 16, 32)

    def lstm_loss(m, x):
        h = c = torch.zeros(16, 256, device=x.device)
        for t in range(x.shape[0]):
            h, c = m(x[t], (h, c))
        return h.sum()

    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True), 4,
                                enable_nested_tensor=False)
    xs = torch.randn(8, 64, 128)
    out = {
        "small ops (200 x (mul, add) on 64x64)": (None, lambda: w.clone(), chain_loss),
        "sin chain (100 x (mul, add, sin) on 64x64)": (None, lambda: w.clone(), sin_loss),
        "MLP 8 x (Linear, LayerNorm, ReLU), 64x256": (mlp, lambda: xm.clone(), lambda m, x: m(x).square().mean()),
        "LSTMCell loop (32 -> 256), 60 steps, batch 16": (cell, lambda: seq.clone(), lstm_loss),
        "TransformerEncoder 4 x 128, seq 64, batch 8": (enc, lambda: xs.clone(), lambda m, x: m(x).square().mean()),
    }
    drop = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(256, 256), nn.ReLU(), nn.Dropout(0.1))])
    out["MLP 6 x (Linear, ReLU, Dropout 0.1), 64x256"] = (drop, lambda: xm.clone(), lambda m, x: m(x).square().mean())
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128, vocab_size=1000, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)
        gpt = GPT2LMHeadModel(cfg).eval()  # eval: no dropout; gradients still flow
        gpt.config._attn_implementation = "eager"
        ids = torch.randint(0, 1000, (4, 128))
        out["GPT-2 2 x 128 (transformers), seq 128, batch 4"] = (
            gpt, lambda: ids.clone(), lambda m, x: m(input_ids=x, labels=x).loss)
        cfg_t = GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128, vocab_size=1000)  # dropout 0.1
        gpt_t = GPT2LMHeadModel(cfg_t).train()
        gpt_t.config._attn_implementation = "eager"
        out["GPT-2 as above, training mode (dropout 0.1)"] = (
            gpt_t, lambda: ids.clone(), lambda m, x: m(input_ids=x, labels=x).loss)
    except ImportError:
        pass
    return out


def _grads(model, make, loss, wrap, out=lambda t: t.clone()) -> list[torch.Tensor]:
    torch.manual_seed(1)  # random ops (dropout) draw the same in every contender
    if model is None:
        x = wrap(make()).requires_grad_(True)
        loss(None, x).backward()
        return [out(x.grad)]
    model.zero_grad(set_to_none=True)
    loss(model, wrap(make())).backward()
    g = [out(p.grad) for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return g


def _clean(ext) -> None:
    """Between measurements: nothing of the last run may stay counted (a failed run's frames hold tensors
    until the collector frees them), so that every budget is a fraction of this program's own bytes."""
    gc.collect()
    left = ext.counters()["bytes"]
    if left:
        raise RuntimeError(f"remat.py: {left} B still counted between runs")
    ext.reset_peak()


def _after_failure(ext, model, make, loss) -> None:
    """A step that raised leaves partial gradients, and its autograd graph stays alive (outside this
    extension's records: no global of it holds a handle) until the next step of the program runs; one step at
    no budget lets both go."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    ext.set_budget(-1)
    _grads(model, make, loss, ext.manage, ext.unmanaged)


def check(device: str = "cpu") -> int:
    ext = _ext()
    bad = 0
    for name, (model, make, loss) in programs(device).items():
        ref = _grads(model, make, loss, lambda t: t)
        ext.set_budget(-1)
        _clean(ext)
        got = _grads(model, make, loss, ext.manage, ext.unmanaged)
        peak = ext.counters()["peak"]
        rows = [f"100%: {'bitwise' if all(torch.equal(a, b) for a, b in zip(ref, got, strict=True)) else 'DIFFERENT'}"]
        for frac in (0.5, 0.3):
            c0 = ext.counters()
            _clean(ext)
            ext.set_budget(int(peak * frac))
            try:
                got = _grads(model, make, loss, ext.manage, ext.unmanaged)
                same = all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
                c = ext.counters()
                rows.append(f"{frac:.0%}: {'bitwise' if same else 'DIFFERENT'}, peak {c['peak'] / peak:.2f}, "
                            f"{c['evictions'] - c0['evictions']} evictions, {c['remats'] - c0['remats']} remats"
                            + (f" ({c['random_replays'] - c0['random_replays']} of random ops)"
                               if c['random_replays'] > c0['random_replays'] else ""))
                bad += not same
            except RuntimeError as e:
                rows.append(f"{frac:.0%}: {str(e).splitlines()[0][:100]}")
                _after_failure(ext, model, make, loss)
            ext.set_budget(-1)
        print(f"{name} (managed peak {peak / 2**20:.2f} MiB): " + "; ".join(rows))
    return bad


def _median(fn, n: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    ts = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def timing(rounds: int, steps: int, device: str = "cpu") -> None:
    ext = _ext()
    print(f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {_where(device)}; one step = forward + backward (no optimizer); "
          f"median of {steps} steps per contender, {rounds} rounds interleaved; step time over plain PyTorch's "
          "(range over rounds). "
          "50%: of each runtime's own tracked peak at no budget; -: that budget is not reached (BudgetError)\n")
    print("| program | managed ops per step | plain step | C++ no budget | C++ budget above peak | C++ 50% | "
          "torch-dtr no budget | torch-dtr 50% |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (model, make, loss) in programs(device).items():
        plain_fn = lambda m=model, mk=make, lo=loss: _grads(m, mk, lo, lambda x: x)  # noqa: E731
        native_fn = lambda m=model, mk=make, lo=loss: _grads(m, mk, lo, ext.manage, ext.unmanaged)  # noqa: E731
        ext.set_budget(-1)
        _clean(ext)
        n0 = ext.counters()["ops"]
        native_fn()
        ops = ext.counters()["ops"] - n0
        native_peak = ext.counters()["peak"]
        torch_dtr.enable(budget=None)
        try:
            torch_dtr.reset_peak()
            plain_fn()
            dtr_peak = torch_dtr.stats().peak_bytes
        finally:
            torch_dtr.disable()
        t: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(rounds):
            plain_fn()
            t["plain"].append(_median(plain_fn, steps))
            for label, b in (("C++ none", -1), ("C++ above", 2 * native_peak), ("C++ 50%", int(native_peak * 0.5))):
                _clean(ext)
                ext.set_budget(b)
                try:
                    native_fn()
                    t[label].append(_median(native_fn, steps))
                except RuntimeError:
                    ext.set_budget(-1)
                    _after_failure(ext, model, make, loss)
                finally:
                    ext.set_budget(-1)
            for label, b in (("dtr none", None), ("dtr 50%", int(dtr_peak * 0.5))):
                torch_dtr.enable(budget=b)
                try:
                    plain_fn()
                    t[label].append(_median(plain_fn, steps))
                except torch_dtr.BudgetError:
                    pass
                finally:
                    torch_dtr.disable()
        p = statistics.median(t["plain"])
        cells = [_ratio(t.get(k), p) for k in ("C++ none", "C++ above", "C++ 50%", "dtr none", "dtr 50%")]
        print(f"| {name} | {ops} | {p * 1e3:.2f} ms | " + " | ".join(cells) + " |", flush=True)


def _ratio(v: list[float] | None, p: float) -> str:
    if not v:
        return "-"
    return f"{statistics.median(v) / p:.2f}x ({min(v) / p:.2f}-{max(v) / p:.2f})"


def _dtr_score(feats: torch.Tensor) -> int:
    """The experiment's C++ rule, in Python: the lowest evicted-neighbourhood cost / (bytes x staleness)."""
    return int(torch.argmin(feats[:, 0] / (feats[:, 1] * feats[:, 2])))


def choose(rounds: int, steps: int, device: str = "cpu") -> None:
    """What leaving the rules in Python costs a compiled front end: the same victim chosen in C++ or by a
    Python callable given the candidates' features as one tensor, per eviction."""
    ext = _ext()
    print(f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {_where(device)}; forward + backward; median of {steps} steps, "
          f"{rounds} rounds interleaved; step time over plain PyTorch's\n")
    print("| program | budget | evictions per step | chosen in C++ | chosen in Python | Python's cost per eviction |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    progs = programs(device)
    for name in [n for n in progs if n.startswith("GPT-2") or n.startswith("sin chain")]:
        model, make, loss = progs[name]
        plain_fn = lambda m=model, mk=make, lo=loss: _grads(m, mk, lo, lambda x: x)  # noqa: E731
        native_fn = lambda m=model, mk=make, lo=loss: _grads(m, mk, lo, ext.manage, ext.unmanaged)  # noqa: E731
        ext.set_budget(-1)
        _clean(ext)
        native_fn()
        peak = ext.counters()["peak"]
        for frac in (0.5, 0.3):
            t: dict[str, list[float]] = collections.defaultdict(list)
            ev: dict[str, list[int]] = collections.defaultdict(list)
            for _ in range(rounds):
                plain_fn()
                t["plain"].append(_median(plain_fn, steps))
                for label, chooser in (("C++", None), ("Python", _dtr_score)):
                    _clean(ext)
                    ext.set_chooser(chooser)
                    ext.set_budget(int(peak * frac))
                    try:
                        native_fn()
                        e0 = ext.counters()["evictions"]
                        t[label].append(_median(native_fn, steps))
                        ev[label].append((ext.counters()["evictions"] - e0) // steps)
                    finally:
                        ext.set_budget(-1)
                        ext.set_chooser(None)
            p = statistics.median(t["plain"])
            c, py = statistics.median(t["C++"]), statistics.median(t["Python"])
            n = statistics.median(ev["Python"])
            per = f"{(py - c) / n * 1e6:.0f} us" if n else "-"
            print(f"| {name} | {frac:.0%} | {statistics.median(ev['C++']):.0f} / {n:.0f} | {c / p:.2f}x | "
                  f"{py / p:.2f}x | {per} |", flush=True)


def _where(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))}, CUDA {torch.version.cuda}"
    return "CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("check", "time", "choose"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (bitwise on CUDA needs deterministic algorithms)")
    a = ap.parse_args()
    if a.device.startswith("cuda"):
        torch.use_deterministic_algorithms(True)
    if a.what == "check":
        sys.exit(1 if check(a.device) else 0)
    if a.what == "choose":
        choose(a.rounds, a.steps, a.device)
        return
    timing(a.rounds, a.steps, a.device)


if __name__ == "__main__":
    main()
