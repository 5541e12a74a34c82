"""The host tier live on the CPU: the bench's LSTM loop (and GPT-2) with and without it: writes docs/swap-live.md.

    python benchmarks/swap_live.py [--model lstm] [--ratios 0.5 0.3] [--rounds 3] [--quick]

Each contender runs in a process of its own (``torch-dtr bench``'s worker), interleaved over rounds, the
median step of each round's steps after one warm-up, then the median over rounds: plain PyTorch, torch-dtr
recomputing only, and torch-dtr with the host tier (``enable(swap=True)``: copies at the CPU's modelled
2.5 GB/s, NOTE [ Host copies ]) at each ratio of plain's tracked peak, each with the Python front end and the
compiled one (``torch_dtr.native``: the same rules, but autograd sums gradients in place there, NOTE [ Native
front end ] 9); bitwise: losses and final parameters equal to plain's (losses only in records before parameters'
digests were kept). On
these machines a copy saves no RAM (host and device are one memory): the figures say what choosing copies
over recomputation costs in time, which is what the GPU's tier decides the same way. About 7 minutes (the
command of docs/swap-live.md, 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from torch_dtr import native
from torch_dtr.bench import workloads
from torch_dtr.bench.run import spawn

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["lstm"], choices=("lstm", "gpt2", "resnet50"))
    ap.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.3])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the bench's quick sizes, one round")
    ap.add_argument("--fronts", nargs="+", default=["python", "native"], choices=("python", "native"),
                    help="the front ends (native: the compiled one, where it builds)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "swap-live.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the saved JSON")
    a = ap.parse_args()
    rounds = 1 if a.quick else a.rounds
    if a.report_only:  # the command and date the report recorded, the figures from its JSON
        results = json.loads(Path(a.out).with_suffix(".json").read_text())
        m = re.search(r"Written by `python benchmarks/swap_live.py ([^`]*)` on (\d{4}-\d\d-\d\d)",
                      Path(a.out).read_text())
        args, date = (m.group(1), m.group(2)) if m else (" ".join(x for x in sys.argv[1:] if x != "--report-only"),
                                                         None)
        if m and "--rounds" in args.split():
            rounds = int(args.split()[args.split().index("--rounds") + 1])
        Path(a.out).write_text(_report(results, rounds, args, date))
        return 0
    if "native" in a.fronts and not native.available():
        print("the compiled front end does not build here: its contenders are left out", file=sys.stderr)
        a.fronts = [f for f in a.fronts if f != "native"]
    results: dict = {}
    for name in a.model:
        size = workloads.SIZES[name]["quick" if a.quick else "full"]
        common = {"workload": name, "size": size.__dict__, "warmup": 1, "steps": 2, "threads": 0}
        plain0 = spawn(common | {"kind": "plain", "label": "plain"}, 1800)
        peak = plain0["peak_tracked"]
        cs = [{"kind": "plain", "label": "plain PyTorch"}]
        for r in a.ratios:
            for front in a.fronts:
                for swap in (False, True):
                    cs.append({"kind": "dtr", "budget": int(r * peak), "ratio": r, "swap": swap, "front": front,
                               "max_remats": 3 * plain0["ops"],
                               "label": f"torch-dtr {r:.0%}" + (" + host copies" if swap else "")
                                        + (", native" if front == "native" else "")})
        runs: dict[str, list[dict]] = {c["label"]: [] for c in cs}
        for _ in tqdm(range(rounds), desc=name, file=sys.stderr):
            for c in cs:
                runs[c["label"]].append(spawn(common | c, 1800))
        results[name] = {"size": size.__dict__, "peak": peak, "runs": runs}
    Path(a.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    Path(a.out).write_text(_report(results, rounds, " ".join(sys.argv[1:])))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


def _report(results: dict, rounds: int, args: str, date: str | None = None) -> str:
    lines = ["# The host tier live on the CPU", "",
             f"Written by `python benchmarks/swap_live.py {args}` on {date or datetime.date.today()}, "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {rounds} round(s) of each "
             "contender in its own process, interleaved; step: median over rounds of the median step after one "
             "warm-up. On a CPU the copies are in the same memory: this measures what copying instead of "
             "recomputing costs in time, not memory saved. Host tier peak: the most bytes of copies held at once "
             "(of the first round). Peak RSS: the process's largest resident set over the rounds (`ru_maxrss`). "
             "Budget held: the tracked peak of every round within the budget (else by how much it passed it).", ""]
    for name, w in results.items():
        runs = w["runs"]
        plain = statistics.median(r["step_s"] for r in runs["plain PyTorch"] if "step_s" in r)
        want, want_digest = runs["plain PyTorch"][0]["losses"], runs["plain PyTorch"][0].get("digest")
        what = "losses and parameters" if want_digest else "losses only (no parameter digest in this record)"
        lines += [f"## {name}", "", f"{workloads.describe(name, workloads.Size(**w['size']))}; tracked peak "
                  f"{w['peak'] / 2**20:.1f} MiB. Bitwise: {what}.", "",
                  "| contender | budget | budget held | step | vs plain | bitwise | evictions | recomputations/step | "
                  "copies back | host tier peak | peak RSS | note |",
                  "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for label, rs in runs.items():
            ok = [r for r in rs if "step_s" in r]
            if label.startswith("torch-dtr"):  # which front end ran it (the labels of the records name only native)
                label = (label.removesuffix(", native") + " (compiled front end)" if label.endswith(", native")
                         else label + " (Python front end)")
            if not ok:
                lines.append(f"| {label} | - | - | - | - | - | - | - | - | - | - | {rs[0].get('error', '')[:150]} |")
                continue
            step = statistics.median(r["step_s"] for r in ok)
            r0 = ok[0]
            n = 3  # steps per run (one warm-up, two timed)
            budget = f"{r0['budget'] / 2**20:.1f} MiB" if r0.get("budget") else "-"
            same = "yes" if all(r["losses"] == want and r.get("digest") == want_digest for r in ok) else "NO"
            remats = f"{r0['remats'] / n:.0f}" if "remats" in r0 else "-"
            host = f"{r0['host_peak'] / 2**20:.1f} MiB" if r0.get("host_peak") else "-"
            over = max(r.get("peak_tracked", 0) for r in ok) - r0["budget"] if r0.get("budget") else None
            held = "-" if over is None else "yes" if over <= 0 else f"NO, +{over / 2**20:.2f} MiB"
            lines.append(f"| {label} | {budget} | {held} | {step:.3f} s | {step / plain:.2f}x | {same} | "
                         f"{r0.get('evictions', '-')} | {remats} | {r0.get('swaps_in', '-')} | {host} | "
                         f"{max(r['peak_rss'] for r in ok) / 2**30:.2f} GiB | |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
