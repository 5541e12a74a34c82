"""Plain PyTorch, the native front end (no budget and at ratios of plain's tracked peak) and the Python front end
(at the same ratios), each in a process of its own (the bench's worker), interleaved over rounds; prints each
contender's step against plain's median, and whether its losses are bitwise plain's.

    python benchmarks/experiments/native/side_by_side.py WORKLOAD ROUNDS [RATIO ...]

e.g. ``gpt2 3 0.5`` (about 2 minutes on 2 cores) or ``resnet50 2 0.5``; WORKLOAD as ``torch-dtr bench`` names
them, at its full sizes.
"""

from __future__ import annotations

import statistics
import sys

from torch_dtr.bench import workloads
from torch_dtr.bench.run import spawn


def main() -> int:
    name, rounds, ratios = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3:]]
    size = workloads.SIZES[name]["full"]
    common = {"workload": name, "size": size.__dict__, "warmup": 1, "steps": 3, "threads": 0}
    res: dict[str, list[dict]] = {"plain": [], "native, no budget": []}
    for _ in range(rounds):
        p = spawn(common | {"kind": "plain", "label": "plain"}, 1800)
        res["plain"].append(p)
        res["native, no budget"].append(spawn(common | {"kind": "dtr", "budget": None, "front": "native",
                                                        "label": "native"}, 1800))
        for r in ratios:
            for front in ("native", "python"):
                spec = {"kind": "dtr", "budget": int(r * p["peak_tracked"]), "label": front,
                        "max_remats": 3 * p["ops"]} | ({"front": "native"} if front == "native" else {})
                res.setdefault(f"{front} {r:.0%}", []).append(spawn(common | spec, 1800))
    base = statistics.median(x["step_s"] for x in res["plain"])
    want = res["plain"][0]["losses"]
    for label, runs in res.items():
        ok = [x for x in runs if "step_s" in x]
        if not ok:
            print(f"{label}: {runs[0].get('error', '')[:300]}")
            continue
        each = ", ".join(f"{x['step_s'] / base:.2f}" for x in ok)
        print(f"{label}: {statistics.median(x['step_s'] for x in ok) / base:.2f}x plain (rounds: {each}), "
              f"bitwise {all(x['losses'] == want for x in ok)}, evictions {ok[0].get('evictions', '-')}, "
              f"recomputations {ok[0].get('remats', '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
