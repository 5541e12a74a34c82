"""What knowing the iteration could gain (issue 51): each workload's traced iteration replayed with the default
policy and with an oracle that knows every value's next use (the traced iteration's own future), at 0.3-0.9 of the
peak. The oracle scores a candidate cost / (bytes x time to its next read), Belady's rule with recompute costs, in
place of DTR's cost / (bytes x time since its last read); a value never read again goes first.

    python benchmarks/experiments/oracle_traces.py [--quick] [--only NAME]

Prints a markdown table (quoted in docs/simulation-live.md). The oracle is an upper bound on what a plan from a
traced iteration could reach with the same recomputation machinery, not a plan the runtime can follow yet.
"""

from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch_dtr
from torch_dtr.core import BudgetError, Policy, Runtime, Storage
from torch_dtr.core.policies import register
from torch_dtr.core.trackers import TRACKERS, Tracker, register_tracker
from torch_dtr.sim.trace import THRASH_AT, TraceReplay, read_trace, trace_peak

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trace_vs_live import RATIOS, workloads  # noqa: E402

_NOW: list[Any] = [None]  # the replay being run (the tracker reads its position)


def _next_use(s: Storage) -> float:
    """Modelled seconds from now to ``s``'s next read in the traced iteration (inf: none)."""
    rp = _NOW[0]
    sid = rp.rev.get(s)
    reads = rp.reads.get(sid) if sid is not None else None
    if not reads:
        return float("inf")
    i = bisect.bisect_right(reads, rp.k)
    if i == len(reads):
        return float("inf")
    return max(rp.clock[reads[i]] - rp.clock[rp.k], 1e-9)


class _Future(Tracker):
    """``extra``: (the evicted neighbourhood's cost, as ``dtr_comp``'s, or 0 for ``oracle``; the time to the next
    read)."""

    def __init__(self, inner: Tracker | None = None) -> None:
        super().__init__()
        self.scores = True  # (set on the instance: the compiled base class reads its own slot)
        self.inner = inner

    def evicted(self, s: Storage) -> None:
        if self.inner is not None:
            self.inner.evicted(s)

    def restored(self, s: Storage) -> None:
        if self.inner is not None:
            self.inner.restored(s)

    def superseded(self, s: Storage) -> None:
        if self.inner is not None:
            self.inner.superseded(s)

    def grouped(self, s: Storage) -> bool:
        return self.inner.grouped(s) if self.inner is not None else False

    def extra(self, s: Storage) -> Any:
        return (self.inner.extra(s) if self.inner is not None else 0.0), _next_use(s)


def _belady(cost: float, nbytes: int, staleness: float, extra: Any) -> float:
    return (cost + extra[0]) / (nbytes * extra[1]) if nbytes else float("inf")


register_tracker("future", _Future)
register_tracker("future_comp", lambda: _Future(TRACKERS["comp"]()))
register(Policy("oracle", _belady, "future"))
register(Policy("oracle_comp", _belady, "future_comp"))
POLICIES_COMPARED = ("dtr_comp", "oracle", "oracle_comp")


class _OracleReplay(TraceReplay):
    """A replay that knows where it is (``k``: the row) and every storage's reads (rows), for ``_Future``."""

    def __init__(self, trace: Any, rt: Runtime, thrash_at: float | None) -> None:
        super().__init__(trace, rt, thrash_at)
        self.k = 0
        self.rev: dict[Storage, int] = {}
        self.reads: dict[int, list[int]] = {}
        self.clock: list[float] = []
        t = 0.0
        for n, row in enumerate(trace.rows):
            if row[0] == "R":
                t += row[2]
            self.clock.append(t)
            if row[0] in ("B", "R"):
                for sid in row[1] if row[0] == "B" else row[3]:
                    lst = self.reads.setdefault(sid, [])
                    if not lst or lst[-1] != n:
                        lst.append(n)

    def run(self) -> None:
        _NOW[0] = self
        for n, row in enumerate(self.trace.rows):
            self.k = n
            self._row(row)
            if row[0] == "R":
                for sid in row[11]:
                    self.rev[self.storages[sid]] = sid


def replay(trace: Any, policy: str, budget: int) -> tuple[str, float, int]:
    rt = Runtime(budget, policy, lazy_tracking=False, banish_depth=trace.options.get("banish_depth", 2))
    rp = _OracleReplay(trace, rt, THRASH_AT)
    base = rp.base or 1.0
    try:
        rp.run()
        status = "ok"
    except BudgetError:
        status = "oom"
    except Exception as e:  # _Thrash
        if type(e).__name__ != "_Thrash":
            raise
        status = "thrash"
    return status, (base + rt.remat_cost) / base, rt.rematerializations


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", action="append")
    args = p.parse_args()
    ws = workloads(args.quick)
    print("| workload | ratio | dtr_comp: overhead, recomputations | oracle: cost / (bytes x next use) | oracle with "
          "dtr_comp's neighbourhood: (cost + nbhd) / (bytes x next use) |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(ws):
            run = ws[name][1]()
            path = Path(tmp) / "step.trace"
            with torch_dtr.enable(trace=path):
                run()
            trace = read_trace(path)
            peak = trace_peak(trace)
            for ratio in RATIOS:
                cells = []
                for pol in POLICIES_COMPARED:
                    status, ov, n = replay(trace, pol, int(ratio * peak))
                    cells.append(f"{ov:.3f}, {n}" if status == "ok" else status)
                print(f"| {name} | {ratio:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
