"""Measure the per-op dispatch path: microseconds torch-dtr adds to each aten op when nothing is evicted,
and where they go (cProfile of the per-op functions). Writes docs/dispatch.md.

    python benchmarks/dispatch.py [--out docs] [--repeats 7]
    TORCH_DTR_CORE=compiled python benchmarks/dispatch.py    # the compiled core: docs/dispatch-compiled.md

Six programs, each timed plain, under a do-nothing dispatch mode and under torch-dtr, interleaved
(plain, no-op mode, no budget, budget above the peak, plain, ...) after a warm-up, median of the steps of
``--repeats`` rounds (a program whose step is short runs several steps, about 40 ms, per mode and round):
a chain of small elementwise ops (the per-op cost shows undiluted), and GPT-2 and LSTM-cell training steps
at `torch-dtr bench --quick` sizes and, with ResNet-50, at the full bench's sizes. "no budget" skips size
prediction and eviction; "budget above the peak" runs the whole path (size prediction on meta tensors,
cached; reserve) but never evicts. About 3-6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

import torch_dtr
from torch_dtr import native
from torch_dtr.bench import workloads
from torch_dtr.core import COMPILED


def _small_ops() -> tuple[Callable[[], None], str]:
    w = torch.randn(64, 64, requires_grad=True)

    def step() -> None:
        y = w
        for _ in range(200):
            y = y * 1.0001 + 0.5
        y.sum().backward()
        w.grad = None

    return step, "200 x (mul, add) on 64x64, forward and backward"


_NEXT = [0]  # the next batch: every mode of a round starts from the same one (the LSTM's batches differ in length)


def _workload(name: str, which: str = "quick") -> tuple[Callable[[], None], str]:
    size = workloads.SIZES[name][which]
    model, batches, step = workloads.build(name, size, 4)

    def run() -> None:
        _NEXT[0] += 1
        step(model, batches[(_NEXT[0] - 1) % len(batches)])

    return run, workloads.describe(name, size) + ", AdamW step"


class _Passthrough(TorchDispatchMode):
    """A no-op Python dispatch mode: what any __torch_dispatch__ mode costs before torch-dtr does anything."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.in_step = 0  # of which inside optimizer.step() (torch-dtr passes these through unmanaged)
        self.stepping = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as torch-dtr's mode: no dynamo wrapper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.calls += 1
        self.in_step += self.stepping
        return func(*args, **(kwargs or {}))


def _time(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(fn: Callable[[], None], repeats: int) -> dict:
    fn()  # warm-up (lazy state, allocator)
    plain_s = min(_time(fn) for _ in range(3))
    torch_dtr.enable(budget=None)
    _NEXT[0] = 0
    for _ in range(4):  # managed ops per step: the mean over the 4 batches
        fn()
    st = torch_dtr.stats()
    ops, peak = st.ops / 4, st.peak_bytes
    torch_dtr.disable()
    counter = _Passthrough()
    hooks = [register_optimizer_step_pre_hook(lambda *_: setattr(counter, "stepping", True)),
             register_optimizer_step_post_hook(lambda *_: setattr(counter, "stepping", False))]
    _NEXT[0] = 0
    try:
        with counter:
            for _ in range(4):
                fn()
    finally:
        for h in hooks:
            h.remove()
    dispatched, in_step = counter.calls / 4, counter.in_step / 4
    modes = {"plain": None, "no-op mode": "noop", "no budget": "none", "budget above peak": 2 * peak + 2**20}
    if native.available():  # the compiled front end (torch_dtr.native), the same core
        modes |= {"native, no budget": ("native", None), "native, budget above peak": ("native", 2 * peak + 2**20),
                  "fallback": ("floor", False), "fallback + blocks": ("floor", True)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    # steps per sample: short steps are timed several times in a row (a multiple of the 4 batches, which differ in
    # length for the LSTM), so that each sample holds about 40 ms and one slow step does not move the median
    inner = 1 if plain_s > 0.02 else 4 * max(1, round(0.04 / (4 * plain_s)))

    def timed(m: str, rnd: int) -> None:
        _NEXT[0] = rnd * inner + inner - 1
        fn()  # not timed: the mode was just switched on (its first step fills what a long run keeps warm)
        for _ in range(inner):
            times[m].append(_time(fn))

    for rnd in range(repeats):  # interleaved: slow drift of the machine hits every mode alike
        for m, budget in modes.items():
            if budget is None:
                timed(m, rnd)
                continue
            if budget == "noop":
                with _Passthrough():
                    timed(m, rnd)
                continue
            if isinstance(budget, tuple) and budget[0] == "floor":  # the mechanism's floor: the fallback alone
                with native.passthrough(blocks=budget[1]):
                    timed(m, rnd)
                continue
            if isinstance(budget, tuple):
                native.enable(budget[1])
                try:
                    timed(m, rnd)
                    assert native.stats()["evictions"] == 0
                finally:
                    native.disable()
                continue
            torch_dtr.enable(budget=None if budget == "none" else budget)
            try:
                timed(m, rnd)
                assert torch_dtr.stats().evictions == 0
            finally:
                torch_dtr.disable()
    med = {m: statistics.median(ts) for m, ts in times.items()}
    return {"ops": ops, "dispatched": dispatched, "in_step": in_step, "median_s": med, "inner": inner,
            "us_per_op": {m: (med[m] - med["plain"]) / ops * 1e6 for m in modes},
            "ratio": {m: med[m] / med["plain"] for m in modes}}


def profile(fn: Callable[[], None], budget: int | None, n: int = 5) -> str:
    torch_dtr.enable(budget=budget)
    fn()
    pr = cProfile.Profile()
    try:
        pr.enable()
        for _ in range(n):
            fn()
        pr.disable()
        ops = torch_dtr.stats().ops
    finally:
        torch_dtr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if "torch_dtr" in file or func in ("_make_wrapper_subclass", "__call__"):
            where = file.split("torch_dtr/")[-1] if "torch_dtr" in file else file.split("/")[-1]
            rows.append((tt, ct, nc, f"{where}:{line} {func}"))
    rows.sort(reverse=True)
    per_op = ops / (n + 1)
    out = ["| function | calls per op | self us per op | total us per op |", "| --- | --- | --- | --- |"]
    for tt, ct, nc, name in rows[:14]:
        out.append(f"| `{name}` | {nc / (per_op * n):.2f} | {tt / (per_op * n) * 1e6:.2f} | "
                   f"{ct / (per_op * n) * 1e6:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    progs = {"small ops": _small_ops(), "gpt2 (small)": _workload("gpt2"), "lstm (small)": _workload("lstm"),
             "gpt2 (bench size)": _workload("gpt2", "full"), "resnet50 (bench size)": _workload("resnet50", "full"),
             "lstm (bench size)": _workload("lstm", "full")}
    results = {}
    for name, (fn, desc) in progs.items():
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results[name] = measure(fn, args.repeats) | {"desc": desc}
    print("profiling gpt2 (small) ...", file=sys.stderr, flush=True)
    prof = profile(progs["gpt2 (small)"][0], budget=2**40)
    lines = [
        "# The per-op dispatch path",
        "",
        f"Measured {datetime.date.today().isoformat()} on {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch "
        f"{torch.__version__}. Command: `{'TORCH_DTR_CORE=compiled ' if COMPILED else ''}python "
        f"benchmarks/dispatch.py --repeats {args.repeats}`. The core: "
        f"{'compiled (NOTE [ Compiled core ])' if COMPILED else 'interpreted'}.",
        "",
        "What torch-dtr adds to every aten op when nothing is evicted: median step time under torch-dtr minus",
        "plain PyTorch's, divided by the managed ops per step (modes interleaved in one process, after a",
        "warm-up; in each round every mode runs one step untimed once switched on, as a long run would be",
        "warm, then a short step runs several times in a row, about 40 ms, every step a sample). *no",
        "budget* skips size prediction; *budget above peak* runs the whole per-op path.",
        "",
        "*ops through the mode* counts every aten op the dispatch mode sees (managed or not: optimizer",
        "updates on plain parameters pass through it too), in brackets those inside `optimizer.step()`",
        "(torch-dtr passes them through unmanaged); *no-op mode* is a Python dispatch mode that only",
        "calls the op, the floor any such mode pays. The LSTM draws its sequence length each step: its",
        "counts are means over the 4 batches, and every mode of a round starts from the same batch.",
        "",
        "| program | managed ops per step | ops through the mode (in optimizer.step) | plain step (ms) | "
        "no-op mode: ratio | "
        "no budget: us per managed op | ratio | budget above peak: us per managed op | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(f"| {name}: {r['desc']} | {r['ops']:.0f} | {r['dispatched']:.0f} ({r['in_step']:.0f}) | "
                     f"{r['median_s']['plain'] * 1e3:.1f} | "
                     f"{r['ratio']['no-op mode']:.2f}x | "
                     f"{r['us_per_op']['no budget']:.1f} | {r['ratio']['no budget']:.2f}x | "
                     f"{r['us_per_op']['budget above peak']:.1f} | {r['ratio']['budget above peak']:.2f}x |")
    if any("native, no budget" in r["ratio"] for r in results.values()):
        lines += ["", "The compiled front end (`torch_dtr.native`: the per-op mechanism in C++, the same Python core "
                  "called once or twice per managed op; docs/native.md), in the same runs:", "",
                  "| program | no-op mode: us per managed op | torch-dtr no budget | native no budget | ratio | "
                  "native / mode, per op | torch-dtr budget above peak | native budget above peak | ratio | "
                  "native / mode, per op | no-op fallback: ratio | no-op fallback + blocks: ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in results.items():
            u, q = r["us_per_op"], r["ratio"]

            def per(key: str, u: dict = u) -> str:  # what native adds per op, over what the no-op mode adds
                return f"{u[key] / u['no-op mode']:.2f}x" if u["no-op mode"] > 0.5 else "-"

            lines.append(f"| {name} | {u['no-op mode']:.1f} | {u['no budget']:.1f} | {u['native, no budget']:.1f} | "
                         f"{q['native, no budget']:.2f}x | {per('native, no budget')} | {u['budget above peak']:.1f} | "
                         f"{u['native, budget above peak']:.1f} | {q['native, budget above peak']:.2f}x | "
                         f"{per('native, budget above peak')} | {q['fallback']:.2f}x | {q['fallback + blocks']:.2f}x |")
        lines += ["", "*no-op fallback*: every op of the thread through the compiled front end's dispatch-key "
                  "fallback, which only passes it down (`torch_dtr.native.passthrough()`: boxing and unboxing each "
                  "op's arguments, no Python, no session): the floor of any mechanism built on such a fallback, as "
                  "the no-op mode is a Python mode's; *+ blocks*: with the front end's CPU allocator "
                  "(NOTE [ Native front end ] 7) too."]
    lines += ["", "Where the time goes: cProfile of 5 steps of the small GPT-2 with a budget far above its peak,",
              "per managed op (cProfile's own overhead inflates every figure; read them as shares).", "", prof, ""]
    path = Path(args.out) / ("dispatch-compiled.md" if COMPILED else "dispatch.md")
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
