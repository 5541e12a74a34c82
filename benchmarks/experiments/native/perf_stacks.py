"""Where the native front end's own time goes inside a long run, by call stack: the native front end at no budget
trains without stopping in a process of its own (``perf_split.py``'s child), ``perf record --call-graph dwarf``
samples it for a fixed time after the warm-up steps, and the main thread's samples are split by their stacks:

- *in the kernel*: under the boxed kernel (``make_boxed_function<kernel>``), the ops it runs included;
- *own work*: in the kernel but not running an op below it (``run_below``, ``redispatchBoxed``): what the front end
  itself costs, by the chain of calls just under the kernel (``--depth``), and inside the calls into the core
  (``Feed.ran``, ``Feed.before``) by what the compiled core calls there.

Shares are of the main thread's samples (a step's time, the OpenMP workers aside). Unlike ``perf_split.py``
(the sampled instruction's library, for plain and native side by side), this says which part of the per-op path a
sample belongs to, whatever library it was in.

    PYTHONPATH=src TORCH_DTR_CORE=compiled python benchmarks/experiments/native/perf_stacks.py [WORKLOAD]
        [--size quick] [--seconds 5] [--depth 2] [--top 25]

Needs ``perf`` on the PATH with permission to attach to a child. Writes OUT/perf-stacks-WORKLOAD.txt with ``OUT``
set.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KERNEL = "make_boxed_function<&(anonymous namespace)::kernel>"
BELOW = ("run_below", "redispatchBoxed")
CORE = {"CPyDef_feed___Feed___ran": "Feed.ran", "CPyDef_feed___Feed___before": "Feed.before",
        "feed.py:ran": "Feed.ran", "feed.py:before": "Feed.before"}


def record(name: str, size: str, seconds: float, tmp: str) -> str:
    """The child's stacks as ``perf script`` prints them (tid, then one frame a line)."""
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "perf_split.py")
    ready = os.path.join(tmp, "native.ready")
    p = subprocess.Popen([sys.executable, child, "--child", "native", name, size, ready])
    try:
        t0 = time.time()
        while not os.path.exists(ready):
            if p.poll() is not None or time.time() - t0 > 600:
                raise RuntimeError("perf_stacks: the child ended or hung before its warm-up steps were done")
            time.sleep(0.1)
        time.sleep(1.0)
        data = os.path.join(tmp, "native.data")
        rec = subprocess.run(["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf,16384", "-o", data, "-p",
                              str(p.pid), "--", "sleep", str(seconds)], capture_output=True, text=True)
        if rec.returncode:
            raise RuntimeError(f"perf record failed ({rec.returncode}): {rec.stderr.strip()[-400:]}")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    print("perf_stacks: reading the stacks (a minute or two) ...", file=sys.stderr, flush=True)
    return subprocess.run(["perf", "script", "-i", data, "--no-inline", "-F", "tid,ip,sym"], capture_output=True,
                          text=True).stdout


def parse(text: str) -> list[tuple[str, list[str]]]:
    """(tid, frames innermost first) per sample."""
    samples, cur = [], None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
        elif not line.startswith("\t"):  # a sample's head: its thread id
            cur = (line.split()[0], [])
        elif cur is not None:
            parts = line.strip().split(None, 1)
            cur[1].append(parts[1] if len(parts) > 1 else "?")
    if cur:
        samples.append(cur)
    return samples


def split(samples: list[tuple[str, list[str]]], depth: int, top: int) -> list[str]:
    # the main thread: the one that runs the kernel (OpenMP's workers never do), else the most sampled
    kernels = collections.Counter(t for t, st in samples if any(KERNEL in f for f in st))
    main = (kernels or collections.Counter(t for t, _ in samples)).most_common(1)[0][0]
    stacks = [st for t, st in samples if t == main]
    n = len(stacks)
    kernel = own = 0
    chains: collections.Counter = collections.Counter()
    core: collections.Counter = collections.Counter()
    for st in stacks:
        at = [i for i, f in enumerate(st) if KERNEL in f]
        if not at:
            continue
        kernel += 1
        inner = st[:min(at)]  # frames called by the innermost kernel, innermost first
        if any(b in f for f in inner for b in BELOW):
            continue
        own += 1
        outward = [f[:80] for f in reversed(inner)]
        chains[" > ".join(outward[:depth]) or "(the kernel itself)"] += 1
        for i, f in enumerate(inner):
            entry = next((v for k, v in CORE.items() if k in f), None)
            if entry:
                below = inner[i - 1][:60] if i else "(itself)"
                core[f"{entry} > {below}"] += 1
                break
    lines = [f"main thread: {n} samples; in the kernel {kernel / n:.1%}; **the front end's own work {own / n:.1%}** "
             f"(in the kernel, not running an op below it)", "", "| own work, by the calls under the kernel | share "
             "of the main thread |", "| --- | ---: |"]
    lines += [f"| `{k}` | {v / n:.2%} |" for k, v in chains.most_common(top)]
    lines += ["", "| inside the calls into the core | share of the main thread |", "| --- | ---: |"]
    lines += [f"| `{k}` | {v / n:.2%} |" for k, v in core.most_common(top)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", default="gpt2")
    ap.add_argument("--size", default="quick")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    name, size, seconds, depth, top = a.workload, a.size, a.seconds, a.depth, a.top
    if shutil.which("perf") is None:
        print("perf_stacks: `perf` is not on the PATH (linux-tools)", file=sys.stderr)
        raise SystemExit(2)
    from torch_dtr.core.compiled import is_compiled

    with tempfile.TemporaryDirectory(prefix="dtr-perf-stacks-") as tmp:
        samples = parse(record(name, size, seconds, tmp))
    head = [f"# The native front end's own time by call stack, {name} ({size}), "
            f"{'compiled' if is_compiled() else 'interpreted'} core, no budget: perf at 999 Hz with DWARF call "
            f"graphs for {seconds:g} s after the warm-up steps", ""]
    text = "\n".join(head + split(samples, depth, top)) + "\n"
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"perf-stacks-{name}.txt"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
