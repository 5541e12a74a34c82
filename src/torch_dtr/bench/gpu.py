"""``torch-dtr bench --device cuda``: torch-dtr against plain PyTorch and the alternatives on a GPU.

Budgets mean what a GPU user means (NOTE [ Device memory ]): bytes of ``torch.cuda.max_memory_allocated``.
Each contender runs in a process of its own with deterministic algorithms, so its memory peaks are its own
and its losses and final parameters can be compared bitwise with plain PyTorch's. Contenders: plain,
torch-dtr with no budget (the out-of-memory-driven mode), torch-dtr at 50% and 30% of plain's
``max_memory_allocated`` (or 1.25x torch-dtr's single-op floor where that is higher), checkpointing every
block and sqrt(n) segments, torch-dtr at block checkpointing's memory, ``torch.compile``'s activation
memory budget; then the largest batch each trains under a memory cap, and its samples/s.

``--device sim`` runs the same plan on the CPU through ``SimulatedDevice`` (the simulated caching
allocator), so that every code path here runs in CI without a GPU; its figures are not GPU figures.

A worker is ``python -m torch_dtr.bench.gpu '<json spec>'``: progress on stderr, one JSON line on stdout.
"""

from __future__ import annotations

import contextlib
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import workloads

SIM_SCALE = 1 / 16  # the simulated allocator's segment sizes, scaled to the quick sizes' tensors
# --quick: small enough for CI's 2 CPU cores, large enough that activations, not parameters, set the peak
QUICK = {"gpt2": workloads.Size(4, 4, 128, 256), "gpt2-small": workloads.Size(2, 4, 128, 256)}
MULTIPLES = (1, 2, 3, 4, 6, 8, 12, 16)


# ---------------------------------------------------------------------------------------------- the worker

def work(spec: dict) -> dict:
    import torch

    import torch_dtr

    from .worker import _unwrap

    device, kind = spec["device"], spec["kind"]
    cuda = device == "cuda"
    if cuda:
        torch.use_deterministic_algorithms(True)
    sim = torch_dtr.SimulatedDevice(spec.get("cap"), scale=spec.get("scale", SIM_SCALE)) if device == "sim" else None
    if sim is not None:
        sim.__enter__()
    elif cuda and spec.get("cap"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap"] / total))
    size = workloads.Size(**spec["size"])
    n = spec["warmup"] + spec["steps"]
    from ..core import COMPILED

    out: dict[str, Any] = {"kind": kind, "label": spec["label"], "budget": spec.get("budget"), "batch": size.batch,
                           "compiled_core": COMPILED}
    try:
        model, batches, step = workloads.build(spec["workload"], size, n)
        if cuda:
            model.cuda()
            batches = [tuple(t.cuda() for t in b) if isinstance(b, tuple) else b.cuda() for b in batches]
        if kind in ("ckpt_block", "ckpt_sqrt"):
            out["segments"] = workloads.checkpoint_blocks(spec["workload"], model, kind[5:])
        if kind == "compile":
            import torch._functorch.config as fconf

            fconf.activation_memory_budget = spec["mem_budget"]
            model = torch.compile(model)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        elif sim is not None:
            sim.reset_peak()
        if "swap_side" in spec:  # where copies out run (NOTE [ Host copies ] 2), for comparisons
            import torch_dtr.eager.swap as host_tier

            host_tier.SIDE_STREAM = spec["swap_side"]
        if kind == "dtr":
            # on CUDA enable() switches expandable segments on by default; the simulated device follows it
            torch_dtr.enable(budget=spec.get("budget"), device=sim,
                             expandable_segments=spec.get("expandable", True if sim is not None else None),
                             swap=spec.get("swap", False))
            if cuda:
                out["allocator_settings"] = _allocator_settings()
        if kind == "native":  # the compiled front end (on CUDA its budget bounds the allocator's count: docs/native.md)
            from .. import native

            native.enable(spec.get("budget"), swap=spec.get("swap", False))
        noop = (_noop_mode() if kind == "noop" else torch.autograd.graph.save_on_cpu(pin_memory=cuda)
                if kind == "save_on_cpu" else contextlib.nullcontext())
        prof = cProfile.Profile() if spec.get("profile") else None
        times, losses = [], []
        try:
            for i, b in enumerate(batches):
                torch.manual_seed(100 + i)
                if prof is not None and i == spec["warmup"]:
                    prof.enable()
                t0 = time.perf_counter()
                with noop:
                    loss = step(model, b)
                sync()
                dt = time.perf_counter() - t0
                losses.append(float(_unwrap(loss)))  # as each front end gives a plain value (worker.py)
                if i >= spec["warmup"]:
                    times.append(dt)
                print(f"    {spec['label']} (batch {size.batch}): step {i + 1}/{n} {dt:.3f} s", file=sys.stderr,
                      flush=True)
        finally:
            if prof is not None:
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
                Path(spec["profile"]).write_text(text.getvalue())
            if kind == "native":
                from .. import native

                nst = native.stats()
                native.disable()
                out |= {"evictions": nst["evictions"], "remats": nst["rematerializations"],
                        "ops": nst["managed_ops"], "peak_counted": nst["peak_bytes"], "floor": nst["floor_bytes"],
                        "swaps_out": nst["swaps_out"], "swaps_in": nst["swaps_in"], "host_peak": nst["host_peak_bytes"]}
            if kind == "dtr":
                st = torch_dtr.stats()
                torch_dtr.disable()
                out |= {"evictions": st.evictions, "remats": st.rematerializations, "oom_retries": st.oom_retries,
                        "syncs": st.syncs, "ops": st.ops, "floor": st.floor_bytes, "peak_counted": st.peak_bytes,
                        "swaps_out": st.swaps_out, "swaps_in": st.swaps_in, "host_peak": st.host_peak_bytes}
        out |= {"step_s": statistics.median(times), "losses": losses, "digest": workloads.digest(model)}
    except (torch_dtr.BudgetError, torch.OutOfMemoryError) as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if cuda:
        out |= {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}
    elif sim is not None:
        out |= {"max_allocated": sim.max_allocated(), "max_reserved": sim.peak_reserved}
        sim.__exit__(None, None, None)
    return out


def _allocator_settings() -> str:
    import torch

    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return get() if get is not None else "?"


def _noop_mode() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Noop(TorchDispatchMode):
        """A do-nothing dispatch mode: what any Python mode costs per op, for the per-op path's ratio."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            return func(*args, **(kwargs or {}))

    return Noop()


# ---------------------------------------------------------------------------------------------- the runner
def spawn(spec: dict, timeout: float) -> dict:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    if spec.get("core"):  # "compiled": the worker's core is the compiled one (NOTE [ Compiled core ])
        env["TORCH_DTR_CORE"] = spec["core"]
    cmd = [sys.executable, "-m", "torch_dtr.bench.gpu", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"label": spec["label"], "error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        tail = (p.stderr or "").strip().splitlines()[-3:]
        return {"label": spec["label"], "error": f"worker exit code {p.returncode}: {' | '.join(tail)[:400]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def plan_workload(name: str, device: str, quick: bool, cap: int | None, say: Any) -> dict:
    """Every contender of one workload, then the largest batch of each under ``cap``."""
    size = QUICK.get(name, workloads.SIZES[name]["quick"]) if quick else workloads.SIZES[name]["full"]
    common = {"device": device, "workload": name, "size": size.__dict__,
              "warmup": 1, "steps": 2 if quick else 3}
    timeout = 1800
    w: dict[str, Any] = {"description": workloads.describe(common["workload"], size), "contenders": []}

    def run(spec: dict) -> dict:
        say(f"{name}: {spec['label']}")
        r = spawn(common | spec, timeout)
        w["contenders"].append(r)
        return r

    plain = run({"kind": "plain", "label": "plain PyTorch"})
    if "error" in plain:
        w["error"] = plain["error"]
        return w
    free = run({"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"})
    floor = free.get("floor", 0)
    done = set()
    for r in (0.5, 0.3):  # below 1.25x the single-op floor there is no room to recompute: the floor's then
        b = max(int(plain["max_allocated"] * r), int(1.25 * floor))
        if b in done or b >= plain["max_allocated"]:
            continue
        done.add(b)
        tag = f"{b / plain['max_allocated']:.0%}" + ("" if b == int(plain["max_allocated"] * r) else " (1.25x floor)")
        run({"kind": "dtr", "budget": b, "label": f"torch-dtr {tag}"})
        run({"kind": "dtr", "budget": b, "swap": True, "label": f"torch-dtr + host copies {tag}"})
    run({"kind": "save_on_cpu", "label": "save_on_cpu (every saved activation to host memory)"})
    if common["workload"] in workloads.CHECKPOINTABLE:
        block = run({"kind": "ckpt_block", "label": "checkpoint every block"})
        run({"kind": "ckpt_sqrt", "label": "checkpoint sqrt(n) segments"})
        if "max_allocated" in block and "error" not in block:
            run({"kind": "dtr", "budget": block["max_allocated"], "label": "torch-dtr at block checkpointing's memory"})
    if device == "cuda" and not quick and name != "lstm":
        for mb in (0.5, 0.3):
            run({"kind": "compile", "mem_budget": mb, "label": f"torch.compile budget {mb}"})
    for r in w["contenders"]:
        r["bitwise"] = r.get("losses") == plain["losses"] and r.get("digest") == plain["digest"]
    cap = cap or plain["max_reserved"]  # what plain PyTorch needed from the device at the base batch
    w["cap"] = cap
    w["scale"] = []
    tries = [{"kind": "plain", "label": "plain PyTorch"},
             {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"},
             {"kind": "dtr", "budget": int(cap * 0.8), "label": "torch-dtr, budget 80% of the cap"},
             {"kind": "dtr", "budget": int(cap * 0.8), "swap": True,
              "label": "torch-dtr + host copies, budget 80% of the cap"},
             {"kind": "save_on_cpu", "label": "save_on_cpu"}]
    if common["workload"] in workloads.CHECKPOINTABLE:
        tries.insert(1, {"kind": "ckpt_block", "label": "checkpoint every block"})
    for t in tries:
        best = None
        for m in MULTIPLES[:2] if quick else MULTIPLES:  # quick: a smoke test of the search (x1, x2)
            say(f"{name}: {t['label']} under the cap, batch x{m}")
            r = spawn(common | t | {"cap": cap, "steps": 1, "size": size.__dict__ | {"batch": size.batch * m}}, timeout)
            if "error" in r:
                break
            best = r
        w["scale"].append({"label": t["label"], "batch": best["batch"] if best else 0,
                           "samples_s": best["batch"] / best["step_s"] if best else 0.0})
    return w


def _machine(device: str) -> str:
    import torch

    host = (f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, torch {torch.__version__}")
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, {host}"
    return f"the CPU with a simulated caching allocator (not GPU figures), {host}"


def main(models: tuple[str, ...], device: str, quick: bool, out: str, cap: int | None, command: str) -> int:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("torch-dtr bench --device cuda: no CUDA device here (torch.cuda.is_available() is False); "
              "--device sim runs the same plan on the CPU through the simulated allocator", file=sys.stderr)
        return 2
    from tqdm import tqdm

    t0 = time.perf_counter()
    results: dict[str, Any] = {"date": datetime.date.today().isoformat(), "device": device,
                               "machine": _machine(device), "command": command, "quick": quick, "workloads": {}}
    bar = tqdm(desc="bench", unit="run", file=sys.stderr)

    def say(what: str) -> None:
        bar.set_description(what)
        bar.update(1)

    for name in models:
        results["workloads"][name] = plan_workload(name, device, quick, cap, say)
    bar.close()
    results["wall_s"] = time.perf_counter() - t0
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = "benchmarks-cuda" if device == "cuda" else "benchmarks-sim"
    (folder / f"{stem}.json").write_text(json.dumps(results, indent=1))
    path = folder / f"{stem}.md"
    path.write_text(report(results))
    print(f"wrote {path} ({results['wall_s'] / 60:.1f} min)")
    return 0


def _mb(n: int | None) -> str:
    return "-" if not n else f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def report(res: dict) -> str:
    lines = [f"# torch-dtr on {'a GPU' if res['device'] == 'cuda' else 'a simulated device'}", "",
             f"{res['date']}, {res['machine']}. Command: `{res['command']}` ({res['wall_s'] / 60:.1f} min). "
             "Each contender in a process of its own with deterministic algorithms; memory is the allocator's "
             "(`max_memory_allocated`, `max_memory_reserved`); budgets bound `max_memory_allocated`; step: median "
             "of the steps after one warm-up; bitwise: losses and final parameters equal to plain PyTorch's; torch-dtr "
             "runs with `enable()`'s defaults (expandable segments switched on for the session).", ""]
    for name, w in res["workloads"].items():
        lines += [f"## {name}", "", w["description"] + ".", ""]
        if "error" in w:
            lines += [f"plain PyTorch failed: {w['error']}", ""]
            continue
        plain = w["contenders"][0]
        lines += ["| contender | budget | max allocated | of plain | max reserved | reserved / allocated | step | "
                  "vs plain | bitwise | evictions | recomputations | copies back | note |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
        for r in w["contenders"]:
            alloc, resv = r.get("max_allocated"), r.get("max_reserved")
            step = r.get("step_s")
            ms = f"{step * 1e3:.1f} ms" if step else "-"
            ratio = f"{step / plain['step_s']:.2f}x" if step else "-"
            same = "yes" if r.get("bitwise") else "NO" if step else "-"
            note = r.get("error", "")[:160]
            if not alloc:
                lines.append(f"| {r['label']} | {_mb(r.get('budget'))} | - | - | - | - | - | - | - | - | - | - | "
                             f"{note} |")
                continue
            lines.append(
                f"| {r['label']} | {_mb(r.get('budget'))} | {_mb(alloc)} | {alloc / plain['max_allocated']:.0%} | "
                f"{_mb(resv)} | {resv / alloc if resv else 0:.2f} | {ms} | {ratio} | {same} | "
                f"{r.get('evictions', '-')} | {r.get('remats', '-')} | {r.get('swaps_in', '-')} | {note} |")
        if not w.get("scale"):
            lines.append("")
            continue
        lines += ["", f"Largest batch under a cap of {_mb(w['cap'])} (multiples of the batch above, one step each):",
                  "", "| contender | largest batch | samples/s |", "| --- | ---: | ---: |"]
        lines += [f"| {s['label']} | {s['batch']} | {s['samples_s']:.1f} |" for s in w["scale"]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(work(json.loads(sys.argv[1]))))
