"""Where the per-op path's time goes, phase by phase: writes docs/dispatch-phases.md.

    python benchmarks/phases.py [--out docs] [--steps 10]

Each phase of ``Front`` (the argument scan and acquire, size prediction and reservation, the op's own run,
the cost model, the recipe, the wrappers, handle deaths) is wrapped with a clock for one measured run of
each program at no budget and at a budget above its peak, after a warm-up; the sum is compared with the
step time added over plain PyTorch and with what a do-nothing dispatch mode adds, in the same process. The
clocks cost about 0.1 us per wrapped call, so read the rows as shares.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_dtr
from torch_dtr.bench import workloads
from torch_dtr.eager import front as F

PHASES = ("_plan", "_execute", "_record", "_wrap", "_fresh", "drain", "drain_if_idle", "_scan_top", "_wrap_fresh")


class _Noop(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        return func(*args, **(kwargs or {}))


class _Wrapper(torch.Tensor):
    """A do-nothing wrapper subclass, written as lean as one can: unwrap the top-level arguments, run, wrap
    the output. torch-dtr is a dispatch mode plus a wrapper subclass; this is the part of its cost that any
    Python wrapper pays."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, t: torch.Tensor) -> _Wrapper:
        w = torch.Tensor._make_wrapper_subclass(cls, t.size(), strides=t.stride(), storage_offset=t.storage_offset(),
                                                dtype=t.dtype, device=t.device, requires_grad=False)
        w._t = t
        return w

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*[a._t if type(a) is _Wrapper else a for a in args], **(kwargs or {}))
        return _Wrapper(out) if isinstance(out, torch.Tensor) else out


class _State:
    """Per-wrapper state with a finalizer, as torch-dtr's ``Cell`` (whose finalizer queues a handle drop)."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __del__(self) -> None:
        pass


class _Kept(_Wrapper):
    """``_Wrapper`` whose payload sits in a ``_State``."""

    @staticmethod
    def __new__(cls, t: torch.Tensor) -> _Kept:
        w = torch.Tensor._make_wrapper_subclass(cls, t.size(), strides=t.stride(), storage_offset=t.storage_offset(),
                                                dtype=t.dtype, device=t.device, requires_grad=False)
        w._state = _State(t)
        return w


def _plain(a: object) -> object:
    t = type(a)
    if t is _Wrapper:
        return a._t  # type: ignore[attr-defined]
    if t is _Kept:
        return a._state.t  # type: ignore[attr-defined]
    return a


class _Skeleton(TorchDispatchMode):
    """torch-dtr's design with nothing in it: a dispatch mode that unwraps managed inputs, runs the op and wraps
    its outputs when an input was managed or required grad (no records, no budget, no recipes)."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        cls = self.cls
        wrap = any(type(a) is cls or (isinstance(a, torch.Tensor) and a.requires_grad) for a in args)
        out = func._op(*[_plain(a) for a in args], **(kwargs or {}))
        if not wrap:
            return out
        if type(out) is torch.Tensor:
            return cls(out)
        if isinstance(out, tuple):
            return tuple(cls(o) if type(o) is torch.Tensor else o for o in out)
        return out


def _chain(w: torch.Tensor) -> Callable[[], None]:
    def small() -> None:
        y = w
        for _ in range(200):
            y = y * 1.0001 + 0.5
        y.sum().backward()
        w.grad = None

    return small


def floor(rounds: int, steps: int) -> dict[str, float]:
    """Microseconds added per op on the small-op chain, interleaved in rounds: a do-nothing mode, a do-nothing
    wrapper subclass, torch-dtr's skeleton (mode + wrapper) without and with a finalized state object per
    wrapper, torch-dtr with no budget."""
    base = torch.randn(64, 64)
    plain = _chain(base.clone().requires_grad_(True))
    wrapped = _chain(_Wrapper(base.clone()).requires_grad_(True))
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        plain()
        times["plain"].append(_median(plain, steps))
        with _Noop():
            plain()
            times["a do-nothing dispatch mode"].append(_median(plain, steps))
        wrapped()
        times["a do-nothing wrapper subclass"].append(_median(wrapped, steps))
        for label, cls in (("torch-dtr's skeleton: a mode that unwraps inputs and wraps outputs", _Wrapper),
                           ("the skeleton with a state object with a finalizer per wrapper (a `Cell`)", _Kept)):
            with _Skeleton(cls):
                plain()
                times[label].append(_median(plain, steps))
        torch_dtr.enable(budget=None)
        try:
            plain()
            times["torch-dtr, no budget"].append(_median(plain, steps))
        finally:
            torch_dtr.disable()
    p = statistics.median(times.pop("plain"))
    return {k: (statistics.median(v) - p) / 604 * 1e6 for k, v in times.items()}


def _programs() -> dict[str, Callable[[], None]]:
    small = _chain(torch.randn(64, 64, requires_grad=True))
    out = {"small ops: 200 x (mul, add) on 64x64": small}
    for name in ("gpt2", "lstm"):
        model, batches, step = workloads.build(name, workloads.SIZES[name]["quick"], 2)
        out[f"{name} (quick size), AdamW step"] = lambda m=model, b=batches[0], s=step: s(m, b)
    return out


def _median(fn: Callable[[], None], n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(fn: Callable[[], None], steps: int, budget: int | None) -> dict:
    fn()
    plain = _median(fn, steps)
    with _Noop():
        fn()
        noop = _median(fn, steps)
    torch_dtr.enable(budget=budget)
    try:
        front = F._ACTIVE
        fn()
        acc: collections.Counter[str] = collections.Counter()

        def timed(name: str, f: Callable) -> Callable:
            def w(*a, **k):
                t0 = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    acc[name] += time.perf_counter() - t0
            return w

        for name in PHASES:
            setattr(front, name, timed(name, getattr(front, name)))
        front.rt.acquire = timed("acquire", front.rt.acquire)
        front.rt.release = timed("release", front.rt.release)
        front._run = timed("_run (general path, all of it)", front._run)
        front._run_simple = timed("_run_simple (short path, all of it)", front._run_simple)
        model_cost = F.model_cost
        F.model_cost = timed("model_cost", model_cost)
        ops0 = front.rt.ops
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        dtr = (time.perf_counter() - t0) / steps
        ops = (front.rt.ops - ops0) / steps
        F.model_cost = model_cost
    finally:
        torch_dtr.disable()
    return {"ops": ops, "plain_us": plain * 1e6, "noop_added": (noop - plain) / ops * 1e6,
            "dtr_added": (dtr - plain) / ops * 1e6, "phases": {k: v / steps / ops * 1e6 for k, v in acc.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = ["# The per-op path, phase by phase", "",
             f"Measured {datetime.date.today().isoformat()}, {torch.get_num_threads()} threads, "
             f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}. Command: "
             f"`python benchmarks/phases.py --steps {args.steps}`. Microseconds per managed op; *added*: the step "
             "time over plain PyTorch's per managed op (torch-dtr's with the phase clocks on); the phase rows "
             "are wall time inside each phase (`_run` and `_run_simple` include the op itself), handle deaths "
             "(`drain`) outside it too.", ""]
    print("measuring the design's floor ...", file=sys.stderr, flush=True)
    f = floor(3, args.steps)
    mode = f["a do-nothing dispatch mode"]
    lines += ["## The floor of the design", "",
              "torch-dtr is a dispatch mode plus a wrapper subclass. On the small-op chain (604 ops per step), "
              "interleaved in 3 rounds, microseconds added per op over plain PyTorch:", "",
              "| what runs the ops | us per op | of the mode's |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:.1f} | {v / mode:.1f}x |" for k, v in f.items()]
    skeleton = f["the skeleton with a state object with a finalizer per wrapper (a `Cell`)"]
    lines += ["", f"A target of 2x the mode's cost ({2 * mode:.1f} us) leaves torch-dtr's own bookkeeping (what it "
              f"adds beyond the skeleton with its cells) {2 * mode - skeleton:.1f} us per op: no room where that is "
              "negative. Everything torch-dtr adds beyond the skeleton: "
              f"{f['torch-dtr, no budget'] - skeleton:.1f} us.", ""]
    for name, fn in _programs().items():
        for label, budget in (("no budget", None), ("budget above peak", 2**40)):
            print(f"measuring {name}, {label} ...", file=sys.stderr, flush=True)
            r = measure(fn, args.steps, budget)
            lines += [f"## {name}: {label}", "",
                      f"{r['ops']:.0f} managed ops per step; plain step {r['plain_us'] / 1e3:.2f} ms; a do-nothing "
                      f"mode adds {r['noop_added']:.1f} us per managed op, torch-dtr {r['dtr_added']:.1f} "
                      f"({r['dtr_added'] / max(r['noop_added'], 1e-9):.1f}x the mode's).", "",
                      "| phase | us per managed op |", "| --- | ---: |"]
            lines += [f"| `{k}` | {v:.2f} |" for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1])]
            lines.append("")
    path = Path(args.out) / "dispatch-phases.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
