"""The per-op path in a long run: each contender trains in a process of its own, as a user's program would,
and the processes take turns, so that the machine's drift hits them alike. Writes docs/steady*.md.

    python benchmarks/steady.py [WORKLOAD ...] [--who plain native ...] [--rounds 15] [--steps 8] [--out docs]
    TORCH_DTR_CORE=python python benchmarks/steady.py gpt2 lstm:full        # the interpreted core
    python benchmarks/steady.py --device cuda gpt2-small:full gpt2:full --who plain mode native native@0.5

Why not ``dispatch.py``'s way (every contender in one process, switched on and off each round): a process's
allocator state carries over from one contender to the next. The native front end's CPU allocator keeps freed
blocks for reuse (NOTE [ Native front end ] 7), so that a long run stops faulting its pages in every step, and
on ``disable()`` gives them back to the C library, whose heap then serves the next plain round: the one-process
comparison gives plain PyTorch the heap a torch-dtr session grew, and torch-dtr a cold start every round; and a
GPU host's processes differed by up to 1.7x (docs/gpu/notes.md). Here each contender switches itself on once,
before its warm-up steps, and keeps its own state; the parent tells one child at a time to run its turn of
steps (the others wait, blocked on a pipe) and rotates the order each round. A sample is one child's mean step
over its turn (on CUDA, synchronized at both ends); the report gives each contender's median and its ratio to
plain's median, with the range of the per-round ratios.

Contenders (``--who``): ``plain``; ``mode``: a Python dispatch mode that only calls the op; ``fallback``: the
native front end's dispatch-key fallback passing every op down, with its CPU allocator (``native.passthrough(
blocks=True)``); ``native``: the native front end (``native.enable()``); ``torch-dtr``: the default
(``torch_dtr.enable()``, which runs the compiled front end: ``native`` through the public entry); ``python``: the
Python front end (``torch_dtr.enable(front="python")``). ``NAME@R`` (CUDA only): under a budget of R times the
plain step's ``max_memory_allocated``, measured in that process before switching on; the report adds its peak
against the budget. Without a budget a contender must evict nothing. Workloads: ``ops`` (``dispatch.py``'s
small-op chain, CPU), and the bench's ``gpt2``, ``lstm``, ``resnet50``, ``gpt2-small`` at the quick size, or
``NAME:full`` for the bench's size (fewer rounds and steps: ``--full-rounds``, ``--full-steps``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BASES = ("plain", "mode", "fallback", "native", "torch-dtr", "python")


def _build(workload: str, device: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """The workload's training step (the next of its 4 batches each call) and the device's synchronization."""
    import torch  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dispatch  # noqa: PLC0415

    from torch_dtr.bench import workloads  # noqa: PLC0415

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    name, _, size = workload.partition(":")
    if name == "ops":
        if device != "cpu":
            raise SystemExit("steady: the small-op chain runs on the CPU only")
        return dispatch._small_ops()[0], sync
    model, batches, step = workloads.build(name, workloads.SIZES[name][size or "quick"], 4)
    model.to(device)
    batches = [tuple(t.to(device) for t in b) if isinstance(b, tuple) else b.to(device) for b in batches]
    done = [0]

    def run() -> None:
        step(model, batches[done[0] % len(batches)])
        done[0] += 1

    return run, sync


def child(workload: str, who: str, warm: int, device: str) -> None:
    """One contender's process: build, switch on, warm up, then run the turns the parent asks for."""
    import torch  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dispatch  # noqa: PLC0415

    import torch_dtr  # noqa: PLC0415
    from torch_dtr import native  # noqa: PLC0415

    base, _, ratio = who.partition("@")
    fn, sync = _build(workload, device)
    cuda = device == "cuda"
    budget = None
    if ratio:  # R times the plain step's peak (its second step: the first makes the optimizer's state)
        fn()
        sync()
        torch.cuda.reset_peak_memory_stats()
        fn()
        sync()
        budget = int(float(ratio) * torch.cuda.max_memory_allocated())
    if base == "mode":
        dispatch._Passthrough().__enter__()
    elif base == "fallback":
        native.passthrough(blocks=True).__enter__()
    elif base == "native":
        native.enable(budget)
    elif base == "torch-dtr":
        torch_dtr.enable(budget=budget)
    elif base == "python":
        torch_dtr.enable(budget=budget, front="python")
    for _ in range(warm):
        fn()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        if n <= 0:
            break
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out = {"s": (time.perf_counter() - t0) / n}
        if cuda:
            out["peak"] = torch.cuda.max_memory_allocated()
            out["budget"] = budget
        print(json.dumps(out), flush=True)
    if base == "native":
        assert budget is not None or native.stats()["evictions"] == 0
        native.disable()
    elif base in ("torch-dtr", "python"):
        assert budget is not None or torch_dtr.stats().evictions == 0
        torch_dtr.disable()


def measure(workload: str, who: list[str], rounds: int, steps: int, warm: int, device: str = "cpu",
            script: str = __file__) -> dict[str, list[dict]]:
    """Per contender, one record per turn: its mean step (``s``, seconds), on CUDA its peak and budget. ``script``:
    the children's program (it calls ``child`` when run as ``SCRIPT --child WORKLOAD WHO WARM DEVICE``)."""
    procs = {}
    for w in who:
        procs[w] = p = subprocess.Popen([sys.executable, script, "--child", workload, w, str(warm), device],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()  # built and warmed up one at a time: no two busy at once
        if line.strip() != "ready":
            raise RuntimeError(f"steady: the {w} process of {workload} ended before it was ready")
    turns: dict[str, list[dict]] = {w: [] for w in who}
    try:
        for r in range(rounds):
            order = who[r % len(who):] + who[:r % len(who)]
            for w in order:
                p = procs[w]
                p.stdin.write(f"{steps}\n")
                p.stdin.flush()
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError(f"steady: the {w} process of {workload} ended mid-run")
                turns[w].append(json.loads(line))
            print(f"steady: {workload}, round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        for w, p in procs.items():
            if p.poll() is None:
                p.stdin.write("0\n")
                p.stdin.close()
                if p.wait(120):
                    print(f"steady: the {w} process exited with {p.returncode}", file=sys.stderr)
    return turns


def _cell(turns: list[dict], plain: list[dict], base: float) -> str:
    per = sorted(t["s"] / p["s"] for t, p in zip(turns, plain, strict=True))
    cell = f"{statistics.median(t['s'] for t in turns) / base:.3f}x ({per[0]:.2f}-{per[-1]:.2f})"
    if turns[-1].get("budget"):
        peak, budget = max(t["peak"] for t in turns), turns[-1]["budget"]
        cell += f", peak {peak / 2**20:,.0f} MiB of {budget / 2**20:,.0f}" + (" **OVER**" if peak > budget else "")
    return cell


def report(results: dict[str, dict[str, list[dict]]], args: argparse.Namespace, command: str) -> str:
    import torch  # noqa: PLC0415

    from torch_dtr.bench import workloads  # noqa: PLC0415
    from torch_dtr.core import COMPILED  # noqa: PLC0415

    core = "compiled" if COMPILED else "interpreted"
    where = f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
    if args.device == "cuda":
        where = f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}, " + where
    who = [w for w in args.who if w != "plain"]
    out = [f"# The per-op path in a long run, processes taking turns ({args.device}, {core} core)", "",
           f"Measured {datetime.date.today()} on {where}. Command: `{command}`.", "",
           "Each contender trains in a process of its own, switched on once before its warm-up steps; the "
           f"processes take turns of {args.steps} steps ({args.rounds} rounds, the order rotated each round; "
           f"a bench-size workload, NAME:full: {args.full_steps} steps, {args.full_rounds} rounds). "
           "Median step, ratio to plain's median, and in brackets the range of the per-round ratios (a contender's "
           "turn against plain's turn of the same round). Without a budget no contender evicts anything; NAME@R: a "
           "budget of R times plain's peak (`max_memory_allocated`), with the peak it kept.", "",
           "| workload | plain step (ms) | " + " | ".join(who) + " |",
           "| --- | ---: | " + " | ".join("---:" for _ in who) + " |"]
    for workload, turns in results.items():
        base = statistics.median(t["s"] for t in turns["plain"])
        name, _, size = workload.partition(":")
        if name == "ops":
            what = "small ops: 200 x (mul, add) on 64x64, forward and backward"
        else:
            what = f"{name} ({size or 'quick'}): {workloads.describe(name, workloads.SIZES[name][size or 'quick'])}"
        cells = [_cell(turns[w], turns["plain"], base) for w in who]
        out.append(f"| {what} | {base * 1e3:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt2"])
    ap.add_argument("--who", nargs="+", default=list(BASES), help=f"of {', '.join(BASES)}; NAME@R: a budget")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8, help="steps per turn (a multiple of the 4 batches)")
    ap.add_argument("--full-rounds", type=int, default=8, help="rounds of a NAME:full workload")
    ap.add_argument("--full-steps", type=int, default=4, help="steps per turn of a NAME:full workload")
    ap.add_argument("--warm", type=int, default=5, help="untimed steps after switching on (1 at full size)")
    ap.add_argument("--out", default="docs", help="the report's folder ('' for none)")
    args = ap.parse_args()
    for w in args.who:
        base, _, ratio = w.partition("@")
        if base not in BASES or (ratio and args.device != "cuda"):
            ap.error(f"--who {w}: expected one of {', '.join(BASES)}, with @R (a budget) only on --device cuda")
    args.who = ["plain", *(w for w in args.who if w != "plain")]
    results = {}
    for wl in args.workloads:
        full = wl.endswith(":full")
        rounds, steps = (args.full_rounds, args.full_steps) if full else (args.rounds, args.steps)
        results[wl] = measure(wl, args.who, rounds, steps, 1 if full else args.warm, args.device)
    from torch_dtr.core import COMPILED  # noqa: PLC0415

    command = ("" if COMPILED else "TORCH_DTR_CORE=python ") + "python benchmarks/steady.py " + " ".join(sys.argv[1:])
    text = report(results, args, command)
    print(text)
    if args.out:
        name = "steady" + ("-cuda" if args.device == "cuda" else "") + ("" if COMPILED else "-interpreted")
        path = Path(args.out) / f"{name}.md"
        path.write_text(text)
        print(f"steady: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
