"""Eviction policies against h_DTR^eq on many operator logs (issue 13 part 5): writes docs/policy_grid.md.

    python benchmarks/policy_grid.py [--policies dtr_comp ...] [--logs DIR] [--out docs/policy_grid.md]

Records one training step of every model in ``tests/eager/models.py`` (forward and backward; again with
an SGD step), of an 8-layer GELU MLP (width 256, batch 512) and of the bench's three workloads at their
quick size (one AdamW step after a warm-up step), with ``torch_dtr.recorder.record``; adds the DTR authors'
shared logs when they are beside the checkout. Replays each at ratios 0.2-0.9 of its no-eviction peak with
every policy, in the DTR authors' order of bringing inputs back and in the live runtime's
(``simulate(..., live_order=True)``), and counts the cells where a policy is worse than ``dtr_eq`` (by more
than 0.05%; ``thrash``/``oom`` count as infinitely bad). About 30 s on 2 cores with the compiled core (2026-11-30).
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "dtr-logs"
RATIOS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
TOLERANCE = 1.0005


def _record_all(out: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT / "tests" / "eager"))
    import models  # noqa: PLC0415 (lives in tests/eager)
    import torch  # noqa: PLC0415
    import torch.nn as nn  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    from torch_dtr.bench import workloads  # noqa: PLC0415
    from torch_dtr.recorder import record  # noqa: PLC0415

    def mlp8():
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(256, 256), nn.GELU()]

        def make_batch(seed: int):
            g = torch.Generator().manual_seed(seed)
            return (torch.randn(512, 256, generator=g),), torch.randn(512, 256, generator=g)

        return nn.Sequential(*layers[:-1]), make_batch, F.mse_loss

    made = []
    builders = {**models.BUILDERS, "mlp8_gelu": mlp8}
    for name, builder in tqdm(builders.items(), desc="recording models", file=sys.stderr):
        for sgd in (False, True):
            torch.manual_seed(0)
            model, make_batch, loss_fn = builder()
            model.train()
            inputs, targets = make_batch(0)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3) if sgd else None
            path = out / f"{name}{'-sgd' if sgd else ''}.log"
            with record(path, costs="model"):
                y = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
                loss_fn(y, targets).backward()
                if opt is not None:
                    opt.step()
            made.append(path)
    for name in tqdm(("gpt2", "resnet50", "lstm"), desc="recording bench workloads", file=sys.stderr):
        model, batches, step = workloads.build(name, workloads.SIZES[name]["quick"], steps=2)
        step(model, batches[0])  # the optimizer's state exists, as in every later step
        path = out / f"bench-{name}.log"
        with record(path, costs="model"):
            step(model, batches[1])
        made.append(path)
    return made


def _value(o) -> float:
    return o.overhead if o.status == "ok" else math.inf


def _cell(o) -> str:
    return f"{o.overhead:.3f}" if o.status == "ok" else o.status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", nargs="+", help="policies to compare with dtr_eq (default: the library's "
                    "default policy)")
    ap.add_argument("--logs", help="keep the recorded logs in this folder (default: a temporary one)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "policy_grid.md"))
    a = ap.parse_args()
    from torch_dtr.core.policies import DEFAULT_POLICY  # noqa: PLC0415
    from torch_dtr.sim import log, replay  # noqa: PLC0415

    policies = ["dtr_eq", *[p for p in (a.policies or [DEFAULT_POLICY]) if p != "dtr_eq"]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.logs) if a.logs else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = _record_all(folder)
        if SHARED.is_dir():
            paths += sorted(SHARED.glob("*.log"))
        grid: dict[tuple[str, str, str, float], object] = {}
        sizes = {}
        for path in tqdm(paths, desc="replaying", file=sys.stderr):
            lg = log.read(path)
            peak = replay.no_eviction_peak(lg)
            sizes[path.stem] = sum(1 for i in lg.instrs if isinstance(i, log.Call))
            for order in ("authors", "live"):
                for p in policies:
                    for r in RATIOS:
                        grid[(path.stem, order, p, r)] = replay.simulate(lg, p, ratio=r, peak=peak,
                                                                          live_order=order == "live")
    names = [p.stem for p in paths]
    lines = ["# Policies against h_DTR^eq on recorded and shared operator logs", "",
             f"Written by `python benchmarks/policy_grid.py --policies {' '.join(policies)}` on "
             f"{datetime.date.today()}. Overhead = (op time + recomputed op time) / op time, replayed at ratio x "
             f"the log's no-eviction peak; `thrash`: over 2.0; `oom`: nothing left to evict. Two orders of "
             f"bringing inputs back: the DTR authors' (as `torch-dtr simulate`) and the live runtime's. A cell "
             f"is worse (better) than `dtr_eq` when its overhead is more than 0.05% above (below) it.", "",
             "## Summary", "",
             "| policy | order | worse than dtr_eq | better | worst (log @ ratio: policy vs dtr_eq) |",
             "| --- | --- | --- | --- | --- |"]
    for p in policies[1:]:
        for order in ("authors", "live"):
            worse, better, worst = 0, 0, (1.0, "")
            for n in names:
                for r in RATIOS:
                    mine, eq = _value(grid[(n, order, p, r)]), _value(grid[(n, order, "dtr_eq", r)])
                    if mine > eq * TOLERANCE:
                        worse += 1
                        ratio = math.inf if math.isinf(mine) else mine / eq
                        if ratio > worst[0]:
                            worst = (ratio, f"{n} @ {r}: {_cell(grid[(n, order, p, r)])} vs "
                                            f"{_cell(grid[(n, order, 'dtr_eq', r)])}")
                    elif eq > mine * TOLERANCE:
                        better += 1
            lines.append(f"| {p} | {order} | {worse} of {len(names) * len(RATIOS)} | {better} | {worst[1]} |")
    for order in ("authors", "live"):
        lines += ["", f"## Every cell ({order} order)", ""]
        for n in names:
            lines += [f"### {n} ({sizes[n]} ops)", "", "| policy | " + " | ".join(map(str, RATIOS)) + " |",
                      "| --- " * (len(RATIOS) + 1) + "|"]
            for p in policies:
                lines.append(f"| {p} | " + " | ".join(_cell(grid[(n, order, p, r)]) for r in RATIOS) + " |")
            lines.append("")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
