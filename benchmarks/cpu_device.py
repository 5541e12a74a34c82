"""The CPU as a device (NOTE [ The CPU as a device ]): what the process holds under a budget with and without it.

    python benchmarks/cpu_device.py   # the bench's GPT-2 (full size), about 2 minutes; writes docs/cpu-device.md

Each contender trains 3 steps in a process of its own, with glibc's mmap threshold fixed at 64 KiB (so that freed
tensors go back to the OS and RSS follows live tensors, as `torch-dtr bench` measures RSS). *RSS over base*: the
peak resident set minus what the process held after building the model and data (the parameters are in the base).
*Count*: `stats().peak_bytes` (with the device: the allocator's own peak plus the parameters and inputs).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

WORKER = r"""
import json, os, resource, sys, time, warnings, torch, torch_dtr
from torch_dtr.bench import workloads
def rss():
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
mode, budget = sys.argv[1], json.loads(sys.argv[2])
model, batches, step = workloads.build("gpt2", workloads.SIZES["gpt2"]["full"], 3, 0)
base = rss()
if mode != "plain":
    torch_dtr.enable(budget=budget, device="cpu" if mode == "cpu" else None)
out = {"times": [], "error": None}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        for i, b in enumerate(batches):
            torch.manual_seed(100 + i); t0 = time.perf_counter(); step(model, b)
            out["times"].append(time.perf_counter() - t0)
    except torch_dtr.BudgetError as e:
        out["error"] = str(e)[:160]
    out["warned"] = sum("more than the budget" in str(x.message) for x in w)
out["rss_over_base"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
if mode != "plain":
    st = torch_dtr.stats()
    out |= {"count": st.peak_bytes, "excess": st.excess_bytes, "evictions": st.evictions,
            "remats": st.rematerializations}
    torch_dtr.disable()
out["digest"] = workloads.digest(model)
print(json.dumps(out))
"""

MiB = 2**20


def run(mode: str, budget: int | None) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    p = subprocess.run([sys.executable, "-c", WORKER, mode, json.dumps(budget)], env=env, capture_output=True,
                       text=True, check=False)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1][:200], "times": []}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    t0 = time.perf_counter()
    plain = run("plain", None)
    print("plain", plain, file=sys.stderr, flush=True)
    whole = run("cpu", None)
    print("cpu, no budget", whole, file=sys.stderr, flush=True)
    tracked = 695.8  # the bench's tracked peak of this workload (docs/benchmarks.md)
    rows = [("plain PyTorch", "-", plain), ("device='cpu', no budget", "-", whole)]
    for label, mode, b in (("tracked budget (30% of the tracked peak)", "tracked", int(tracked * 0.3 * MiB)),
                           ("device='cpu', 600 MiB", "cpu", 600 * MiB), ("device='cpu', 530 MiB", "cpu", 530 * MiB),
                           ("device='cpu', 450 MiB", "cpu", 450 * MiB)):
        r = run(mode, b)
        print(label, r, file=sys.stderr, flush=True)
        rows.append((label, f"{b / MiB:.1f} MiB", r))
    lines = [
        "# The CPU as a device: a budget on the process's tensor memory",
        "",
        f"{date.today()}, {platform.machine()} CPU, Python {platform.python_version()}, torch {torch.__version__}; "
        f"`python benchmarks/cpu_device.py` ({time.perf_counter() - t0:.0f} s). The bench's GPT-2 (6 layers, width "
        "512, sequence 256, batch 4, AdamW), 3 steps per process. NOTE [ The CPU as a device ] in "
        "src/torch_dtr/native/cpudevice.py says what is counted; the script's docstring, how this was measured.",
        "",
        "| contender | budget | RSS over base (MiB) | count's peak (MiB) | passed by (warned) | evictions | "
        "recomputations | step (s) | bitwise with plain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, b, r in rows:
        if r.get("error") and not r["times"]:
            lines.append(f"| {label} | {b} | - | - | - | - | - | - | {r['error']} |")
            continue
        err = f" (stopped: {r['error']})" if r.get("error") else ""
        count = f"{r['count'] / MiB:.1f}" if "count" in r else "-"
        over = f"{r['excess'] / MiB:.1f} MiB ({r['warned']})" if "excess" in r else "-"
        step = f"{sorted(r['times'][1:])[len(r['times'][1:]) // 2]:.2f}" if len(r["times"]) > 1 else "-"
        same = "-" if r.get("error") else "yes" if r["digest"] == plain["digest"] else "no"
        lines.append(f"| {label} | {b} | {r['rss_over_base'] / MiB:.1f} | {count} | {over} | "
                     f"{r.get('evictions', '-')} | {r.get('remats', '-')} | {step}{err} | {same} |")
    lines += [
        "",
        "Without the device the budget bounds what torch-dtr tracks (parameters, inputs, managed values): AdamW's "
        "moments (twice the parameters, 178 MiB here), the gradients and plain temporaries lie outside it, so the "
        "process holds about twice the budget over its base. With `device=\"cpu\"` the budget bounds all of it; the "
        "smallest budget is then set by the optimizer's step (parameters, gradients, moments and the foreach "
        "update's temporaries at once), not by the activations. Step times: one process each, one after another, "
        "the median of steps 2-3 (not interleaved: docs/benchmarks.md has the interleaved timings).",
    ]
    out = Path(__file__).resolve().parent.parent / "docs" / "cpu-device.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
