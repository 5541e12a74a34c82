"""The CPU as a device (NOTE [ The CPU as a device ]): what the process holds under a budget with and without it.

    python benchmarks/cpu_device.py   # about 5 minutes on 2 cores; writes docs/cpu-device.md

Workloads: the bench's GPT-2 and LSTM loop (full size), and a transformer encoder (6 layers, width 512, batch 16 x 256,
AdamW: issue 52's example, whose process peaked at 1,851 MiB RSS under a tracked budget of 560 MiB). Each contender
trains 3 steps in a process of its own, with glibc's mmap threshold fixed at 64 KiB (so that freed tensors go back to
the OS and RSS follows live tensors, as `torch-dtr bench` measures RSS). *RSS over base*: the peak resident set minus
what the process held after building the model and data (the parameters are in the base). *Count*:
`stats().peak_bytes` (with the device: the allocator's own peak plus the parameters and inputs). Budgets with the
device: fractions of the whole count that a run with the device and no budget measured.
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
def status(key):  # RssFile: pages of mapped files (libraries' code and data); RssAnon: the process's own data
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
name, mode, budget = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if name == "encoder":
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [torch.randn(16, 256, 512) for _ in range(3)]
    def step(m, x):
        loss = m(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
else:
    model, batches, step = workloads.build(name, workloads.SIZES[name]["full"], 3, 0)
base, base_file, base_anon = rss(), status("RssFile"), status("RssAnon")
if mode != "plain":
    torch_dtr.enable(budget=budget, device="cpu" if mode == "cpu" else None)
out = {"times": [], "error": None, "loaded": status("RssAnon") - base_anon}  # torch-dtr's modules and session
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
out["code"] = status("RssFile") - base_file
if mode != "plain":
    st = torch_dtr.stats()
    out |= {"count": st.peak_bytes, "excess": st.excess_bytes, "evictions": st.evictions,
            "remats": st.rematerializations, "retries": st.oom_retries}
    torch_dtr.disable()
out["digest"] = workloads.digest(model)
print(json.dumps(out))
"""

MiB = 2**20
# name, description, the tracked budget to compare (bytes): 30% of the bench's tracked peak (docs/benchmarks.md), or
# the 560 MiB
WORKLOADS = (
    ("gpt2", "the bench's GPT-2 (6 layers, width 512, sequence 256, batch 4, AdamW)", int(695.8 * 0.3 * MiB),
     "30% of the tracked peak"),
    ("lstm", "the bench's LSTM loop (width 768, batch 32, mean length 96, AdamW)", int(177.4 * 0.3 * MiB),
     "30% of the tracked peak"),
    ("encoder", "a transformer encoder (6 layers, width 512, 8 heads, batch 16 x 256, AdamW)", 560 * MiB, "560 MiB"),
)
RATIOS = (0.7, 0.6)


def run(name: str, mode: str, budget: int | None) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    p = subprocess.run([sys.executable, "-c", WORKER, name, mode, json.dumps(budget)], env=env, capture_output=True,
                       text=True, check=False)
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1][:200], "times": []}
    return json.loads(p.stdout.strip().splitlines()[-1])


def row(label: str, b: str, r: dict, plain: dict, budget: int | None = None) -> str:
    if r.get("error") and not r["times"]:
        return f"| {label} | {b} | - | - | - | - | - | - | - | - | {r['error']} |"
    err = f" (stopped: {r['error']})" if r.get("error") else ""
    count = f"{r['count'] / MiB:.1f}" if "count" in r else "-"
    over = f"{r['excess'] / MiB:.1f} MiB ({r['warned']}), {r['retries']}" if "excess" in r else "-"
    later = r["times"][1:]
    step = f"{sorted(later)[len(later) // 2]:.2f}" if later else "-"
    same = "-" if r.get("error") else "yes" if r["digest"] == plain["digest"] else "no"
    rest = r["rss_over_base"] - r["code"] - r["loaded"]
    ratio = f" ({rest / budget:.2f})" if budget else ""
    return (f"| {label} | {b} | {r['rss_over_base'] / MiB:.1f} | {r['code'] / MiB:.1f}, {r['loaded'] / MiB:.1f} | "
            f"{rest / MiB:.1f}{ratio} | {count} | {over} | {r.get('evictions', '-')} | "
            f"{r.get('remats', '-')} | {step}{err} | {same} |")


def main() -> None:
    t0 = time.perf_counter()
    lines = [
        "# The CPU as a device: a budget on the process's tensor memory",
        "",
        f"{date.today()}, {platform.machine()} CPU, Python {platform.python_version()}, torch {torch.__version__}; "
        "`python benchmarks/cpu_device.py` (TOTAL). NOTE [ The CPU as a device ] in src/torch_dtr/native/cpudevice.py "
        "says what is counted; the script's docstring, how this was measured. Step: the median of steps 2-3 of one "
        "process, with glibc's mmap threshold fixed, which slows plain PyTorch's large allocations and not those of "
        "torch-dtr's own CPU allocator: not a comparison of speed (docs/benchmarks.md has one).",
    ]
    for name, what, tracked_budget, tracked_label in WORKLOADS:
        plain = run(name, "plain", None)
        whole = run(name, "cpu", None)
        print(name, "plain", plain, "whole", whole, file=sys.stderr, flush=True)
        rows = [row("plain PyTorch", "-", plain, plain), row("device='cpu', no budget", "-", whole, plain)]
        r = run(name, "tracked", tracked_budget)
        rows.append(row(f"no device, {tracked_label}", f"{tracked_budget / MiB:.1f} MiB", r, plain, tracked_budget))
        for ratio in RATIOS:
            b = int(whole["count"] * ratio)
            r = run(name, "cpu", b)
            print(name, ratio, r, file=sys.stderr, flush=True)
            rows.append(row(f"device='cpu', {ratio:.0%} of its count", f"{b / MiB:.1f} MiB", r, plain, b))
        if name == "encoder":
            r = run(name, "cpu", tracked_budget)
            rows.append(row("device='cpu', 560 MiB", f"{tracked_budget / MiB:.1f} MiB", r, plain, tracked_budget))
        lines += ["", f"## {name}: {what}", "",
                  "| contender | budget | RSS over base (MiB) | of it: code pages, torch-dtr loaded (MiB) | the rest "
                  "(MiB; / budget) | count's peak (MiB) | passed by (warned), refused | evictions | recomputations | "
                  "step (s) | bitwise with plain |",
                  "| --- " * 11 + "|", *rows]
    lines += [
        "",
        "Without the device the budget bounds what torch-dtr tracks (parameters, inputs, managed values): AdamW's "
        "moments (twice the parameters), the gradients and plain temporaries lie outside it, so the process holds "
        "more than the budget over its base. With `device=\"cpu\"` the budget bounds all of it; the smallest budget is "
        "then set by the optimizer's step (parameters, gradients, moments and the foreach update's temporaries at "
        "once) as often as by the activations. *Passed by*: what the runtime's count found the allocator's above the "
        "budget at a query (warned); *refused*: blocks the allocator refused at the budget, each op then evicting "
        "and running again (NOTE [ The CPU as a device ] 6-7). RSS also holds what is no tensor memory, which no "
        "budget of tensors can hold: *code pages* (growth of the process's RssFile: libraries' code a step runs for "
        "the first time, which plain PyTorch pays too) and *torch-dtr loaded* (growth of RssAnon in `enable()`: its "
        "modules, the C++ extension and the session); *the rest*, the RSS "
        "over base less those two, is what the budget is compared with. It holds the C heap beside the tensors "
        "(torch-dtr's C++ recipes of the ops a step ran: the LSTM loop runs about 7,000 a step).",
    ]
    out = Path(__file__).resolve().parent.parent / "docs" / "cpu-device.md"
    out.write_text("\n".join(lines).replace("(TOTAL)", f"({time.perf_counter() - t0:.0f} s)") + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
