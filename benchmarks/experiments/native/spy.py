"""Where a training step's host time goes, by library and by leaf function, sampled with ``py-spy --native``:
plain PyTorch, a do-nothing dispatch mode and the native front end at no budget (compiled core), each in a
process of its own, sampled after two warm-up steps for a fixed time. The excess over plain per library and per
function, in ms per step, says what a contender adds and in which code (the interpreter, torch, the C++ front end,
the compiled core, the C library, the driver); stacks py-spy could not unwind count apart (it loses some inside
functions without unwind information: 15-20% of the main thread's samples on this machine). Needs ``py-spy`` on
the PATH (a wheel: ``pip install py-spy``).

    PYTHONPATH=src python benchmarks/experiments/native/spy.py [cpu|cuda] WORKLOAD [--size quick] [--seconds 6]
        [--rate 200] [--who plain mode native-compiled]

Writes the report to stdout and, where ``OUT`` is set, OUT/spy-DEVICE-WORKLOAD.txt and the raw samples
OUT/spy-DEVICE-WORKLOAD-WHO.raw.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

WHO = ("plain", "mode", "native-compiled")


def child(device: str, name: str, size_name: str, who: str, seconds: float) -> None:
    """Train until ``seconds`` have passed after two warm-up steps; print 'ready' before, the step ends after."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_dtr.bench import workloads

    class Noop(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    model, batches, _ = workloads.build(name, workloads.SIZES[name][size_name], 4)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [tuple(t.to(device) for t in b) if isinstance(b, tuple) else b.to(device) for b in batches]

    def step(b) -> None:
        if name.startswith("gpt2"):
            loss = model(input_ids=b, labels=b).loss
        elif name == "resnet50":
            loss = model(pixel_values=b[0], labels=b[1]).loss
        else:
            loss = torch.nn.functional.cross_entropy(model(b[0]), b[1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    if who.startswith("native"):
        from torch_dtr import native

        native.enable(None)
    mode = Noop() if who == "mode" else None
    if mode is not None:
        mode.__enter__()
    for b in batches[:2]:
        step(b)
    t0, i = time.perf_counter(), 0  # unsampled steps first: sampling pauses the process, so shares only come from it
    while time.perf_counter() - t0 < seconds / 2 or i < 3:
        step(batches[i % len(batches)])
        i += 1
    print(f"ready {1e3 * (time.perf_counter() - t0) / i:.3f}", flush=True)
    ends, t0, i = [], time.time(), 0
    while time.time() - t0 < seconds:
        step(batches[i % len(batches)])
        ends.append(time.time())
        i += 1
    if mode is not None:
        mode.__exit__(None, None, None)
    print(json.dumps({"ends": ends}), flush=True)


def library(frame: str) -> str:
    """The code a leaf frame belongs to: interpreted Python, or the shared object named in brackets."""
    m = re.search(r"\(([^()]*)\)$", frame)
    where = m.group(1) if m else ""
    if ".py:" in where or where.startswith("<frozen"):
        return "Python code (interpreted)"
    if "torch_dtr_native" in where:
        return "torch-dtr C++ front end"
    if "__mypyc" in where or re.match(r"(records|memory|trackers|policies|swap|runtime|feed)\.", where):
        return "torch-dtr compiled core"
    if where.startswith("libpython") or where.startswith("python"):
        return "the interpreter"
    if re.match(r"(__native_\w+|int_ops|list_ops|dict_ops|misc_ops|exc_ops|generic_ops|str_ops|getargs\w*)\.c:\d+$",
                where) or re.match(r"(object|pythoncapi_compat|CPy|mypyc_util)\.h:\d+$", where):
        return "torch-dtr compiled core"  # mypyc's C, named by source line where the build kept line info
    if re.search(r"\.(c|h|cpp):\d+$", where):
        return "other C code (named by source line)"
    return where or "unknown"


def read(raw: str, step_ms: float) -> tuple[dict, dict, dict]:
    """ms per step by library, by leaf function, by thread (main or other): each one's share of the samples
    times the unsampled step's time."""
    libs: dict = collections.Counter()
    funcs: dict = collections.Counter()
    threads: dict = collections.Counter()
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if len(frames) < 2:
                continue
            leaf = frames[-1]
            w = int(n)
            if "MainThread" in frames[0] and len(frames) <= 3:
                # the main thread's real stacks run from the C library's entry through the interpreter's frames:
                # two frames or fewer below the thread is an unwinding that failed (py-spy lost the stack inside
                # a function without unwind information), not time in the C library or its one caller
                leaf = "(stack not unwound)"
            libs[library(leaf) if leaf != "(stack not unwound)" else leaf] += w
            funcs[re.sub(r"0x[0-9a-f]+", "0x?", leaf)[:110]] += w
            threads["main thread" if "MainThread" in frames[0] else "other threads"] += w
    total = sum(libs.values()) or 1
    for c in (libs, funcs, threads):
        for k in c:
            c[k] *= step_ms / total
    return libs, funcs, threads


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--child" in sys.argv:
        device, name, size_name, who, seconds = args
        child(device, name, size_name, who, float(seconds))
        return 0

    def opt(flag: str, default: str) -> str:
        if flag in sys.argv:
            v = sys.argv[sys.argv.index(flag) + 1]
            args.remove(v)
            return v
        return default

    size_name, seconds, rate = opt("--size", "full"), float(opt("--seconds", "6")), int(opt("--rate", "200"))
    who_list = list(WHO)
    if "--who" in sys.argv:
        k = sys.argv.index("--who") + 1
        who_list = [w for w in sys.argv[k:] if not w.startswith("--")]
        for w in who_list:
            args.remove(w)
    device, name = (args + ["cpu", "gpt2"][len(args):])[:2]
    spy = shutil.which("py-spy")
    if spy is None:
        print("py-spy is not on the PATH: pip install py-spy", file=sys.stderr)
        return 2
    out = os.environ.get("OUT") or tempfile.mkdtemp()
    report = [f"# Host time per step by code, {name} ({size_name}) on {device}: py-spy --native at {rate} Hz, "
              f"{seconds:.0f} s per contender after two warm-up steps and {seconds / 2:.0f} s of unsampled steps; ms "
              "per step = the code's share of the samples (all threads) x the unsampled step's time\n"]
    results = {}
    for who in who_list:
        env = dict(os.environ)
        if who == "native-compiled":
            env["TORCH_DTR_CORE"] = "compiled"
        p = subprocess.Popen([sys.executable, __file__, device, name, size_name, who, str(seconds), "--child"],
                             env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("ready "):
            print(f"{who}: the child did not start ({line!r})", file=sys.stderr)
            p.kill()
            continue
        step_ms = float(line.split()[1])
        raw = os.path.join(out, f"spy-{device}-{name}-{who}.raw")
        subprocess.run([spy, "record", "--pid", str(p.pid), "--native", "--threads", "--rate", str(rate),
                        "--format", "raw", "--duration", str(max(1, int(seconds) - 1)), "--output", raw,
                        ], capture_output=True, text=True)
        ends = json.loads(p.stdout.read().strip().splitlines()[-1])["ends"]
        p.wait()
        results[who] = read(raw, step_ms)
        print(f"{who:16s} {step_ms:.2f} ms a step unsampled, {len(ends)} steps sampled", flush=True)
        report.append(f"- {who}: {step_ms:.2f} ms a step unsampled; {len(ends)} steps sampled")
    base = results.get("plain")
    for who, (libs, funcs, threads) in results.items():
        report.append(f"\n## {who}\n\nthreads: " + ", ".join(f"{k} {v:.2f}" for k, v in threads.most_common()))
        report.append("\n| code | ms per step | over plain |\n| --- | ---: | ---: |")
        for k, v in libs.most_common(14):
            over = f"{v - base[0].get(k, 0.0):+.2f}" if base is not None and who != "plain" else ""
            report.append(f"| {k} | {v:.2f} | {over} |")
        if base is not None and who != "plain":
            excess = {k: v - base[1].get(k, 0.0) for k, v in funcs.items()}
            report.append("\nleaf functions adding the most over plain (ms per step):\n")
            for k, v in sorted(excess.items(), key=lambda kv: -kv[1])[:25]:
                report.append(f"    {v:+6.2f}  {k}")
    text = "\n".join(report) + "\n"
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(out, f"spy-{device}-{name}.txt"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
