"""``torch-dtr bench``: torch-dtr against plain PyTorch and the alternatives, side by side.

Every contender runs in a process of its own (peak RSS is per process), and the contenders of a workload
are interleaved in rounds (A B C ... A B C ...), so slow drift of a shared machine hits them alike. Each
process warms up one step and times the next ones; a contender's step time is the median over all its
measured steps of all rounds, and its ratio is taken against plain PyTorch's median from the same run.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..deps import need_all
from . import workloads

RATIOS = (1.0, 0.7, 0.5, 0.3)
SWAP_RATIOS = (0.5, 0.3)
COMPILE_BUDGETS = (0.5, 0.3)
REMATS_PER_OP = 3  # the search's feasibility rule: a step may recompute at most 3 x its op count


@dataclass
class Plan:
    models: tuple[str, ...]
    quick: bool
    out: Path
    rounds: int = 3
    steps: int = 3
    warmup: int = 1
    threads: int = 0
    command: str = ""
    results: dict[str, Any] = field(default_factory=dict)


def spawn(spec: dict, timeout: float, memory: bool = False, progress: bool = False) -> dict:
    """Run one worker. ``memory``: with glibc's mmap threshold fixed at 64 KiB, so that freed tensors go back
    to the OS and peak RSS follows live tensors; that setting slows every large allocation (docs/design.md,
    Measuring memory), so timed runs use the allocator as users run it. ``progress``: the worker's progress
    lines go to this process's stderr as they come."""
    env = dict(os.environ)
    if memory:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    cmd = [sys.executable, "-m", "torch_dtr.bench.worker", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE,
                           text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"kind": spec["kind"], "error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        tail = (p.stderr or "").strip().splitlines()[-3:]
        return {"kind": spec["kind"], "error": f"worker exit code {p.returncode}: {' | '.join(tail)[:400]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _contenders(plan: Plan, name: str, peak: int, min_ratio: float | None, ops: int,
                ckpt_peak: int | None = None) -> list[dict]:
    cs: list[dict] = [{"kind": "plain", "label": "plain PyTorch"}]
    cap = REMATS_PER_OP * ops  # a step past this is stopped and reported as thrashing (as in the search)
    for r in RATIOS:
        cs.append({"kind": "dtr", "budget": int(peak * r), "ratio": r, "label": f"torch-dtr {r:.0%}",
                   "max_remats": cap})
        if r in SWAP_RATIOS:  # NOTE [ Swapping ]: the host tier at the CPU's modelled copy bandwidth
            cs.append({"kind": "dtr", "budget": int(peak * r), "ratio": r, "swap": True,
                       "label": f"torch-dtr + host copies {r:.0%}", "max_remats": cap})
    if min_ratio is not None:
        r = min(1.0, min_ratio * 1.03)  # a little above the bisection's edge: eviction choices vary run to run
        cs.append({"kind": "dtr", "budget": int(peak * r), "ratio": r, "label": f"torch-dtr min ({r:.0%})",
                   "is_min": True, "max_remats": cap})
    if ckpt_peak:  # issue 13: at checkpoint-every-block's tracked memory, no slower than it
        r = ckpt_peak / peak
        cs.append({"kind": "dtr", "budget": ckpt_peak, "ratio": r, "label": f"torch-dtr at block checkpointing's "
                   f"memory ({r:.0%})", "max_remats": cap})
    if name in workloads.CHECKPOINTABLE:
        cs.append({"kind": "ckpt_block", "label": "checkpoint every block"})
        cs.append({"kind": "ckpt_sqrt", "label": "checkpoint sqrt(n) segments"})
    if not plan.quick and name != "lstm":
        for mb in COMPILE_BUDGETS:  # one round only (compiling takes a while), with every round's steps
            cs.append({"kind": "compile", "mem_budget": mb, "label": f"torch.compile budget {mb}",
                       "steps": plan.steps * plan.rounds})
    return cs


def run(plan: Plan) -> dict[str, Any]:
    from tqdm import tqdm

    sizes = {m: workloads.SIZES[m]["quick" if plan.quick else "full"] for m in plan.models}
    results: dict[str, Any] = {"date": datetime.date.today().isoformat(), "machine": _machine(),
                               "command": plan.command, "quick": plan.quick, "workloads": {}}
    base = {"warmup": plan.warmup, "steps": plan.steps, "threads": plan.threads}
    total = 0
    for m in plan.models:
        extra = m in workloads.CHECKPOINTABLE  # the run that measures block checkpointing's memory, its contender
        per_round = 8 + len(SWAP_RATIOS) + extra
        total += 3 + extra + (plan.rounds + 1) * per_round + (0 if plan.quick or m == "lstm" else 4)
    bar = tqdm(total=total, desc="bench", unit="job", file=sys.stderr)
    timeout = 900 if plan.quick else 1800
    for name in plan.models:
        size = sizes[name]
        w: dict[str, Any] = {"description": workloads.describe(name, size), "size": size.__dict__}
        results["workloads"][name] = w
        common = base | {"workload": name, "size": size.__dict__}
        bar.set_description(f"{name}: smallest budget")
        search = spawn(common | {"kind": "search", "label": "search", "tolerance": 0.02 if plan.quick else 0.01,
                                  "remat_per_op": REMATS_PER_OP},
                        timeout)
        bar.update(1)
        w["search"] = search
        if "error" in search:
            w["error"] = search["error"]
            continue
        peak = search["peak_tracked"]
        ckpt_peak = None
        if name in workloads.CHECKPOINTABLE:  # its tracked peak, for a torch-dtr contender at that budget
            bar.set_description(f"{name}: checkpoint every block's memory")
            ckpt = spawn(common | {"kind": "ckpt_block", "label": "checkpoint memory", "warmup": 1, "steps": 1},
                         timeout)
            ckpt_peak = ckpt.get("peak_tracked")
            w["ckpt_block_peak"] = ckpt_peak
            bar.update(1)
        cs = _contenders(plan, name, peak, search.get("min_ratio"), search["ops"], ckpt_peak)
        runs: dict[str, list[dict]] = {c["label"]: [] for c in cs}
        for rnd in range(plan.rounds):
            for c in cs:
                if rnd > 0 and c["kind"] == "compile":  # compiling takes minutes; its time is not close anyway
                    continue
                bar.set_description(f"{name}: {c['label']} (round {rnd + 1})")
                runs[c["label"]].append(spawn(common | c, timeout) | {"spec": c})
                bar.update(1)
        mem: dict[str, dict] = {}
        for c in cs:  # the memory round: one short run per contender that trained, allocator set for RSS
            if any("error" not in r for r in runs[c["label"]]):
                bar.set_description(f"{name}: {c['label']} (memory)")
                mem[c["label"]] = spawn(common | c | {"warmup": 1, "steps": 1}, timeout, memory=True)
            bar.update(1)
        w["contenders"] = {label: _merge(rs, mem.get(label)) for label, rs in runs.items()}
        bar.set_description(f"{name}: memory timeline")
        tl_ratio = max(0.5, min(1.0, search["min_ratio"] * 1.1))
        w["timeline"] = spawn(common | {"kind": "timeline", "budget": int(peak * tl_ratio), "ratio": tl_ratio,
                                         "label": "timeline", "max_remats": REMATS_PER_OP * search["ops"]}, timeout)
        bar.update(1)
        if name != "lstm":
            bar.set_description(f"{name}: batch scaling")
            w["scale"] = spawn(common | {"kind": "scale", "label": "scale", "remat_cap": REMATS_PER_OP * search["ops"],
                                          "multiples": (2,) if plan.quick else (2, 3, 4)}, timeout * 2)
        bar.update(1)
    bar.close()
    return results


def _merge(rs: list[dict], mem: dict | None) -> dict:
    """One contender over rounds: median step over all measured steps, counters of the last timed run, peak
    RSS from the memory round (the timed runs' own peak RSS is kept as ``peak_rss_timed``)."""
    ok = [r for r in rs if "error" not in r]
    out = dict(ok[-1] if ok else rs[-1])
    out.pop("step_times", None)
    out["errors"] = [r["error"] for r in rs if "error" in r]
    if ok:
        times = [t for r in ok for t in r["step_times"]]
        out["step_s"] = statistics.median(times)
        out["step_spread"] = (min(times), max(times))
        out["peak_rss_timed"] = max(r["peak_rss"] for r in ok)
        out["rounds_ok"] = len(ok)
        out["peak_rss"] = out["rss_over_base"] = None
        if mem is not None and "error" not in mem:
            out["peak_rss"], out["rss_over_base"] = mem["peak_rss"], mem["rss_over_base"]
        elif mem is not None:
            out["errors"].append(f"memory round: {mem['error']}")
    return out


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    return (f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def main(models: tuple[str, ...], quick: bool, out: str, rounds: int | None, command: str) -> int:
    need_all(("transformers", "matplotlib", "tqdm"), "bench", "torch-dtr bench")
    from . import report

    plan = Plan(models=models, quick=quick, out=Path(out), command=command)
    if quick:
        plan.rounds, plan.steps = 1, 2
    if rounds:
        plan.rounds = rounds
    t0 = time.perf_counter()
    results = run(plan)
    results["wall_s"] = time.perf_counter() - t0
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "benchmarks.json").write_text(json.dumps(results, indent=1))
    path = report.write(results, plan.out)
    print(f"wrote {path} and its plots in {plan.out / 'img'} ({results['wall_s'] / 60:.1f} min)")
    return 0
