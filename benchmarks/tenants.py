"""Two tenants under one total budget that is halved and restored while they run; writes docs/tenants.md and
docs/img/tenants.png (each tenant's resident bytes and budget over time).

    python benchmarks/tenants.py [--out docs]

Tenant "samples" caches decoded samples (a 3-stage pipeline per sample), tenant "features" caches features
computed from a document; both keep every value's handle and read random earlier ones back each step, so
evicted values are recomputed. At step 60 the pool's total is halved, at step 120 restored, at step 150 the
features tenant's share is tripled. No torch: ``torch_dtr.Pool`` drives the core runtime directly.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import sys
from pathlib import Path

from torch_dtr.store import Pool

KB = 1024
STEPS = 200


def load(seed: int, n: int) -> bytes:
    """A stand-in for reading a file: the same bytes for the same seed (so it can be read again)."""
    r = random.Random(seed)
    return bytes(r.randrange(256) for _ in range(n))


def decode(raw: bytes) -> bytes:
    return bytes((b * 7 + 3) % 256 for b in raw) * 8


def augment(img: bytes, k: int) -> bytes:
    return bytes((b + k) % 256 for b in img)


def features(doc: bytes, dim: int) -> bytes:
    return bytes((doc[i % len(doc)] * 31 + i) % 256 for i in range(dim))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    args = ap.parse_args()
    rng = random.Random(0)
    total = 1024 * KB
    pool = Pool(total=total)
    samples, feats = pool.store("samples"), pool.store("features")
    kept: dict[str, list] = {"samples": [], "features": []}
    want: dict[str, list] = {"samples": [], "features": []}
    trace: dict[str, list[tuple[int, int]]] = {"samples": [], "features": []}
    events = []
    for step in range(STEPS):
        if step == 60:
            pool.set_total(total // 2)
            events.append((step, "total halved"))
        elif step == 120:
            pool.set_total(total)
            events.append((step, "total restored"))
        elif step == 150:
            pool.set_share("features", 3)
            events.append((step, "features' share x3"))
        raw = samples.compute(load, step, 2 * KB, nbytes=2 * KB)
        img = samples.compute(decode, raw, nbytes=16 * KB)
        kept["samples"].append(samples.compute(augment, img, step % 7, nbytes=16 * KB))
        want["samples"].append(augment(decode(raw.get()), step % 7))
        doc = feats.compute(load, 10_000 + step, KB, nbytes=KB)
        kept["features"].append(feats.compute(features, doc, 24 * KB, nbytes=24 * KB))
        want["features"].append(features(doc.get(), 24 * KB))
        for name in kept:  # read three random earlier values back: recomputed where evicted
            for i in rng.sample(range(len(kept[name])), min(3, len(kept[name]))):
                assert kept[name][i].get() == want[name][i], f"{name} value {i} differs after recomputation"
        for name, st in pool.stats().items():
            trace[name].append((st.resident_bytes, st.budget_bytes or 0))
            assert st.resident_bytes <= (st.budget_bytes or 0)
    stats = pool.stats()
    out = Path(args.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for (name, tr), color in zip(trace.items(), ("tab:blue", "tab:orange"), strict=True):
        ax.plot([r / KB for r, _ in tr], color=color, label=f"{name}: resident")
        ax.plot([b / KB for _, b in tr], color=color, linestyle="--", label=f"{name}: budget")
    for step, what in events:
        ax.axvline(step, color="grey", linewidth=0.8)
        ax.text(step + 1, ax.get_ylim()[1] * 0.95, what, fontsize=8, va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("KiB")
    ax.set_title("two tenants of one torch_dtr.Pool")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "img" / "tenants.png", dpi=110)
    lines = ["# Tenants sharing one budget", "",
             f"Run {datetime.date.today().isoformat()}, Python {platform.python_version()}. Command: "
             "`python benchmarks/tenants.py`. Two tenants of one `torch_dtr.Pool` (total 1 MiB, equal shares) "
             f"cache {STEPS} values each and read three random earlier ones back every step; the total is halved "
             "at step 60 and restored at step 120, and the features tenant's share is tripled at step 150. Every "
             "value read back equals a fresh computation, and each tenant stayed within its budget after every "
             "step (asserted).", "", "![tenants](img/tenants.png)", "",
             "| tenant | evictions | recomputations | peak resident | budget at the end |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, st in stats.items():
        lines.append(f"| {name} | {st.evictions} | {st.rematerializations} | {st.peak_bytes / KB:.0f} KiB | "
                     f"{(st.budget_bytes or 0) / KB:.0f} KiB |")
    (out / "tenants.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'tenants.md'} and {out / 'img' / 'tenants.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
