"""Every (log, policy, ratio) replay of the shared DTR logs as JSON, for diffing two versions of the core.

    python benchmarks/sim_digest.py OUT.json [--logs ../shared/dtr-logs]

Wall-clock fields are dropped, so two runs of the same code give identical files; a behaviour change of the
runtime or of a policy shows up as a difference. ``dtr`` (exact neighbourhoods, slow at low ratios) runs
only at 0.6, 0.8 and 1.0. To compare with an older checkout: ``PYTHONPATH=OLD/src python ... old.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch_dtr.core import POLICIES
from torch_dtr.sim import log, replay

RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--logs", default=str(Path(__file__).resolve().parents[2] / "shared" / "dtr-logs"))
    a = ap.parse_args()
    out = {}
    for path in sorted(Path(a.logs).glob("*.log")):
        lg = log.read(path)
        peak = replay.no_eviction_peak(lg)
        for p in sorted(POLICIES):
            for r in RATIOS if p != "dtr" else (0.6, 0.8, 1.0):
                o = replay.simulate(lg, p, ratio=r, peak=peak).as_dict()
                o.pop("wall_seconds")
                o.pop("search_seconds")
                out[f"{path.stem} {p} {r}"] = o
                print(path.stem, p, r, o["status"], round(o["overhead"], 4), file=sys.stderr, flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
