"""Writes ``benchmarks.md`` (tables) and PNG plots from the results of ``bench.run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MiB = 2**20
LINES = {"plain": 0, "dtr": 2, "ckpt_block": 12, "ckpt_sqrt": 12, "compile": 3}
TARGETS = {1.0: 1.05, 0.5: 1.15, 0.3: 1.35}
KEEP = "<!-- kept by torch-dtr bench: written by hand from here -->"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MiB:,.1f}"


def write(results: dict[str, Any], out: Path) -> Path:
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        f"Measured {results['date']} on {results['machine']}{' (quick run: tiny sizes)' if results['quick'] else ''}.",
        f"Command: `{results['command']}` ({results.get('wall_s', 0) / 60:.0f} min).",
        "",
        "Every contender ran in its own process, interleaved with the others in rounds; step time is the",
        "median of the measured steps (after one warm-up step) over all rounds, and *vs plain* divides it by",
        "plain PyTorch's median from the same run. *Tracked* is live tensor bytes in the runtime's accounting",
        "(for plain PyTorch and checkpointing: one extra step under torch-dtr without a budget, which keeps",
        "exactly what the program keeps). *RSS* is the process's peak resident set (Python and libraries",
        "included); *RSS over base* subtracts what the process held after building the model and data. RSS",
        "comes from one more short run per contender with glibc's mmap threshold fixed at 64 KiB, so that",
        "freed tensors go back to the OS and RSS follows live tensors; step times come from runs with the",
        "default allocator, as users run (the fixed threshold slows every large allocation; docs/decisions.md",
        "says by how much when it was measured).",
        "Budget ratios are fractions of plain PyTorch's tracked peak.",
        "",
    ]
    lines += _targets(results)
    for name, w in results["workloads"].items():
        lines += _workload(name, w, img, out)
    path = out / "benchmarks.md"
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(KEEP):] if KEEP in old else ""  # notes written by hand on the figures stay
    path.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    return path


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "missed")


def _targets(results: dict[str, Any]) -> list[str]:
    """One row per target of the benchmark issue and workload: the target, what this run measured, met or not."""
    rows = []
    for name, w in results["workloads"].items():
        if "error" in w:
            rows.append(f"| {name} | all | - | failed: {w['error'][:80]} | missed |")
            continue
        cs = w["contenders"]
        p_step = cs.get("plain PyTorch", {}).get("step_s")
        for ratio, target in TARGETS.items():
            r = cs.get(f"torch-dtr {ratio:.0%}", {})
            if r.get("step_s") and p_step:
                got = r["step_s"] / p_step
                rows.append(f"| {name} | step-time ratio at {ratio:.0%} of peak | <= {target:.2f} | {got:.2f}x | "
                            f"{_verdict(got <= target)} |")
            else:
                why = "; ".join(r.get("errors", []))[:70] or "not run"
                rows.append(f"| {name} | step-time ratio at {ratio:.0%} of peak | <= {target:.2f} | "
                            f"does not train: {why} | missed |")
        mr = w["search"].get("min_ratio")
        rows.append(f"| {name} | smallest feasible budget | <= 25% | {mr:.1%} | {_verdict(mr <= 0.25)} |")
        floor = w["search"].get("single_op_floor")
        if floor:  # issue 13
            x = w["search"]["min_budget"] / floor
            rows.append(f"| {name} | smallest feasible budget / single-op floor (issue 13) | <= 1.25x | {x:.2f}x | "
                        f"{_verdict(x <= 1.25)} |")
        if name == "lstm" and p_step:  # issue 13: the LSTM loop trains at 50% of its peak at <= 1.5x plain
            r = cs.get("torch-dtr 50%", {})
            got = r["step_s"] / p_step if r.get("step_s") else None
            rows.append(f"| {name} | step-time ratio at 50% of peak (issue 13) | <= 1.50 | "
                        f"{f'{got:.2f}x' if got else 'does not train'} | {_verdict(got is not None and got <= 1.5)} |")
        tries = [t for t in w.get("scale", {}).get("tries", []) if t["ok"]]
        if "scale" in w:
            s = w["scale"]
            best = max(tries, key=lambda t: t["mult"]) if tries else None
            at3 = [t for t in tries if t["mult"] >= 3]
            thr = max((t["throughput"] / s["plain_throughput"] for t in at3), default=None)
            got = (f"{best['mult']}x batch trains; at >= 3x: " + (f"{thr:.2f}x plain's samples/s" if thr else "-")
                   if best else "not even 2x")
            rows.append(f"| {name} | batch at plain's peak memory | >= 3x at >= 0.85x samples/s | {got} | "
                        f"{_verdict(thr is not None and thr >= 0.85)} |")
        rows += _against_alternatives(name, cs)
    return ["## Targets (benchmark issue, issue 13) and what this run measured", "",
            "| workload | target | wanted | measured | |", "| --- | --- | --- | --- | --- |", *rows, "",
            "Against an alternative: the fastest torch-dtr contender whose peak is at or below the alternative's "
            "(tracked bytes for checkpointing; RSS over base for torch.compile, whose tensors the runtime cannot "
            "see) must be at least as fast.", ""]


def _against_alternatives(name: str, cs: dict) -> list[str]:
    rows = []
    dtr = [r for r in cs.values() if r.get("kind") == "dtr" and r.get("step_s")]
    for label, alt in cs.items():
        if alt.get("kind") not in ("ckpt_block", "ckpt_sqrt", "compile") or not alt.get("step_s"):
            continue
        key = "rss_over_base" if alt["kind"] == "compile" else "peak_tracked"
        if not alt.get(key):
            continue
        fits = [r for r in dtr if r.get(key) and r[key] <= alt[key]]
        if not fits:
            rows.append(f"| {name} | vs {label} | <= its memory and time | no torch-dtr contender at or below its "
                        f"{_mib(alt[key])} MiB | missed |")
            continue
        best = min(fits, key=lambda r: r["step_s"])
        rows.append(f"| {name} | vs {label} | <= its memory and time | torch-dtr {_mib(best[key])} MiB in "
                    f"{best['step_s']:.2f} s vs {_mib(alt[key])} MiB in {alt['step_s']:.2f} s | "
                    f"{_verdict(best['step_s'] <= alt['step_s'])} |")
    return rows


def _workload(name: str, w: dict, img: Path, out: Path) -> list[str]:
    lines = [f"## {name}: {w['description']}", ""]
    if "error" in w:
        return lines + [f"Failed: {w['error']}", ""]
    cs = w["contenders"]
    plain = cs.get("plain PyTorch", {})
    p_step = plain.get("step_s")
    search = w["search"]
    lines += [f"Plain PyTorch's tracked peak: {_mib(search['peak_tracked'])} MiB, {search['ops']} managed ops per "
              f"step. Smallest feasible budget found by bisection: {search['min_ratio']:.1%} of it "
              f"({search['probes']} probes; a budget trains if one step completes without BudgetError and with "
              f"at most 3 recomputations per op).", ""]
    if search.get("single_op_floor"):
        f = search["single_op_floor"]
        lines += [f"Single-op floor (constants and pinned storages plus the largest op's inputs and outputs; no "
                  f"schedule runs below it): {_mib(f)} MiB, {f / search['peak_tracked']:.1%} of the peak; the "
                  f"smallest feasible budget is {search['min_budget'] / f:.2f}x of it (target: <= 1.25x).", ""]
    if search.get("floor"):
        lines += [f"What sets that floor: at {_mib(search['floor_budget'])} MiB a step failed with "
                  f"`{search['floor'][:600]}`", ""]
    lines += ["| contender | budget | step (s) | vs plain | tracked peak (MiB) | budget held | RSS (MiB) | "
              "RSS over base (MiB) | evictions / step | recomputations / step | remat (s / step) | search (s / step) | "
              "user code lines | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in cs.items():
        lines.append(_row(label, r, p_step))
    full = cs.get("torch-dtr 100%", {})
    if full.get("step_s") and p_step and full.get("ops_per_step"):
        n = full["ops_per_step"]
        lines += ["", f"Overhead with (almost) nothing evicted, from the step times of separate processes at 100%: "
                      f"{(full['step_s'] - p_step) / n * 1e6:.1f} us per op ({n:.0f} managed ops per step); "
                      f"the in-process measurement of the per-op path is in [dispatch.md](dispatch.md)."]
    if "scale" in w and "tries" in w["scale"]:
        s = w["scale"]
        lines += ["", f"Batch scaling: budget = plain PyTorch's tracked peak at batch {s['base_batch']} "
                      f"({_mib(s['budget'])} MiB); plain throughput {s['plain_throughput']:.2f} samples/s.", "",
                  "| batch | trains | step (s) | samples/s | vs plain samples/s | tracked peak (MiB) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for t in s["tries"]:
            b = s["base_batch"] * t["mult"]
            if t["ok"]:
                lines.append(f"| {b} ({t['mult']}x) | yes | {t['step_s']:.2f} | {t['throughput']:.2f} | "
                             f"{t['throughput'] / s['plain_throughput']:.2f}x | {_mib(t['peak_tracked'])} |")
            else:
                lines.append(f"| {b} ({t['mult']}x) | no: {t['error'][:80]} | - | - | - | - |")
    lines.append("")
    for kind, fn in (("timeline", _plot_timeline), ("frontier", _plot_frontier)):
        p = img / f"bench_{name}_{kind}.png"
        try:
            fn(name, w, p)
            lines.append(f"![{name} {kind}]({p.relative_to(out)})")
        except Exception as e:  # a plot must not lose the tables
            lines.append(f"({kind} plot failed: {type(e).__name__}: {e})")
    return lines + [""]


def _held(r: dict) -> str:
    """Whether a run with a byte budget kept it (its tracked peak), or by how much it passed it."""
    budget, peak = r.get("budget"), r.get("peak_tracked")
    if not budget or peak is None:
        return "-"
    return "yes" if peak <= budget else f"no: +{(peak - budget) / MiB:,.1f} MiB"


def _row(label: str, r: dict, p_step: float | None) -> str:
    spec = r.get("spec", {})
    step = r.get("step_s")
    if "ratio" in spec:
        budget = f"{spec['ratio']:.0%}"
    elif "mem_budget" in spec:
        budget = f"activations {spec['mem_budget']}"
    else:
        budget = "-"
    spread = r.get("step_spread")
    step_txt = f"{step:.3f} ({spread[0]:.2f}-{spread[1]:.2f})" if step and spread else "-"
    ratio = f"{step / p_step:.2f}x" if step and p_step else "-"
    dtr = "remat_s" in r
    note = "; ".join(r.get("errors", []))[:160]
    if dtr:  # per step of the run (warm-up included); a run that stopped: its totals until it stopped
        n = r["ops"] / r["ops_per_step"] if step and r.get("ops_per_step") else 1
        counters = (f"{r['evictions'] / n:.0f} | {r['remats'] / n:.0f} | {r['remat_s'] / n:.2f} | "
                    f"{r['search_s'] / n:.3f}")
        if not step:
            note = "counters: totals until it stopped; " + note
    else:
        counters = "- | - | - | -"
    if r.get("compile_s"):
        note = (note + "; " if note else "") + f"first step incl. compile {r['compile_s']:.0f} s"
    lines_of_code = LINES.get(spec.get("kind", r.get("kind", "")), "-")
    return (f"| {label} | {budget} | {step_txt} | {ratio} | {_mib(r.get('peak_tracked'))} | {_held(r)} | "
            f"{_mib(r.get('peak_rss'))} | {_mib(r.get('rss_over_base'))} | {counters} | {lines_of_code} | {note} |")


def _plot_timeline(name: str, w: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = w["timeline"]
    if "unbounded" not in tl:
        raise RuntimeError(tl.get("error", "no timeline"))
    fig, ax = plt.subplots(figsize=(9, 4))
    none, bud = tl["unbounded"], tl.get("bounded", {})
    if "trace" not in bud:
        raise RuntimeError(tl.get("error", "no bounded run"))
    ax.plot([b / MiB for b in none["trace"]], color="0.5", lw=1, label="plain PyTorch's live bytes (no budget)")
    ratio = tl.get("ratio") or 0.5
    ax.plot([b / MiB for b in bud["trace"]], color="C0", lw=1, label=f"torch-dtr at {ratio:.0%} of the peak")
    if bud.get("backward_at") is not None:
        ax.axvspan(bud["backward_at"], len(bud["trace"]), color="C1", alpha=0.08, label="backward (torch-dtr)")
    budget = tl.get("budget")
    if budget:
        ax.axhline(budget / MiB, color="C3", ls="--", lw=1, label="budget")
    ys = [bud["trace"][i - 1] / MiB for i in bud["evict_at"] if 0 < i <= len(bud["trace"])]
    ax.scatter([i for i in bud["evict_at"] if 0 < i <= len(bud["trace"])], ys, s=4, color="C3", label="evictions")
    ys = [bud["trace"][i - 1] / MiB for i in bud["remat_at"] if 0 < i <= len(bud["trace"])]
    ax.scatter([i for i in bud["remat_at"] if 0 < i <= len(bud["trace"])], ys, s=4, color="C2",
               label="recomputations")
    ax.set_xlabel("op index in one training step")
    ax.set_ylabel("tracked bytes (MiB)")
    ax.set_title(f"{name}: memory during one training step")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_frontier(name: str, w: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = w["contenders"]
    p_step = cs.get("plain PyTorch", {}).get("step_s")
    if not p_step:
        raise RuntimeError("no plain PyTorch timing")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    style = {"plain": ("s", "k"), "ckpt_block": ("^", "C1"), "ckpt_sqrt": ("v", "C2"), "compile": ("D", "C4")}
    for ax, key, xlabel in ((axes[0], "peak_tracked", "peak tracked bytes (MiB)"),
                            (axes[1], "rss_over_base", "peak RSS over the process's base (MiB)")):
        dtr = sorted((r[key] / MiB, r["step_s"] / p_step) for r in cs.values()
                     if r.get("kind") == "dtr" and r.get("step_s") and r.get(key))
        if dtr:
            ax.plot(*zip(*dtr, strict=True), "o-", color="C0", label="torch-dtr (budgets)")
        for label, r in cs.items():
            k = r.get("kind")
            if k in style and r.get("step_s") and r.get(key):
                m, c = style[k]
                ax.plot(r[key] / MiB, r["step_s"] / p_step, m, color=c, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step time / plain PyTorch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: time vs memory (lower left is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------ the README's CPU table (issue 55)
README_BEGIN = "<!-- the CPU table: python -m torch_dtr.bench.report --readme -->"
_README_COLUMNS = {"gpt2": "GPT-2 {layers}x{width}", "resnet50": "ResNet-{layers}", "lstm": "LSTM loop"}


def readme_table(results: dict[str, Any]) -> str:
    """The README's CPU table, computed from a ``torch-dtr bench`` record (docs/benchmarks.json): step time against
    plain PyTorch's at no budget, 50% and 30% of plain's peak, and the smallest budget that trains."""
    ws = {n: w for n, w in results["workloads"].items() if n in _README_COLUMNS and "contenders" in w}
    head = "| budget (of plain's peak) | " + " | ".join(_README_COLUMNS[n].format(**w["size"]) for n, w in ws.items())
    rows = [head + " |", "| --- |" + " --- |" * len(ws)]
    for label, key in (("100% (a few evictions)", "torch-dtr 100%"), ("50%", "torch-dtr 50%"),
                       ("30%", "torch-dtr 30%")):
        cells = []
        for w in ws.values():
            cs = w["contenders"]
            step, plain = cs.get(key, {}).get("step_s"), cs["plain PyTorch"]["step_s"]
            ratio = float(key.split()[-1].rstrip("%")) / 100
            cells.append(f"{step / plain:.2f}x" if step and plain else
                         "does not train" if w["search"]["min_ratio"] > ratio else "failed")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    rows.append("| smallest that trains | " + " | ".join(f"{w['search']['min_ratio']:.1%}" for w in ws.values()) + " |")
    return "\n".join(rows)


def readme_with_table(readme: str, results: dict[str, Any]) -> str:
    """``readme`` with the table after ``README_BEGIN`` replaced by ``readme_table(results)``."""
    if README_BEGIN not in readme:
        raise ValueError(f"the README has no line {README_BEGIN!r} to put the CPU table after")
    head, rest = readme.split(README_BEGIN, 1)
    lines = rest.lstrip("\n").split("\n")
    n = 0
    while n < len(lines) and lines[n].startswith("|"):
        n += 1
    return head + README_BEGIN + "\n" + readme_table(results) + "\n" + "\n".join(lines[n:])


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_dtr.bench.report [docs/benchmarks.json]``: re-render benchmarks.md from a run's record;
    ``--readme [README.md] [docs/benchmarks.json]``: regenerate the README's CPU table from it and its GPU figures
    from the records beside it (docs/gpu/*.json: ``gpu_figures``)."""
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--readme"]:
        from .gpu_figures import with_paragraph

        path = Path(args[1] if len(args) > 1 else "README.md")
        record = Path(args[2] if len(args) > 2 else "docs/benchmarks.json")
        gpu = record.parent / "gpu"
        path.write_text(with_paragraph(readme_with_table(path.read_text(), json.loads(record.read_text())), gpu))
        print(f"{path}: the CPU table regenerated from {record}, the GPU figures from {gpu}/*.json")
        return 0
    src = Path(args[0] if args else "docs/benchmarks.json")
    print(write(json.loads(src.read_text()), src.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
