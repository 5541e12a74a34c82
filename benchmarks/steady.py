"""The per-op path in a long run: each contender trains in a process of its own, as a user's program would,
and the processes take turns, so that the machine's drift hits them alike. Writes docs/steady.md.

    python benchmarks/steady.py [WORKLOAD ...] [--rounds 15] [--steps 8] [--out docs]
    TORCH_DTR_CORE=compiled python benchmarks/steady.py gpt2 lstm:full    # (the compiled core)

Why not ``dispatch.py``'s way (every contender in one process, switched on and off each round): a process's
allocator state carries over from one contender to the next. The native front end's CPU allocator keeps freed
blocks for reuse (NOTE [ Native front end ] 7), so that a long run stops faulting its pages in every step, and
on ``disable()`` gives them back to the C library, whose heap then serves the next plain round without those
faults: the one-process comparison gives plain PyTorch the heap a torch-dtr session grew, and torch-dtr a cold
start every round. Here each contender switches itself on once, before its warm-up steps, and keeps its own
state; the parent tells one child at a time to run ``--steps`` steps (the others wait, blocked on a pipe) and
rotates the order each round. A sample is one child's mean step over its turn; the report gives each
contender's median and its ratio to plain's median, with the range of the per-round ratios.

Contenders: ``plain``; ``mode``: a Python dispatch mode that only calls the op; ``fallback``: the native front
end's dispatch-key fallback passing every op down, with its CPU allocator (``native.passthrough(blocks=True)``);
``native``: the native front end at no budget (``native.enable()``); ``torch-dtr``: the Python front end at no
budget (``torch_dtr.enable()``). Workloads: ``dispatch.py``'s (``gpt2``, ``lstm``, ``resnet50``, ``ops``), at the
quick size, or ``NAME:full`` for the bench's size.
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
from pathlib import Path

CONTENDERS = ("plain", "mode", "fallback", "native", "torch-dtr")


def child(workload: str, who: str, warm: int) -> None:
    """One contender's process: build, switch on, warm up, then run the steps the parent asks for."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dispatch  # noqa: PLC0415

    import torch_dtr  # noqa: PLC0415
    from torch_dtr import native  # noqa: PLC0415

    name, _, size = workload.partition(":")
    fn = dispatch._small_ops()[0] if name == "ops" else dispatch._workload(name, size or "quick")[0]
    if who == "mode":
        dispatch._Passthrough().__enter__()
    elif who == "fallback":
        native.passthrough(blocks=True).__enter__()
    elif who == "native":
        native.enable(None)
    elif who == "torch-dtr":
        torch_dtr.enable()
    for _ in range(warm):
        fn()
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        if n <= 0:
            break
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        print(json.dumps({"s": (time.perf_counter() - t0) / n}), flush=True)
    if who == "native":
        assert native.stats()["evictions"] == 0
        native.disable()
    elif who == "torch-dtr":
        assert torch_dtr.stats().evictions == 0
        torch_dtr.disable()


def measure(workload: str, who: list[str], rounds: int, steps: int, warm: int,
            script: str = __file__) -> dict[str, list[float]]:
    """Per contender, its mean step of each turn (seconds). ``script``: the children's program (it calls ``child``
    when run as ``SCRIPT --child WORKLOAD WHO WARM``)."""
    procs = {}
    for w in who:
        procs[w] = p = subprocess.Popen([sys.executable, script, "--child", workload, w, str(warm)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()  # built and warmed up one at a time: no two busy at once
        if line.strip() != "ready":
            raise RuntimeError(f"steady: the {w} process of {workload} ended before it was ready")
    times: dict[str, list[float]] = {w: [] for w in who}
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
                times[w].append(json.loads(line)["s"])
            print(f"steady: {workload}, round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        for w, p in procs.items():
            if p.poll() is None:
                p.stdin.write("0\n")
                p.stdin.close()
                if p.wait(120):
                    print(f"steady: the {w} process exited with {p.returncode}", file=sys.stderr)
    return times


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    import torch  # noqa: PLC0415

    from torch_dtr.bench import workloads  # noqa: PLC0415
    from torch_dtr.core import COMPILED  # noqa: PLC0415

    core = "compiled" if COMPILED else "interpreted"
    out = [f"# The per-op path in a long run, processes taking turns ({core} core)", "",
           f"Measured {datetime.date.today()} on {platform.machine()}, Python {platform.python_version()}, torch "
           f"{torch.__version__}. Command: `{'TORCH_DTR_CORE=compiled ' if COMPILED else ''}python "
           f"benchmarks/steady.py {' '.join(args.workloads)}{_options(args)}`.", "",
           "Each contender trains in a process of its own, switched on once before its warm-up steps; the "
           f"processes take turns of {args.steps} steps ({args.rounds} rounds, the order rotated each round; "
           f"a bench-size workload, NAME:full: {args.full_steps} steps, {args.full_rounds} rounds). "
           "Median step, ratio to plain's median, and in brackets the range of the per-round ratios (a contender's "
           "turn against plain's turn of the same round). No contender evicts anything (no budget).", "",
           "| workload | plain step (ms) | " + " | ".join(w for w in CONTENDERS if w != "plain") + " |",
           "| --- | ---: | " + " | ".join("---:" for w in CONTENDERS if w != "plain") + " |"]
    for workload, times in results.items():
        base = statistics.median(times["plain"])
        name, _, size = workload.partition(":")
        if name == "ops":
            what = "small ops: 200 x (mul, add) on 64x64, forward and backward"
        else:
            what = f"{name} ({size or 'quick'}): {workloads.describe(name, workloads.SIZES[name][size or 'quick'])}"
        cells = []
        for w in CONTENDERS[1:]:
            if w not in times:
                cells.append("-")
                continue
            per = sorted(t / p for t, p in zip(times[w], times["plain"], strict=True))
            cells.append(f"{statistics.median(times[w]) / base:.3f}x ({per[0]:.2f}-{per[-1]:.2f})")
        out.append(f"| {what} | {base * 1e3:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _options(args: argparse.Namespace) -> str:
    defaults = {"rounds": 15, "steps": 8, "full_rounds": 8, "full_steps": 4, "warm": 5}
    return "".join(f" --{k.replace('_', '-')} {getattr(args, k)}" for k, v in defaults.items() if getattr(args, k) != v)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt2"])
    ap.add_argument("--who", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8, help="steps per turn (a multiple of the 4 batches)")
    ap.add_argument("--full-rounds", type=int, default=8, help="rounds of a NAME:full workload")
    ap.add_argument("--full-steps", type=int, default=4, help="steps per turn of a NAME:full workload")
    ap.add_argument("--warm", type=int, default=5, help="untimed steps after switching on")
    ap.add_argument("--out", default="docs")
    args = ap.parse_args()
    who = ["plain", *(w for w in args.who if w != "plain")]
    results = {}
    for wl in args.workloads:
        full = wl.endswith(":full")
        rounds, steps = (args.full_rounds, args.full_steps) if full else (args.rounds, args.steps)
        results[wl] = measure(wl, who, rounds, steps, 1 if full else args.warm)
    text = report(results, args)
    print(text)
    if args.out:
        from torch_dtr.core import COMPILED  # noqa: PLC0415

        path = Path(args.out) / ("steady-compiled.md" if COMPILED else "steady.md")
        path.write_text(text)
        print(f"steady: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
