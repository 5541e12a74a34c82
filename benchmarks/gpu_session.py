"""One short GPU session's checks, in priority order under a deadline: writes OUT/gpu-session.json.

    PYTHONPATH=src python benchmarks/gpu_session.py OUT [--deadline 420] [--device cuda|sim] [--quick]

A lent GPU comes with minutes, not hours, so this runs the contenders of ``torch-dtr bench --device cuda``
(the same worker, one process per contender) in the order the open questions need them, and skips what the
deadline leaves no room for: GPT-2 small at no budget, 50%, 30% of plain's peak and against checkpointing;
the bench's other models at no budget (the per-op path's cost); the largest batch under a 16 GiB cap;
torch.compile's memory budget. Results are saved after every run, in the bench's JSON form, so that
``python benchmarks/gpu_session.py --render FILE`` writes docs/benchmarks-cuda.md from them here.
``--device sim --quick`` runs the same plan on the CPU (to check the plumbing before a lease).

``--plan native`` builds the C++ front end on the device (33 s on the lent H100s' image) and, where mypy is
importable, the compiled core too; the image has mypy_extensions but not mypy: carry a mypy wheel for its Python
(3.12) and the wheels it needs that the image lacks (see the device tool's README for carrying wheels).
``--plan native-next`` measures what that left open (the native budget on the allocator, its host tier,
ResNet-50, the largest batch under the cap).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from torch_dtr.bench import gpu, workloads


def allocator_query_cost(device: str) -> dict:
    """Microseconds per read of the allocator's counters (what a budgeted runtime pays every sync)."""
    import torch

    from torch_dtr.eager.device import CudaDevice

    if device != "cuda":
        return {}
    d = CudaDevice()
    x = torch.empty(1 << 20, device="cuda")
    for _ in range(100):
        d.usage()
    t0 = time.perf_counter()
    for _ in range(2000):
        d.usage()
    per = (time.perf_counter() - t0) / 2000
    t0 = time.perf_counter()
    for _ in range(200):
        torch.cuda.memory_stats()
    full = (time.perf_counter() - t0) / 200
    del x
    return {"usage_us": per * 1e6, "memory_stats_us": full * 1e6}


def _per_op(w: dict) -> str:
    """The host cost per managed op, where a do-nothing mode and a front end at no budget both ran."""
    by = {c["label"]: c for c in w["contenders"] if c.get("step_s")}
    plain, noop = by.get("plain PyTorch"), by.get("a do-nothing dispatch mode")
    if not (plain and noop):
        return ""
    out = []
    for label in ("torch-dtr, no budget", "torch-dtr native, no budget"):
        c = by.get(label)
        if not (c and c.get("ops")):
            continue
        per_step = c["ops"] / len(c["losses"])  # the warm-up step and the timed ones
        mode = (noop["step_s"] - plain["step_s"]) / per_step * 1e6
        ours = (c["step_s"] - plain["step_s"]) / per_step * 1e6
        out.append(f"Per managed op ({per_step:.0f} a step): a do-nothing dispatch mode adds {mode:.1f} us, {label} "
                   f"{ours:.1f} us ({ours / mode:.1f}x the mode's); step {c['step_s'] / plain['step_s']:.2f}x plain.\n")
    return "".join(out)


def _render(path: Path, i: int) -> str:
    res = json.loads(path.read_text())
    text = gpu.report(res)
    if i:
        text = text.replace("# torch-dtr on a GPU", "# Follow-up run on a GPU", 1)
    for name, w in res["workloads"].items():
        line = _per_op(w)
        if line:
            text = text.replace(f"## {name}\n", f"## {name}\n\n{line}", 1)
    q = res.get("allocator_query") or {}
    if q:
        text += (f"\nOne read of the allocator's counters (`CudaDevice.usage`, the raw `_cuda_memoryStats`): "
                 f"{q['usage_us']:.1f} us; `torch.cuda.memory_stats()`: {q['memory_stats_us']:.1f} us. A budgeted "
                 "runtime reads them once every 64 managed ops (`sync_every`).\n")
    if res.get("skipped"):
        text += f"\nSkipped for the session's deadline: {', '.join(res['skipped'])}.\n"
    return text + f"\nThe raw results: `{path}`.\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds; runs that would start after it are skipped")
    ap.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cap", default="16GiB")
    ap.add_argument("--plan", choices=("first", "followup", "swap", "swap-lstm", "native", "native-next",
                                                "native-feasible", "native-targets"),
                    default="first",
                    help="followup: the per-op path against a do-nothing mode, profiled, and expandable segments off; "
                         "swap: the host tier on GPT-2 small against recomputation alone and save_on_cpu; "
                         "native: the compiled front end at no budget against the Python one (the per-op targets); "
                         "native-next: what the first native session left open (its budget on the allocator, its "
                         "host tier, ResNet-50, the largest batch); native-feasible: the budgets native-next found "
                         "infeasible, raised (the LSTM loop at 65%, ResNet-50 at 75%), and the bench's GPT-2 again")
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.3], help="swap-lstm: budgets, of plain's peak")
    ap.add_argument("--streams", action="store_true", help="swap-lstm: copies out on the compute stream too, "
                    "instead of recomputing only")
    ap.add_argument("--models", nargs="+", default=None,
                    help="native-targets: only these workloads (gpt2-small gpt2 lstm resnet50)")
    ap.add_argument("--native-only", action="store_true", help="native: plain and the compiled front end only")
    ap.add_argument("--render", nargs="+", default=None,
                    help="write docs/benchmarks-cuda.md from saved gpu-session.json files, in order")
    a = ap.parse_args()
    if a.render:
        notes = Path("docs/gpu/notes.md")
        parts = ([notes.read_text()] if notes.exists() else []) + [_render(Path(f), i) for i, f in enumerate(a.render)]
        Path("docs/benchmarks-cuda.md").write_text("\n".join(parts))
        print("wrote docs/benchmarks-cuda.md")
        return 0
    from torch_dtr import parse_budget

    t_start = time.perf_counter()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"date": datetime.date.today().isoformat(), "device": a.device,
                           "machine": gpu._machine(a.device), "quick": a.quick, "workloads": {},
                           "command": f"python benchmarks/gpu_session.py --deadline {a.deadline:.0f}"
                                      + (" --quick" if a.quick else ""),
                           "allocator_query": allocator_query_cost(a.device), "skipped": []}

    def save() -> None:
        res["wall_s"] = time.perf_counter() - t_start
        (out / "gpu-session.json").write_text(json.dumps(res, indent=1))

    def size_of(name: str) -> workloads.Size:
        if a.quick:
            return gpu.QUICK.get(name, workloads.SIZES[name]["quick"])
        return workloads.SIZES[name]["full"]

    def w_of(name: str) -> dict:
        if name not in res["workloads"]:
            res["workloads"][name] = {"description": workloads.describe(name, size_of(name)), "contenders": [],
                                      "scale": [], "cap": parse_budget(a.cap) if a.device == "cuda" else 0}
        return res["workloads"][name]

    def run(name: str, spec: dict, steps: int = 3, size: workloads.Size | None = None) -> dict | None:
        left = a.deadline - (time.perf_counter() - t_start)
        if left < 20:
            res["skipped"].append(f"{name}: {spec['label']}")
            save()
            return None
        common = {"device": a.device, "workload": name, "size": (size or size_of(name)).__dict__,
                  "warmup": 1, "steps": steps}
        print(f"[{time.perf_counter() - t_start:6.1f} s] {name}: {spec['label']}", flush=True)
        r = gpu.spawn(common | spec, timeout=max(20.0, left))
        plain = next((c for c in w_of(name)["contenders"] if c["kind"] == "plain"), None) if "kind" in r else None
        r.setdefault("kind", spec["kind"])
        if plain is not None and "losses" in r:
            r["bitwise"] = r.get("losses") == plain.get("losses") and r.get("digest") == plain.get("digest")
        elif spec["kind"] == "plain":
            r["bitwise"] = True
        print(f"    -> {json.dumps({k: v for k, v in r.items() if k != 'losses'})}", flush=True)
        if size is None:
            w_of(name)["contenders"].append(r)
        save()
        return r

    if a.plan == "followup":
        return followup(a, run, save, out, t_start, res)
    if a.plan == "swap":
        return swap(a, run, save, w_of, size_of, t_start, res)
    if a.plan == "swap-lstm":
        return swap_lstm(run, save, t_start, res, a.ratios, a.streams)
    if a.plan == "native":
        return native_plan(run, save, t_start, res, a.native_only)
    if a.plan == "native-next":
        return native_next(run, save, w_of, size_of, t_start, res)
    if a.plan == "native-feasible":
        return native_feasible(run, save, t_start, res)
    if a.plan == "native-targets":
        return native_targets(run, save, out, t_start, res, a.models)
    # 1. GPT-2 small: the budgets and checkpointing (the GPU issue's figures)
    plain = run("gpt2-small", {"kind": "plain", "label": "plain PyTorch"})
    if plain and "max_allocated" in plain and "error" not in plain:
        free = run("gpt2-small", {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"}) or {}
        floor, done = free.get("floor", 0), set()
        for ratio in (0.5, 0.3):  # below 1.25x the single-op floor there is no room to recompute
            b = max(int(plain["max_allocated"] * ratio), int(1.25 * floor))
            if b in done or b >= plain["max_allocated"]:
                continue
            done.add(b)
            run("gpt2-small", {"kind": "dtr", "budget": b, "label": f"torch-dtr {b / plain['max_allocated']:.0%}"
                               + ("" if b == int(plain["max_allocated"] * ratio) else " (1.25x floor)")})
        block = run("gpt2-small", {"kind": "ckpt_block", "label": "checkpoint every block"})
        if block and "max_allocated" in block and "error" not in block:
            run("gpt2-small", {"kind": "dtr", "budget": block["max_allocated"],
                               "label": "torch-dtr at block checkpointing's memory"})
    # 2. the per-op path on the bench's other models: no budget against plain
    for name in ("gpt2", "lstm", "resnet50"):
        p = run(name, {"kind": "plain", "label": "plain PyTorch"})
        if p and "error" not in p:
            run(name, {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"})
    # 3. the largest batch of GPT-2 small under the cap
    w = w_of("gpt2-small")
    cap = w["cap"] or (plain or {}).get("max_reserved", 0)
    w["cap"] = cap
    largest_batch(run, save, w, "gpt2-small", size_of("gpt2-small"), cap, (1, 2, 4, 6, 8),
                  ({"kind": "plain", "label": "plain PyTorch"},
                   {"kind": "ckpt_block", "label": "checkpoint every block"},
                   {"kind": "dtr", "budget": int(cap * 0.8), "label": "torch-dtr, budget 80% of the cap"}))
    # 4. torch.compile's activation memory budget
    if a.device == "cuda":
        run("gpt2-small", {"kind": "compile", "mem_budget": 0.5, "label": "torch.compile budget 0.5"})
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}")
    return 0


def _native_built(res: dict, save: Any) -> bool:
    """Build the compiled front end on the device (it needs a C++ compiler and ninja there), timed."""
    from torch_dtr import native

    t0 = time.perf_counter()
    ok = native.available()
    res["native_build_s"] = time.perf_counter() - t0
    print(f"native front end: {'built' if ok else 'NOT built'} in {res['native_build_s']:.0f} s", flush=True)
    if not ok:
        save()
    return ok


def native_plan(run: Any, save: Any, t_start: float, res: dict, native_only: bool = False) -> int:
    """The per-op targets: at no budget plain, a do-nothing mode, the compiled front end and the Python one on each
    model (five timed steps), then GPT-2 small at 50% of plain's peak and the host tier on the LSTM loop with both
    front ends (the compiled front end is built on the device first: it needs a C++ compiler and ninja there).
    ``native_only``: the compiled front end's runs and plain's alone (the others measured in an earlier call)."""
    from torch_dtr.core.compiled import CompiledCoreUnavailable, build

    try:  # the compiled core's contenders where it builds (the device image lacks mypy: carry its wheel)
        build()
        compiled = True
    except (CompiledCoreUnavailable, OSError) as e:
        print(f"the compiled core cannot be built here ({e}): its contenders are skipped", flush=True)
        compiled = False
    res["command"] = res["command"] + " --plan native"
    if not _native_built(res, save):
        return 1
    for name in ("gpt2-small", "lstm", "gpt2", "resnet50"):
        p = run(name, {"kind": "plain", "label": "plain PyTorch"}, steps=5)
        if p is None or "error" in p:
            continue
        run(name, {"kind": "native", "budget": None, "label": "torch-dtr native, no budget"}, steps=5)
        if compiled:
            run(name, {"kind": "native", "budget": None, "core": "compiled",
                       "label": "torch-dtr native, compiled core, no budget"}, steps=5)
        if not native_only:
            run(name, {"kind": "noop", "label": "a do-nothing dispatch mode"}, steps=5)
            run(name, {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"}, steps=5)
        if name == "gpt2-small":
            b = p["max_allocated"] // 2
            run(name, {"kind": "native", "budget": b, "label": "torch-dtr native 50%"}, steps=5)
            if compiled:
                run(name, {"kind": "native", "budget": b, "core": "compiled",
                           "label": "torch-dtr native, compiled core, 50%"}, steps=5)
            if not native_only:
                run(name, {"kind": "dtr", "budget": b, "label": "torch-dtr 50%"}, steps=5)
        if name == "lstm":  # the host tier where copies pay
            b = int(p["max_allocated"] * 0.65)
            run(name, {"kind": "native", "budget": b, "swap": True, "label": "torch-dtr native + host copies 65%"},
                steps=5)
            if not native_only:
                run(name, {"kind": "dtr", "budget": b, "swap": True, "label": "torch-dtr + host copies 65%"}, steps=5)
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}", flush=True)
    return 0


def native_next(run: Any, save: Any, w_of: Any, size_of: Any, t_start: float, res: dict) -> int:
    """The compiled front end's open questions on a GPU, most needed first: its budget bounding the allocator's
    count (NOTE [ Native front end ] 8) at 50% of GPT-2 small's peak; the per-op targets at no budget on the
    bench's GPT-2, LSTM loop and ResNet-50, each with the interpreted and (where mypy is importable) the compiled
    core; the host tier on the LSTM loop at 50% (gradients summed in place, rule 9) and on GPT-2 small at 25% of
    its peak (or 1.25x the single-op floor), each against recomputing only; ResNet-50 at 50%; the largest GPT-2
    small batch under the cap with the tier."""
    from torch_dtr.core.compiled import CompiledCoreUnavailable, build

    res["command"] = res["command"] + " --plan native-next"
    if not _native_built(res, save):
        return 1
    t0 = time.perf_counter()
    try:
        build()
        cores: tuple[dict, ...] = ({}, {"core": "compiled"})
        res["compiled_core_build_s"] = time.perf_counter() - t0
    except (CompiledCoreUnavailable, OSError) as e:
        print(f"the compiled core cannot be built here ({e}): its contenders are skipped", flush=True)
        cores = ({},)

    def each_core(name: str, spec: dict, steps: int = 3) -> None:
        for c in cores:
            run(name, spec | c | {"label": spec["label"] + (", compiled core" if c else "")}, steps=steps)

    name = "gpt2-small"
    small = run(name, {"kind": "plain", "label": "plain PyTorch"})
    if small is not None and "error" not in small:
        each_core(name, {"kind": "native", "budget": small["max_allocated"] // 2, "label": "torch-dtr native 50%"})
    for n, steps in (("gpt2", 3), ("lstm", 3), ("resnet50", 5)):
        p = run(n, {"kind": "plain", "label": "plain PyTorch"}, steps=steps)
        if p is None or "error" in p:
            continue
        each_core(n, {"kind": "native", "budget": None, "label": "torch-dtr native, no budget"}, steps=steps)
        if n == "lstm":
            b = p["max_allocated"] // 2
            run(n, {"kind": "native", "budget": b, "swap": True, "label": "torch-dtr native + host copies 50%"})
            run(n, {"kind": "native", "budget": b, "label": "torch-dtr native 50%"})
        if n == "resnet50":
            run(n, {"kind": "native", "budget": p["max_allocated"] // 2, "label": "torch-dtr native 50%"}, steps=5)
    if small is not None and "error" not in small:
        peak = small["max_allocated"]
        b = max(int(1.25 * GPT2_SMALL_FLOOR), int(0.25 * peak))
        tag = f"{b / peak:.0%}" + ("" if b == int(0.25 * peak) else " (1.25x floor)")
        run(name, {"kind": "native", "budget": b, "swap": True, "label": f"torch-dtr native + host copies {tag}"})
        run(name, {"kind": "native", "budget": b, "label": f"torch-dtr native {tag}"})
    w = w_of(name)
    largest_batch(run, save, w, name, size_of(name), w["cap"], (4, 5, 6),
                  ({"kind": "native", "budget": int(w["cap"] * 0.8), "swap": True,
                    "label": "torch-dtr native + host copies, budget 80% of the cap"},))
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}", flush=True)
    return 0


def native_feasible(run: Any, save: Any, t_start: float, res: dict) -> int:
    """What ``native-next`` left: the LSTM loop and ResNet-50 at budgets above their floors (50% is below them on
    an H100: parameters, gradients and AdamW's state alone are 62% of ResNet-50's peak), the LSTM with the host
    tier and recomputing only; then the bench's GPT-2 at no budget with both cores again (run to run spread)."""
    from torch_dtr.core.compiled import CompiledCoreUnavailable, build

    res["command"] = res["command"] + " --plan native-feasible"
    if not _native_built(res, save):
        return 1
    p = run("lstm", {"kind": "plain", "label": "plain PyTorch"})
    if p is not None and "error" not in p:
        b = int(p["max_allocated"] * 0.65)
        run("lstm", {"kind": "native", "budget": b, "swap": True, "label": "torch-dtr native + host copies 65%"})
        run("lstm", {"kind": "native", "budget": b, "label": "torch-dtr native 65%"})
    p = run("resnet50", {"kind": "plain", "label": "plain PyTorch"}, steps=5)
    if p is not None and "error" not in p:
        run("resnet50", {"kind": "native", "budget": int(p["max_allocated"] * 0.75), "label": "torch-dtr native 75%"},
            steps=5)
    p = run("gpt2", {"kind": "plain", "label": "plain PyTorch"})
    if p is not None and "error" not in p:
        run("gpt2", {"kind": "native", "budget": None, "label": "torch-dtr native, no budget"})
        try:
            build()
        except (CompiledCoreUnavailable, OSError) as e:
            print(f"the compiled core cannot be built here ({e}): its contenders are skipped", flush=True)
        else:
            run("gpt2", {"kind": "native", "budget": None, "core": "compiled",
                         "label": "torch-dtr native, no budget, compiled core"})
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}", flush=True)
    return 0


def native_targets(run: Any, save: Any, out: Path, t_start: float, res: dict, models: Any = None) -> int:
    """The per-op targets again, after the Feed: per model plain, a do-nothing mode and the native front end at no
    budget with both cores; GPT-2 small at 50% and the LSTM loop at 65% (its overshoot on the allocator, NOTE
    [ Device memory ] 8) with the compiled core; ResNet-50 profiled last (its host time per op). The two builds run
    side by side."""
    import threading

    from torch_dtr.core.compiled import CompiledCoreUnavailable, build

    res["command"] = res["command"] + " --plan native-targets" + (f" --models {' '.join(models)}" if models else "")
    got: dict[str, Any] = {}

    def build_core() -> None:
        t0 = time.perf_counter()
        try:
            build()
            got["core_s"] = time.perf_counter() - t0
        except (CompiledCoreUnavailable, OSError) as e:
            got["error"] = str(e)

    th = threading.Thread(target=build_core)
    th.start()
    ok = _native_built(res, save)
    th.join()
    if "error" in got:
        print(f"the compiled core cannot be built here ({got['error']}): its contenders are skipped", flush=True)
    res["compiled_core_build_s"] = got.get("core_s")
    if not ok:
        return 1
    cores: tuple[dict, ...] = ({"core": "compiled"}, {}) if "core_s" in got else ({},)
    for name, steps in (("gpt2-small", 3), ("gpt2", 5), ("lstm", 3), ("resnet50", 5)):
        if models and name not in models:
            continue
        p = run(name, {"kind": "plain", "label": "plain PyTorch"}, steps=steps)
        if p is None or "error" in p:
            continue
        run(name, {"kind": "noop", "label": "a do-nothing dispatch mode"}, steps=steps)
        for c in cores:
            run(name, {"kind": "native", "budget": None, "label": "torch-dtr native, no budget"
                       + (", compiled core" if c else "")} | c, steps=steps)
        if name == "gpt2-small":
            run(name, {"kind": "native", "budget": p["max_allocated"] // 2, "label": "torch-dtr native 50%"
                       + (", compiled core" if cores[0] else "")} | cores[0], steps=steps)
        if name == "lstm":
            run(name, {"kind": "native", "budget": int(p["max_allocated"] * 0.65), "swap": True,
                       "label": "torch-dtr native + host copies 65%" + (", compiled core" if cores[0] else "")}
                | cores[0], steps=steps)
    if models and "resnet50" not in models:
        save()
        return 0
    run("resnet50", {"kind": "native", "budget": None, "profile": str(out / "profile-resnet50.txt"),
                     "label": "torch-dtr native, no budget (profiled: time inflated)"} | cores[0], steps=5)
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}", flush=True)
    return 0


def largest_batch(run: Any, save: Any, w: dict, name: str, base: workloads.Size, cap: int,
                  multiples: tuple[int, ...], specs: tuple[dict, ...]) -> None:
    """For each contender, the largest multiple of the base batch that trains one step under ``cap``."""
    for spec in specs:
        best = None
        for m in multiples:
            r = run(name, spec | {"cap": cap, "label": f"{spec['label']} x{m}"}, steps=1,
                    size=workloads.Size(**(base.__dict__ | {"batch": base.batch * m})))
            if r is None or "error" in r:
                break
            best = r
        w["scale"].append({"label": spec["label"], "batch": best["batch"] if best else 0,
                           "samples_s": best["batch"] / best["step_s"] if best else 0.0})
        save()


def followup(a: Any, run: Any, save: Any, out: Path, t_start: float, res: dict) -> int:
    """The per-op path on the device: plain, a do-nothing dispatch mode, torch-dtr with no budget (profiled:
    the 40 functions of most own time, to OUT/profile-NAME.txt), and what expandable segments change."""
    res["command"] = res["command"] + " --plan followup"
    for name in ("gpt2", "lstm", "gpt2-small"):
        p = run(name, {"kind": "plain", "label": "plain PyTorch"})
        if p is None or "error" in p:
            continue
        run(name, {"kind": "noop", "label": "a do-nothing dispatch mode"})
        if name != "gpt2-small":
            run(name, {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"})
        if name == "gpt2":  # the profiler's own cost inflates this run's time: read it for the shares
            run(name, {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget (profiled: time inflated)",
                       "profile": str(out / f"profile-{name}.txt")})
        if name == "gpt2-small":
            b = int(p["max_allocated"] * 0.5)
            run(name, {"kind": "dtr", "budget": b, "label": "torch-dtr 50%"})
            run(name, {"kind": "dtr", "budget": b, "expandable": False, "label": "torch-dtr 50%, expandable off"})
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}")
    return 0


# GPT-2 small's single-op floor on an H200 (torch 2.11): docs/gpu/h200-2026-11-26.json, "torch-dtr, no budget"
GPT2_SMALL_FLOOR = 4_049_416_704
GPT2_SMALL_CKPT_BLOCK = 4_241_284_608  # checkpoint every block's max_memory_allocated, the same run


def swap(a: Any, run: Any, save: Any, w_of: Any, size_of: Any, t_start: float, res: dict) -> int:
    """The host tier (NOTE [ Swapping ]) on GPT-2 small, most needed first: at 1.25x the single-op floor with and
    without it, save_on_cpu, at block checkpointing's memory and at 50%, then the largest batch under the cap."""
    res["command"] = res["command"] + " --plan swap"
    name = "gpt2-small"
    plain = run(name, {"kind": "plain", "label": "plain PyTorch"})
    if plain is None or "error" in plain:
        return 1
    peak = plain["max_allocated"]
    b37 = max(int(1.25 * GPT2_SMALL_FLOOR), int(0.25 * peak))
    tag = f"{b37 / peak:.0%} (1.25x floor)"
    run(name, {"kind": "dtr", "budget": b37, "swap": True, "label": f"torch-dtr + host copies {tag}"})
    run(name, {"kind": "dtr", "budget": b37, "label": f"torch-dtr {tag}"})
    run(name, {"kind": "save_on_cpu", "label": "save_on_cpu (every saved activation to host memory)"})
    run(name, {"kind": "dtr", "budget": GPT2_SMALL_CKPT_BLOCK, "swap": True,
               "label": "torch-dtr + host copies at block checkpointing's memory"})
    run(name, {"kind": "dtr", "budget": peak // 2, "swap": True, "label": "torch-dtr + host copies 50%"})
    run(name, {"kind": "dtr", "budget": peak // 2, "label": "torch-dtr 50%"})
    w = w_of(name)
    cap = w["cap"]
    largest_batch(run, save, w, name, size_of(name), cap, (4, 5, 6),
                  ({"kind": "dtr", "budget": int(cap * 0.8), "swap": True,
                    "label": "torch-dtr + host copies, budget 80% of the cap"},
                   {"kind": "dtr", "budget": int(cap * 0.8), "label": "torch-dtr, budget 80% of the cap"}))
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}")
    return 0


def swap_lstm(run: Any, save: Any, t_start: float, res: dict, ratios: list[float], side_too: bool = False) -> int:
    """The host tier on the bench's LSTM loop (long recomputation chains of small ops): recomputing only and
    with copies, at 50% and 30% of plain's peak (or 1.25x the single-op floor)."""
    res["command"] = res["command"] + " --plan swap-lstm --ratios " + " ".join(map(str, ratios))
    name = "lstm"
    plain = run(name, {"kind": "plain", "label": "plain PyTorch"})
    if plain is None or "error" in plain:
        return 1
    free = run(name, {"kind": "dtr", "budget": None, "label": "torch-dtr, no budget"}) or {}
    peak, floor = plain["max_allocated"], free.get("floor", 0)
    for ratio in ratios:
        b = max(int(ratio * peak), int(1.25 * floor))
        tag = f"{b / peak:.0%}" + ("" if b == int(ratio * peak) else " (1.25x floor)")
        run(name, {"kind": "dtr", "budget": b, "swap": True, "label": f"torch-dtr + host copies {tag}"})
        if side_too:
            run(name, {"kind": "dtr", "budget": b, "swap": True, "swap_side": False,
                       "label": f"torch-dtr + host copies on the compute stream {tag}"})
        else:
            run(name, {"kind": "dtr", "budget": b, "label": f"torch-dtr {tag}"})
    save()
    print(f"done in {time.perf_counter() - t_start:.0f} s; skipped: {res['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
