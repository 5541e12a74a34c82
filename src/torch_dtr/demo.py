"""The demo: train GPT-2 (Hugging Face ``transformers``, random weights) under a byte budget.

Each contender runs in its own process, so the peak resident set size (RSS) of each is real and
separate: plain PyTorch, torch-dtr with no budget (its tracked peak is plain PyTorch's peak in the same
accounting), and torch-dtr at fractions of that peak. Losses are compared bitwise with plain PyTorch.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    layers: int = 4
    width: int = 256
    heads: int = 4
    seq: int = 256
    batch: int = 8
    vocab: int = 2048


def _gpt2(w: Workload):  # noqa: ANN202
    import torch

    from .bench.workloads import gpt2

    torch.manual_seed(0)
    return gpt2(w.layers, w.width, w.heads, w.seq, w.vocab)


def worker(kind: str, budget: int | None, steps: int, w: Workload) -> dict:
    """One contender, in this process. Returns its measurements."""
    import torch

    import torch_dtr

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = _gpt2(w)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, w.vocab, (w.batch, w.seq), generator=g) for _ in range(steps + 1)]
    if kind == "dtr":
        torch_dtr.enable(budget=budget)
    times, losses = [], []
    for i, ids in enumerate(batches):
        torch.manual_seed(100 + i)  # the same dropout draws for every contender
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(float(torch_dtr.unwrap(out.loss.detach()).item()))
        del out
        if i > 0:  # the first step warms up
            times.append(dt)
        print(f"  {kind:5s} budget={budget}: step {i + 1}/{len(batches)} {dt:.2f} s", file=sys.stderr, flush=True)
    st = torch_dtr.stats() if kind == "dtr" else None
    torch_dtr.disable()
    return {
        "kind": kind,
        "budget": budget,
        "step_s": statistics.median(times),
        "losses": losses,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_tracked": st.peak_bytes if st else None,
        "evictions": st.evictions if st else 0,
        "remats": st.rematerializations if st else 0,
        "remat_s": st.remat_seconds if st else 0.0,
        "search_s": st.search_seconds if st else 0.0,
        "ops": st.ops if st else 0,
    }


def _spawn(kind: str, budget: int | None, steps: int, memory: bool = False) -> dict:
    """A worker process. ``memory``: glibc's mmap threshold fixed at 64 KiB, so that freed tensors go back to
    the OS and peak RSS follows live tensors (it slows large allocations, so timed runs go without it)."""
    env = dict(os.environ)
    if memory:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    cmd = [sys.executable, "-m", "torch_dtr.demo", "--worker", kind, str(budget), str(steps)]
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(
            f"torch_dtr demo: the {kind} worker (budget {budget}) failed with exit code {res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(ratios: tuple[float, ...] = (0.5, 0.3), steps: int = 4) -> int:
    from .core import fmt_bytes
    from .deps import need

    need("transformers", "bench", "torch-dtr demo")
    w = Workload()
    print(f"torch-dtr demo: GPT-2 ({w.layers} layers, width {w.width}, sequence {w.seq}, batch {w.batch}), "
          f"AdamW, {steps} measured steps after 1 warm-up, each contender in its own process")
    runs = [_spawn("plain", None, steps), _spawn("dtr", None, steps)]
    peak = runs[1]["peak_tracked"]
    for r in ratios:
        runs.append(_spawn("dtr", int(peak * r), steps))
    for r in runs:  # peak RSS from a short run of each contender with the allocator set for it
        r["peak_rss"] = _spawn(r["kind"], r["budget"], 1, memory=True)["peak_rss"]
    plain = runs[0]
    print()
    head = f"{'contender':24s} {'budget':>11s} {'peak tracked':>13s} {'peak RSS':>11s} {'step':>8s} {'vs plain':>8s} " \
           f"{'evictions':>9s} {'remats':>7s} {'same loss':>9s}"
    print(head)
    print("-" * len(head))
    for r in runs:
        name = "plain PyTorch" if r["kind"] == "plain" else (
            "torch-dtr, no budget" if r["budget"] is None else f"torch-dtr, {r['budget'] / peak:.0%} of peak")
        same = "yes" if r["losses"] == plain["losses"] else "NO"
        print(f"{name:24s} {fmt_bytes(r['budget']) if r['budget'] else '-':>11s} "
              f"{fmt_bytes(r['peak_tracked']) if r['peak_tracked'] else '-':>13s} {fmt_bytes(r['peak_rss']):>11s} "
              f"{r['step_s']:7.2f}s {r['step_s'] / plain['step_s']:7.2f}x {r['evictions']:9d} {r['remats']:7d} "
              f"{same:>9s}")
    print()
    print("peak tracked: bytes of live tensors (parameters, optimizer state seen as op inputs, activations), "
          "as torch-dtr counts them; peak RSS: the whole process, Python and libraries included, from one more "
          "short run per contender with glibc's mmap threshold at 64 KiB (freed tensors go back to the OS); "
          "step times: median of the measured steps, default allocator.")
    return 0 if all(r["losses"] == plain["losses"] for r in runs) else 1


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        kind, budget, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
        out = worker(kind, None if budget == "None" else int(budget), steps, Workload())
        print(json.dumps(out))
    else:
        sys.exit(main())
