"""Where a long run's main thread spends its time, by library, sampled with Linux ``perf``: plain PyTorch and the
native front end at no budget (the compiled core where it builds), each in a process of its own that trains
without stopping; after warm-up steps ``perf record`` samples the main thread for a fixed time. ms per step =
the library's share of the main thread's samples x the step time measured in the same window. Unlike
``spy.py`` (py-spy, which unwinds through Python and loses some stacks), perf reads only the sampled
instruction's library: nothing is lost, but a library's time is its own code's (torch-dtr's calls into the
interpreter count as the interpreter's). What the front end saves (the kernel's page faults: NOTE [ Native front
end ] 7) shows as a negative difference.

    PYTHONPATH=src python benchmarks/experiments/native/perf_split.py [WORKLOAD] [--size quick] [--seconds 8]
        [--freq 2000] [--who plain native] [--top 25]

Needs ``perf`` on the PATH and permission to attach to a child (``kernel.perf_event_paranoid`` <= 2 as root).
With ``OUT`` set, also writes OUT/perf-split-WORKLOAD.txt.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WHO = ("plain", "native")
# a library's file name -> the row it counts in (the compiled core's extension is named by a hash)
ROWS = (("torch_dtr_native", "torch-dtr C++ front end"), ("__mypyc", "torch-dtr compiled core"),
        ("libpython", "the interpreter (any Python code, torch-dtr's objects)"), ("libtorch_cpu", "libtorch_cpu"),
        ("libtorch_python", "libtorch_python"), ("libc10", "libc10"), ("libgomp", "OpenMP (libgomp)"),
        ("libc.so", "the C library"), ("libstdc++", "libstdc++"), ("kallsyms", "the kernel (page faults, syscalls)"))


def row_of(dso: str) -> str:
    for key, row in ROWS:
        if key in dso:
            return row
    return "other: " + dso.rsplit("/", 1)[-1]


def child(who: str, name: str, size_name: str, ready: str) -> None:
    """Train until SIGTERM; write 'steps seconds' since ``ready`` was written to ``ready`` + '.done'."""
    import torch

    from torch_dtr.bench import workloads

    model, batches, step = workloads.build(name, workloads.SIZES[name][size_name], 4)
    if who == "native":
        from torch_dtr import native

        native.enable(None)
    for i in range(3):
        step(model, batches[i % len(batches)])
    count = [0, 0.0]

    def stop(*_: object) -> None:
        with open(ready + ".done", "w") as f:
            f.write(f"{count[0]} {time.perf_counter() - count[1]}")
        os._exit(0)

    signal.signal(signal.SIGUSR1, lambda *_: count.__setitem__(slice(0, 2), [0, time.perf_counter()]))
    signal.signal(signal.SIGTERM, stop)
    with open(ready, "w") as f:
        f.write(str(torch.get_num_threads()))
    i = 0
    while True:
        step(model, batches[i % len(batches)])
        i += 1
        count[0] += 1


Sampled = tuple[float, collections.Counter, collections.Counter]


def sample(who: str, name: str, size_name: str, seconds: float, freq: int, tmp: str) -> Sampled:
    """The step time (ms) in the sampled window, and the main thread's samples by row and by (symbol, row)."""
    ready = os.path.join(tmp, f"{who}.ready")
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, __file__, "--child", who, name, size_name, ready], env=env)
    try:
        t0 = time.time()
        while not os.path.exists(ready):
            if p.poll() is not None or time.time() - t0 > 600:
                raise RuntimeError(f"perf_split: the {who} child ended or hung before its warm-up steps were done")
            time.sleep(0.1)
        time.sleep(1.0)
        data = os.path.join(tmp, f"{who}.data")
        os.kill(p.pid, signal.SIGUSR1)
        rec = subprocess.run(["perf", "record", "-q", "-F", str(freq), "-o", data, "-p", str(p.pid), "--", "sleep",
                              str(seconds)], capture_output=True, text=True)
        os.kill(p.pid, signal.SIGTERM)
        p.wait(60)
        if rec.returncode:
            raise RuntimeError(f"perf record failed ({rec.returncode}): {rec.stderr.strip()[-400:]}")
        steps, secs = open(ready + ".done").read().split()
        step_ms = float(secs) / max(int(steps), 1) * 1e3
    finally:
        if p.poll() is None:
            p.kill()
    out = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,ip,sym,dso"], capture_output=True,
                         text=True).stdout
    rows: collections.Counter = collections.Counter()
    syms: collections.Counter = collections.Counter()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or "/" not in parts[0]:
            continue
        pid, tid = parts[0].split("/")
        if pid != tid:  # the main thread only: OpenMP's workers spin while it works
            continue
        sym, _, dso = parts[2].rpartition(" (")
        row = row_of(dso.rstrip(")"))
        rows[row] += 1
        syms[(sym.strip()[:80], row)] += 1
    return step_ms, rows, syms


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        child(*args[1:5])
        return 0

    def opt(flag: str, default: str, many: bool = False) -> str | list[str]:
        if flag not in args:
            return default
        i = args.index(flag)
        if many:
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            v: str | list[str] = args[i + 1:j]
            del args[i:j]
            return v
        v = args[i + 1]
        del args[i:i + 2]
        return v

    size_name, seconds, freq = str(opt("--size", "quick")), float(opt("--seconds", "8")), int(opt("--freq", "2000"))
    who_all = list(opt("--who", list(WHO), many=True))  # type: ignore[arg-type]
    top = int(opt("--top", "25"))
    name = args[0] if args else "gpt2"
    if shutil.which("perf") is None:
        print("perf_split: `perf` is not on the PATH (linux-tools): it samples the children", file=sys.stderr)
        return 2
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for who in who_all:
            res[who] = sample(who, name, size_name, seconds, freq, tmp)
            print(f"{who:8s} {res[who][0]:.2f} ms a step in the sampled window", flush=True)
    base = who_all[0]

    def ms(who: str, n: int) -> float:
        step_ms, rows, _ = res[who]
        return n / max(sum(rows.values()), 1) * step_ms

    core = os.environ.get("TORCH_DTR_CORE", "interpreted")
    lines = [f"# Main thread by library, {name} ({size_name}), {core} core: perf at {freq} Hz for {seconds:g} s per "
             "contender after 3 warm-up steps, each in its own process; ms per step", "",
             "| library | " + " | ".join(who_all) + " | " + " | ".join(f"{w} - {base}" for w in who_all[1:]) + " |",
             "| --- |" + " ---: |" * (2 * len(who_all) - 1)]
    rows_all = sorted({r for w in who_all for r in res[w][1]}, key=lambda r: -max(ms(w, res[w][1][r]) for w in who_all))
    for r in rows_all:
        vals = [ms(w, res[w][1][r]) for w in who_all]
        lines.append(f"| {r} | " + " | ".join(f"{v:.3f}" for v in vals) + " | " +
                     " | ".join(f"{v - vals[0]:+.3f}" for v in vals[1:]) + " |")
    lines.append("| step | " + " | ".join(f"{res[w][0]:.3f}" for w in who_all) + " | " +
                 " | ".join(f"{res[w][0] - res[base][0]:+.3f}" for w in who_all[1:]) + " |")
    for w in who_all[1:]:
        lines += ["", f"Functions {w} adds the most over {base} (ms per step):", ""]
        keys = set(res[w][2]) | set(res[base][2])
        diff = {k: ms(w, res[w][2][k]) - ms(base, res[base][2][k]) for k in keys}
        for k in sorted(keys, key=lambda k: -diff[k])[:top]:
            lines.append(f"    {diff[k]:+.3f}  {k[0]}  ({k[1]})")
    text = "\n".join(lines)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"perf-split-{name}.txt"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
