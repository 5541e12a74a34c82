"""Instructions, not seconds: what the native front end adds per managed op, counted by valgrind's callgrind, so
that a cut of a few percent shows on a machine whose timings swing by more (a 2-core cloud machine's step times
drift 10-20% between runs). Plain PyTorch and the native front end at no budget (compiled core unless
``TORCH_DTR_CORE`` says otherwise) each run a program in a process of its own under callgrind twice, for N1 and
N2 steps after the same warm-up; the difference of the two counts, per step, leaves out start-up and imports.
Instructions added per managed op = (native's per step - plain's per step) / managed ops per step, split by
library and by function (functions of one name summed over the libraries that define them: callgrind names an
inlined template after whichever library it met first). Instructions are not time (a cache miss or a lock's
wait costs more than its instructions), but they move with the code, not with the neighbours.

    PYTHONPATH=src python benchmarks/experiments/native/instructions.py [chain|gpt2|lstm] [--steps 5 25]
        [--top 30] [--jobs 2] [--floor] [--budget]

``--budget``: native runs under a budget far above the peak (1 TiB: the whole path, size prediction and
the room's bookkeeping, never an eviction) instead of with none. ``--floor``: a third contender, the
mechanism's floor (``torch_dtr.native.passthrough(blocks=True)``: every op through the fallback, passed
straight down, with the front end's CPU allocator), so that what the front end's own work adds shows apart
from what any boxed fallback pays.

Needs ``valgrind`` and ``callgrind_annotate`` on the PATH. About 4-8 minutes for the chain on 2 cores (callgrind
runs a program some 50x slower). With ``OUT`` set, also writes OUT/instructions-PROGRAM[-budget].txt.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

WHO = ("plain", "native")


def child(who: str, program: str, steps: int, budget: int | None = None) -> None:
    """Warm up, switch ``who`` on, run ``steps`` steps; print the managed ops per step."""
    import torch

    torch.set_num_threads(1)
    if program == "chain":  # dispatch.py's small-op chain: 200 x (mul, add) on 64x64, forward and backward
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        from dispatch import _small_ops

        step = _small_ops()[0]
    else:
        from torch_dtr.bench import workloads

        model, batches, run = workloads.build(program, workloads.SIZES[program]["quick"], 4)
        nxt = [0]

        def step() -> None:
            nxt[0] += 1
            run(model, batches[nxt[0] % len(batches)])

    for _ in range(4):
        step()
    ops = 0.0
    if who == "native":
        from torch_dtr import native

        native.enable(budget)
        for _ in range(4):  # the caches of call signatures fill here, outside what is counted apart
            step()
        before = native.stats()["managed_ops"]
    if who == "floor":
        from torch_dtr import native

        with native.passthrough(blocks=True):
            for _ in range(4 + steps):
                step()
        print("managed_ops_per_step 0")
        return
    for _ in range(steps):
        step()
    if who == "native":
        ops = (native.stats()["managed_ops"] - before) / max(steps, 1)
    print(f"managed_ops_per_step {ops}")


def counted(who: str, program: str, steps: int, out: str, budget: bool = False) -> tuple[str, float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # no idle BLAS threads spinning
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--cache-sim=no", sys.executable,
           __file__, "--child", who, program, str(steps)] + (["budget"] if budget else [])
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    m = re.search(r"managed_ops_per_step ([\d.]+)", res.stdout)
    if res.returncode or not m:
        raise RuntimeError(f"instructions: the {who} child failed ({res.returncode}): {res.stderr[-2000:]}")
    return out, float(m.group(1))


def library(obj: str, name: str) -> str:
    if "torch_dtr_native" in obj or name.startswith("(anonymous namespace)"):
        return "torch-dtr C++ front end"
    if "mypyc" in obj or "__native_" in name:
        return "torch-dtr compiled core"
    for key, row in (("libpython", "CPython"), ("libc.so", "the C library"), ("libtorch", "torch"),
                     ("libc10", "torch"), ("libstdc++", "libstdc++")):
        if key in obj:
            return row
    return "other"


def source_library(full: str) -> str:
    """The library of a line whose object callgrind left out, from its source file where that says it."""
    file = full.split(":", 1)[0]
    if "Python-3" in file or "/Include/" in file:
        return "CPython"
    if "/malloc/" in file or "/nptl/" in file or "sysdeps" in file:
        return "the C library"
    return "other"


def per_function(path: str) -> tuple[dict[str, int], dict[str, str]]:
    """Instructions by function name (summed over libraries) and the library each name was first seen in."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", path], capture_output=True,
                          text=True, check=True).stdout
    counts: dict[str, int] = collections.Counter()
    where: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*:.*)$", line)
        if not m:
            continue
        full = m.group(2)
        obj = re.search(r"\[([^\]]*)\]$", full)
        name = re.sub(r" \[[^\]]*\]$", "", full).split(":", 1)[-1].replace("'2", "")
        counts[name] += int(m.group(1).replace(",", ""))
        lib = library(obj.group(1) if obj else "", name)
        where.setdefault(name, source_library(full) if lib == "other" else lib)
    return counts, where


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), 2**40 if sys.argv[5:] == ["budget"] else None)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", nargs="?", default="chain", choices=("chain", "gpt2", "lstm"))
    ap.add_argument("--steps", nargs=2, type=int, default=(5, 25))
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--floor", action="store_true", help="also count the fallback alone (passthrough)")
    ap.add_argument("--budget", action="store_true", help="native under a budget far above the peak (1 TiB)")
    args = ap.parse_args()
    who_all = WHO + ("floor",) if args.floor else WHO
    for tool in ("valgrind", "callgrind_annotate"):
        if not shutil.which(tool):
            print(f"instructions: needs {tool} on the PATH (Debian: apt install valgrind)", file=sys.stderr)
            return 2
    n1, n2 = args.steps
    if n2 <= n1:
        print(f"instructions: --steps N1 N2 needs N2 > N1 (got {n1} {n2})", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="dtr-callgrind-")
    jobs = {(who, n): (who, args.program, n, os.path.join(tmp, f"{who}-{n}.out"), args.budget)
            for who in who_all for n in (n1, n2)}
    print(f"running {len(jobs)} processes under callgrind ({args.jobs} at a time) ...", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        done = {k: pool.submit(counted, *v) for k, v in jobs.items()}
        results = {k: f.result() for k, f in done.items()}
    per_step: dict[str, dict[str, float]] = {}
    where: dict[str, str] = {}
    for who in who_all:
        (a, _), (b, ops) = results[(who, n1)], results[(who, n2)]
        ca, wa = per_function(a)
        cb, wb = per_function(b)
        where |= wa | wb
        per_step[who] = {k: (cb.get(k, 0) - ca.get(k, 0)) / (n2 - n1) for k in set(ca) | set(cb)}
        if who == "native":
            managed = ops
    added = {k: per_step["native"].get(k, 0.0) - per_step["plain"].get(k, 0.0)
             for k in set(per_step["native"]) | set(per_step["plain"])}
    total = {who: sum(v.values()) for who, v in per_step.items()}
    lines = [f"# Instructions per step, {args.program}: callgrind, steps {n1} and {n2}, one thread, "
             f"{'compiled' if os.environ.get('TORCH_DTR_CORE') == 'compiled' else 'interpreted'} core, native "
             f"{'under a budget far above the peak' if args.budget else 'with no budget'}", "",
             f"plain {total['plain']:,.0f} a step; native {total['native']:,.0f}; managed ops a step {managed:.0f}; "
             f"**added per managed op {sum(added.values()) / managed:,.0f}**", "",
             "| library | instructions added per managed op |", "| --- | ---: |"]
    by_lib: dict[str, float] = collections.Counter()
    for k, v in added.items():
        by_lib[where.get(k, "other")] += v / managed
    for lib, v in sorted(by_lib.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {lib} | {v:,.0f} |")
    if args.floor:
        floor = {k: per_step["floor"].get(k, 0.0) - per_step["plain"].get(k, 0.0)
                 for k in set(per_step["floor"]) | set(per_step["plain"])}
        f_op, a_op = sum(floor.values()) / managed, sum(added.values()) / managed
        lines += ["", f"floor (every op through the fallback, passed straight down, with the CPU blocks allocator): "
                  f"{total['floor']:,.0f} a step, **{f_op:,.0f} per managed op** of the {a_op:,.0f}; "
                  f"the front end's own work: **{a_op - f_op:,.0f}**", "",
                  "Functions the floor adds the most (per managed op):", ""]
        for k, v in sorted(floor.items(), key=lambda kv: -kv[1])[:12]:
            lines.append(f"    {v / managed:+8.0f}  {k[:110]}  ({where.get(k, 'other')})")
    lines += ["", "Functions adding the most (instructions per managed op; a name's library as first seen):", ""]
    for k, v in sorted(added.items(), key=lambda kv: -kv[1])[: args.top]:
        lines.append(f"    {v / managed:+8.0f}  {k[:110]}  ({where.get(k, 'other')})")
    report = "\n".join(lines) + "\n"
    print(report)
    if os.environ.get("OUT"):
        name = f"instructions-{args.program}{'-budget' if args.budget else ''}.txt"
        with open(os.path.join(os.environ["OUT"], name), "w") as f:
            f.write(report)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
