"""One benchmark contender, measured in a process of its own (so that its peak RSS is its own).

Run as ``python -m torch_dtr.bench.worker '<json spec>'``; prints progress on stderr and one JSON object
(the result) as the last line of stdout. The spec's ``kind``:

- ``plain``, ``dtr`` (``budget`` in bytes or null; ``swap``: the host tier; ``front``: "native" or "python",
  default ``enable()``'s choice; ``grads_in_place``: the compiled front end's option, default true),
  ``ckpt_block``, ``ckpt_sqrt``, ``compile``
  (``mem_budget``: torch.compile's activation memory budget): train ``warmup`` + ``steps`` steps, time
  the measured ones; plain and checkpointing also run one untimed step under torch-dtr without a budget,
  whose tracked peak is their live bytes in the runtime's own accounting;
- ``search``: the smallest budget (bytes) that trains a step, by bisection in this process;
- ``scale``: the largest batch multiple that trains within plain PyTorch's peak at the base batch;
- ``timeline``: tracked bytes after every op of one step, with no budget and at ``budget``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch

import torch_dtr

from . import workloads


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Thrash(RuntimeError):
    pass


_STEP_START = [0]  # the runtime's rematerialization count when the current step began (see _train)


def _runtime() -> Any:
    """The core runtime of the running session (None: none runs)."""
    return torch_dtr.runtime() if torch_dtr.enabled() else None


def _unwrap(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with ``t``'s value (its storage pinned in the core)."""
    return torch_dtr.unwrap(t)


def _cap_remats(limit: int) -> None:
    """Stop a thrashing step: raise ``Thrash`` once one step has run more than ``limit`` recomputations."""
    rt = _runtime()
    _STEP_START[0] = rt.rematerializations

    def on_event(kind: str, _s: object) -> None:
        if kind == "remat" and rt.rematerializations - _STEP_START[0] > limit:
            raise Thrash(f"more than {limit} recomputations in one step")

    rt.listen(on_event)


def _train(spec: dict, model: torch.nn.Module, batches: list, step: Any) -> dict:
    times, losses = [], []
    warm = spec["warmup"]
    for i, b in enumerate(batches):
        torch.manual_seed(100 + i)
        rt = _runtime()
        if rt is not None:
            _STEP_START[0] = rt.rematerializations
        t0 = time.perf_counter()
        loss = step(model, b)
        dt = time.perf_counter() - t0
        losses.append(float(_unwrap(loss)))
        if i >= warm:
            times.append(dt)
        print(f"    {spec['label']}: step {i + 1}/{len(batches)} {dt:.2f} s", file=sys.stderr, flush=True)
    return {"step_s": statistics.median(times), "step_times": times, "losses": losses}


def _tracked_peak(model: torch.nn.Module, batch: Any, step: Any) -> tuple[int, int, int]:
    """Peak tracked bytes, ops and the single-op floor of one step under torch-dtr with no budget."""
    torch_dtr.enable(budget=None)
    try:
        step(model, batch)
        st = torch_dtr.stats()
    finally:
        torch_dtr.disable()
    return st.peak_bytes, st.ops, st.floor_bytes


def run(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads") or max(1, os.cpu_count() or 1))
    size = workloads.Size(**spec["size"])
    kind = spec["kind"]
    n = spec["warmup"] + spec["steps"]
    model, batches, step = workloads.build(spec["workload"], size, n)
    res: dict[str, Any] = {"kind": kind, "budget": spec.get("budget"), "mem_budget": spec.get("mem_budget"),
                           "ratio": spec.get("ratio")}
    base_rss = _current_rss()
    if kind == "search":
        return res | _search(spec, model, batches, step)
    if kind == "scale":
        return res | _scale(spec, step)
    if kind == "timeline":
        return res | _timeline(spec, model, batches, step)
    if kind in ("ckpt_block", "ckpt_sqrt"):
        res["segments"] = workloads.checkpoint_blocks(spec["workload"], model, kind[5:])
    if kind == "compile":
        import torch._functorch.config as fconf

        fconf.activation_memory_budget = spec["mem_budget"]
        t0 = time.perf_counter()
        model = torch.compile(model)
        try:
            step(model, batches[0])
        except Exception as e:  # report why it does not compile here
            return res | {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        res["compile_s"] = time.perf_counter() - t0
    if kind == "dtr":
        # the front end: the default (NOTE [ Choosing the front end ]), or "native" / "python"
        torch_dtr.enable(budget=spec["budget"], swap=spec.get("swap", False), front=spec.get("front"),
                         grads_in_place=spec.get("grads_in_place", True))
        _cap_remats(spec.get("max_remats", 10**9))  # per step; run.py passes 3 x ops per step, as the search
    try:
        res |= _train(spec, model, batches, step)
    except (torch_dtr.BudgetError, Thrash) as e:
        res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        if kind == "dtr":
            st = torch_dtr.stats()
            torch_dtr.disable()
            res |= {"peak_tracked": st.peak_bytes, "evictions": st.evictions, "remats": st.rematerializations,
                    "remat_s": st.remat_seconds, "search_s": st.search_seconds, "ops": st.ops,
                    "constant_bytes": st.constant_bytes, "ops_per_step": st.ops / n, "swaps_in": st.swaps_in,
                    "host_peak": st.host_peak_bytes}
    if kind in ("plain", "dtr"):
        res["digest"] = workloads.digest(model)  # the final parameters, to compare bitwise
    res["peak_rss"] = _rss()
    res["rss_over_base"] = res["peak_rss"] - base_rss
    if "error" in res:
        return res
    if kind in ("plain", "ckpt_block", "ckpt_sqrt"):
        try:
            res["peak_tracked"], res["ops"], res["single_op_floor"] = _tracked_peak(model, batches[-1], step)
        except Exception as e:  # the accounting run is an extra; never lose the timing for it
            res["tracked_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return res


def _feasible(model: torch.nn.Module, batch: Any, step: Any, budget: int, max_remats: int) -> str | None:
    """None if one step trains under ``budget``, else why not (the BudgetError's or Thrash's message).

    Each probe starts as a step of a training loop does: a probe that failed in its backward left some
    ``p.grad`` set (its step's ``zero_grad`` never ran), and the next probe's backward then accumulated
    into them (ResNet-50's search called 49% of its peak infeasible that way; a fresh process trains at
    44%)."""
    model.zero_grad(set_to_none=True)
    torch_dtr.enable(budget=budget)
    try:
        _cap_remats(max_remats)
        torch.manual_seed(0)
        step(model, batch)
        return None
    except (torch_dtr.BudgetError, Thrash) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        torch_dtr.disable()


def _search(spec: dict, model: torch.nn.Module, batches: list, step: Any) -> dict:
    # the peak over every batch of the run (the dynamic workload's batches differ in length)
    peaks = [_tracked_peak(model, b, step) for b in batches]
    peak, ops, floor = max(p[0] for p in peaks), max(p[1] for p in peaks), max(p[2] for p in peaks)
    cap = spec.get("remat_per_op", 3) * ops
    lo, hi = 0, peak  # lo infeasible (nothing fits in 0 bytes), hi feasible
    tol = max(1, int(peak * spec.get("tolerance", 0.01)))
    probes = 0
    why = None  # why the largest infeasible budget probed failed: what sets the floor
    while hi - lo > tol:
        mid = (lo + hi) // 2
        fail = next((f for f in (_feasible(model, b, step, mid, cap) for b in batches[:2]) if f), None)
        probes += 1
        print(f"    search: {mid / peak:.3f} of peak -> {'no' if fail else 'ok'}", file=sys.stderr, flush=True)
        lo, hi = (mid, hi) if fail else (lo, mid)
        if fail:
            why = fail
    return {"peak_tracked": peak, "ops": ops, "min_budget": hi, "min_ratio": hi / peak, "probes": probes,
            "floor": why, "floor_budget": lo, "single_op_floor": floor}


def _scale(spec: dict, step_unused: Any) -> dict:
    """Budget = plain's tracked peak at the base batch; try 2x, 3x, ... the batch under it."""
    base = workloads.Size(**spec["size"])
    steps = spec["warmup"] + spec["steps"]
    model, batches, step = workloads.build(spec["workload"], base, steps)
    plain = _train(spec | {"label": "scale plain x1"}, model, batches, step)
    budget = _tracked_peak(model, batches[0], step)[0]
    out: dict[str, Any] = {"budget": budget, "base_batch": base.batch, "plain_step_s": plain["step_s"],
                           "plain_throughput": base.batch / plain["step_s"], "tries": []}
    for mult in spec.get("multiples", (2, 3, 4)):
        size = workloads.Size(**(spec["size"] | {"batch": base.batch * mult}))
        model, batches, step = workloads.build(spec["workload"], size, steps)
        torch_dtr.enable(budget=budget)
        try:
            _cap_remats(spec.get("remat_cap", 10**6))
            r = _train(spec | {"label": f"scale dtr x{mult}"}, model, batches, step)
            st = torch_dtr.stats()
            out["tries"].append({"mult": mult, "ok": True, "step_s": r["step_s"], "peak_tracked": st.peak_bytes,
                                 "throughput": size.batch / r["step_s"]})
        except (torch_dtr.BudgetError, Thrash) as e:
            out["tries"].append({"mult": mult, "ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            break
        finally:
            torch_dtr.disable()
        del model, batches
    return out


def _timeline(spec: dict, model: torch.nn.Module, batches: list, step: Any) -> dict:
    out: dict[str, Any] = {}
    step(model, batches[0])  # warm up (lazy optimizer state, caches)
    cap = spec.get("max_remats", 10**9)
    for label, budget in (("unbounded", None), ("bounded", spec["budget"])):
        torch_dtr.enable(budget=budget)
        rt = torch_dtr.runtime()
        trace: list[int] = []  # tracked bytes after each managed op
        events: list[tuple[str, int]] = []

        def on_event(kind: str, _s: object, rt: Any = rt, trace: list = trace, events: list = events) -> None:
            if kind == "op":
                trace.append(rt.memory.tracked)
            elif kind in ("evict", "remat"):
                events.append((kind, len(trace)))
            if kind == "remat" and rt.rematerializations > cap:
                raise Thrash(f"more than {cap} recomputations in one step")

        rt.listen(on_event)
        marks: list[int] = []
        try:
            torch.manual_seed(0)
            step(model, batches[1 % len(batches)], lambda: marks.append(len(trace)))  # noqa: B023
        except (torch_dtr.BudgetError, Thrash) as e:
            out["error"] = f"at {label}: {type(e).__name__}: {str(e)[:200]}"
        finally:
            torch_dtr.disable()
        out[label] = {"trace": trace, "backward_at": marks[0] if marks else None,
                      "evict_at": [i for k, i in events if k == "evict"],
                      "remat_at": [i for k, i in events if k == "remat"]}
    return out


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    print(json.dumps(result))
