"""torch.compile (inductor) under a byte budget (issue 53): compile's own ``activation_memory_budget`` against
torch-dtr's byte budgets (NOTE [ Compiled regions under a budget ]), side by side on the bench's GPT-2, ResNet-50,
an MLP and the bench's GPT-2 at batch 16 (where activations fill most of the memory), on the CPU. Each run is a
process of its own: build, compile, train warm-up steps (torch-dtr's plan settles in them), then time the measured
steps. Memory is the CPU allocator's most in use during the measured steps (the compiled front end's count, which
sees the compiled kernels' blocks; installed for compile's own runs too) plus the parameters and GPT-2's token
batches, made before it (the MLP's batches are made in their steps). Budgets are shares of compiled plain's
(fraction 1.0) peak measured in the same invocation. Writes docs/compiled.md, docs/compiled.json and
docs/img/compiled.png.

    python benchmarks/compiled.py            # 30-40 minutes on 2 cores; run nothing else meanwhile
    python benchmarks/compiled.py --workloads gpt2-b16   # one workload (the others keep their saved rows)
    python benchmarks/compiled.py --quick    # small sizes, about 4 minutes
    python benchmarks/compiled.py --replot   # the doc and plot again from docs/compiled.json
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
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
JSON = ROOT / "docs" / "compiled.json"
FRACTIONS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)  # compile's activation_memory_budget
RATIOS = (0.95, 0.85, 0.75, 0.6, 0.45, 0.3)  # torch-dtr's byte budgets, shares of compiled plain's peak
WARMUP, STEPS = 4, 3
TIMEOUT = 900  # seconds per run (a thrashing one stops)
WORKLOADS = ("mlp", "gpt2", "resnet50", "gpt2-b16")
BIG_BATCH = 16  # gpt2-b16: the bench's GPT-2 at 4x its batch, where activations, not the model's state, fill memory
ABOUT = {"gpt2-b16": f"The bench's GPT-2 at batch {BIG_BATCH} (4x the bench's), where activations rather than the "
                     "model's state fill most of the memory."}


def _workload(name: str, quick: bool) -> tuple[torch.nn.Module, list[Any], Any]:
    import dataclasses

    from torch_dtr.bench.workloads import SIZES, Size, build

    if name in ("gpt2", "resnet50"):
        return build(name, SIZES[name]["quick" if quick else "full"], WARMUP + STEPS)
    if name == "gpt2-b16":
        size = SIZES["gpt2"]["quick" if quick else "full"]
        batch = 2 * size.batch if quick else BIG_BATCH
        return build("gpt2", dataclasses.replace(size, batch=batch), WARMUP + STEPS)
    width, rows = (256, 1024) if quick else (512, 4096)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                                      torch.nn.LayerNorm(width)) for _ in range(8)])
    batches = list(range(WARMUP + STEPS))  # each made in its step (counted by the allocator, as on a GPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    del Size

    def step(m: torch.nn.Module, i: int) -> torch.Tensor:
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(i))
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return model, batches, step


def one(spec: dict[str, Any]) -> dict[str, Any]:
    """One run (in this process): ``kind`` "compile" at ``fraction``, or "dtr" at ``budget`` bytes."""
    import torch._functorch.config as functorch_config

    import torch_dtr
    from torch_dtr import native

    torch.set_num_threads(2)
    model, batches, step = _workload(spec["workload"], spec["quick"])
    before = sum(p.untyped_storage().nbytes() for p in [*model.parameters(), *model.buffers()])
    before += sum(t.untyped_storage().nbytes() for b in batches for t in (b if isinstance(b, tuple) else (b,))
                  if isinstance(t, torch.Tensor))
    ext = native.load()
    if spec["kind"] == "compile":
        functorch_config.activation_memory_budget = spec["fraction"]
        ext.cpu_blocks(True)
    else:
        torch_dtr.enable(budget=spec["budget"])
    run = torch.compile(model)
    times, losses = [], []
    t0 = time.perf_counter()
    try:
        for i, b in enumerate(batches):
            if i == WARMUP:
                ext.cpu_blocks_reset_peak()
            t = time.perf_counter()
            losses.append(float(step(run, b)))
            times.append(time.perf_counter() - t)
            print(f"  step {i}: {times[-1]:.2f} s", file=sys.stderr, flush=True)
        peak = int(ext.cpu_blocks_usage()[1]) + before
        params = sum(p.untyped_storage().nbytes() for p in model.parameters())
        out: dict[str, Any] = {"peak": peak, "state": 4 * params, "step_s": statistics.median(times[WARMUP:]),
                               "losses": losses, "warmup_s": sum(times[:WARMUP]), "total_s": time.perf_counter() - t0}
        if spec["kind"] == "dtr":
            from torch_dtr.inductor import plans

            out["plans"] = [{k: v for k, v in p.items() if k != "tried"} for p in plans()]
            out["eager"] = any(p["fits"] is False for p in plans())
    finally:
        if spec["kind"] == "dtr":
            torch_dtr.disable()
        else:
            ext.cpu_blocks(False)
    return out


def _spawn(spec: dict[str, Any]) -> dict[str, Any]:
    label = f"{spec['workload']} {spec['kind']} " + (f"{spec['fraction']}" if spec["kind"] == "compile"
                                                     else f"{spec['ratio']:.0%} of compiled plain's peak")
    print(f"{label} ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                           timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"  stopped after {TIMEOUT} s", file=sys.stderr, flush=True)
        return spec | {"error": f"stopped after {TIMEOUT} s ({WARMUP + STEPS} steps)"}
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  failed: {tail}", file=sys.stderr, flush=True)
        return spec | {"error": tail[:1000]}
    res = spec | json.loads(p.stdout.strip().splitlines()[-1])
    print(f"  peak {res['peak'] / 2**20:.1f} MiB, {res['step_s']:.3f} s/step ({time.perf_counter() - t:.0f} s)",
          file=sys.stderr, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (about 4 minutes)")
    ap.add_argument("--replot", action="store_true", help="the doc and plot from docs/compiled.json, no runs")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all; others keep their saved rows)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.replot:
        saved = json.loads(JSON.read_text())
        write(saved["results"], saved["quick"], _runs(saved))
        return
    t0 = time.perf_counter()
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    results: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, dict[str, Any]] = {}  # workload -> when it ran and how long that invocation took
    if set(names) != set(WORKLOADS) and JSON.exists():  # the others keep their saved rows
        saved = json.loads(JSON.read_text())
        if saved["quick"] == args.quick:
            results = {k: v for k, v in saved["results"].items() if k not in names}
            runs = {k: v for k, v in _runs(saved).items() if k in results}
    for name in names:
        base = {"workload": name, "quick": args.quick}
        rows = [_spawn(base | {"kind": "compile", "fraction": f}) for f in FRACTIONS]
        plain = rows[0]
        if "error" not in plain:
            rows += [_spawn(base | {"kind": "dtr", "ratio": r, "budget": int(r * plain["peak"])}) for r in RATIOS]
        results[name] = rows
    results = {k: results[k] for k in WORKLOADS if k in results}
    now = {"date": datetime.date.today().isoformat(), "seconds": time.perf_counter() - t0}
    write(results, args.quick, {k: runs.get(k, now) for k in results})


def _runs(saved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """When each saved workload ran (files written before ``runs`` was kept: all at the file's date)."""
    return saved.get("runs") or {k: {"date": saved["date"], "seconds": saved["seconds"]} for k in saved["results"]}


def write(results: dict[str, list[dict[str, Any]]], quick: bool, runs: dict[str, dict[str, Any]]) -> None:
    JSON.write_text(json.dumps({"quick": quick, "runs": runs, "results": results}, indent=1))
    groups: dict[tuple[str, float], list[str]] = {}
    for k, r in runs.items():
        groups.setdefault((r["date"], r["seconds"]), []).append(k)
    when = "; ".join(f"{', '.join(ks)} on {d} ({sec / 60:.0f} min)" for (d, sec), ks in groups.items())
    lines = [
        "# torch.compile under a byte budget (CPU)", "",
        f"Generated by `python benchmarks/compiled.py{' --quick' if quick else ''}`: {when} ({platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}). "
        f"Each row is a process of its own: {WARMUP} warm-up steps (compiling, "
        f"and torch-dtr's plan settling), then the median of {STEPS} steps. **Peak**: the CPU allocator's most "
        "in use in the measured steps (the compiled front end's count, which sees the compiled kernels' blocks), "
        "plus the parameters and GPT-2's token batches, made before it; shares are of compiled plain's (fraction 1.0). "
        "torch-dtr's rows run under `torch_dtr.enable(budget=share x that peak)` (NOTE [ Compiled regions under "
        "a budget ]); **plan**: the activation memory budget torch-dtr chose for the region, and how many times "
        "it was compiled; *eager* where no partition fitted and the region ran op by op under the runtime. "
        "Parameters, AdamW's state, the gradients and the optimizer's temporaries are outside any region: where "
        "they and the smallest working set pass a budget, nothing can keep it, and torch-dtr's run ends in a "
        "BudgetError naming the floor (failed rows; red crosses in the plot).", ""]
    for name, rows in results.items():
        plain = next((r for r in rows if r.get("kind") == "compile" and r.get("fraction") == 1.0), None)
        if plain is None or "error" in plain:
            lines += [f"## {name}", "", "compiled plain failed: " + (plain or {}).get("error", "not run"), ""]
            continue
        lines += [f"## {name}", ""]
        if name in ABOUT:
            lines += [ABOUT[name], ""]
        if "state" in plain:
            lines += [f"Parameters, their gradients and AdamW's two moments: {plain['state'] / 2**20:.1f} MiB, "
                      f"{plain['state'] / plain['peak']:.0%} of compiled plain's peak. They all live at the end of "
                      "a backward, so no budget below that can be kept by any method that keeps them in memory "
                      "(on the CPU there is no slower memory to move them to).", ""]
        lines += ["| run | budget | peak | peak / budget | step time (x plain) | plan |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            if r["kind"] == "compile":
                run, budget, ratio, plan = f"compile, activation_memory_budget {r['fraction']}", "", "", ""
            else:
                run, budget = f"torch-dtr, {r['ratio']:.0%} of plain's peak", f"{r['budget'] / 2**20:.1f} MiB"
                ratio = f"{r['peak'] / r['budget']:.2f}" if "peak" in r else ""
                ps = r.get("plans") or [{}]
                plan = "; ".join(("eager" if p.get("fits") is False else f"{p.get('fraction')}")
                                 + f" ({p.get('compiles')} compiles)" for p in ps)
            if "error" in r:
                lines.append(f"| {run} | {budget} | failed: {r['error'][:80]} | | | |")
                continue
            lines.append(f"| {run} | {budget} | {r['peak'] / 2**20:.1f} MiB ({r['peak'] / plain['peak']:.2f}) "
                         f"| {ratio} | {r['step_s']:.3f} s ({r['step_s'] / plain['step_s']:.2f}x) | {plan} |")
        lines.append("")
    lines += ["![peak against step time](img/compiled.png)", ""]
    (ROOT / "docs" / "compiled.md").write_text("\n".join(lines))
    _plot(results, ROOT / "docs" / "img" / "compiled.png")


def _plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(results))
    nrows = -(-len(results) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7 * cols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, (name, rows) in zip(axes.flat, results.items(), strict=False):
        plain = next((r for r in rows if r.get("kind") == "compile" and r.get("fraction") == 1.0), None)
        if plain is None or "error" in plain:
            continue
        for kind, mark, color, label in (("compile", "D", "C4", "compile's activation_memory_budget"),
                                         ("dtr", "o", "C0", "torch-dtr byte budget")):
            pts = [r for r in rows if r["kind"] == kind and "peak" in r]
            xs = [r["peak"] / plain["peak"] for r in pts]
            ys = [r["step_s"] / plain["step_s"] for r in pts]
            ax.plot(xs, ys, mark, color=color, label=label)
            for r, x, y in zip(pts, xs, ys, strict=True):
                tag = f"{r['fraction']}" if kind == "compile" else f"{r['ratio']:.0%}" + (" eager" if r.get("eager")
                                                                                          else "")
                ax.annotate(tag, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
        for r in rows:
            if r["kind"] == "dtr":
                ax.axvline(r["budget"] / plain["peak"], color="C0", lw=0.4, ls=":")
        if "state" in plain:  # below it no method that keeps them in memory keeps a budget
            ax.axvline(plain["state"] / plain["peak"], color="C3", lw=1, ls="--",
                       label="parameters, gradients and AdamW's moments")
        failed = [r for r in rows if "error" in r and r["kind"] == "dtr"]
        if failed:  # drawn at their budget, on the top edge
            top = ax.get_ylim()[1]
            ax.plot([r["budget"] / plain["peak"] for r in failed], [top] * len(failed), "x", color="C3",
                    clip_on=False, label="torch-dtr failed (BudgetError: below what it can keep)")
        ax.set_xlabel("peak / compiled plain's peak (dotted: torch-dtr's budgets)")
        ax.set_ylabel("step time / compiled plain's")
        ax.set_title(f"{name}: torch.compile under a memory budget (CPU)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
