"""Where a training step's host time goes, per phase: forward, backward, the optimizer's step, each timed to a
device synchronization, for plain PyTorch, a do-nothing dispatch mode and the native front end at no budget
(both cores where the compiled one builds), each contender in its own process. On a GPU the backward runs on
autograd's device thread, which the CPU machines never exercise; this says whether the native front end's extra
time over the mode sits there. Also the kernel's counters per step (core calls, misses of its caches).

    PYTHONPATH=src python benchmarks/experiments/native/step_split.py [cpu|cuda] [WORKLOAD ...] [--size quick]
        [--profile]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CONTENDERS = ("plain", "mode", "native", "native-compiled")


def one(device: str, name: str, size_name: str, who: str, steps: int = 6) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_dtr.bench import workloads

    class Noop(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    size = workloads.SIZES[name][size_name]
    model, batches, _ = workloads.build(name, size, steps)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [tuple(t.to(device) for t in b) if isinstance(b, tuple) else b.to(device) for b in batches]

    def forward(b):
        if name.startswith("gpt2"):
            return model(input_ids=b, labels=b).loss
        if name == "resnet50":
            return model(pixel_values=b[0], labels=b[1]).loss
        return torch.nn.functional.cross_entropy(model(b[0]), b[1])

    native = None
    if who.startswith("native"):
        from torch_dtr import native as native_mod

        native = native_mod
        native.enable(None)
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    counters = []
    prof = None
    for i, b in enumerate(batches):
        torch.manual_seed(100 + i)
        if who.endswith("profiled") and i == 1:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        sync()
        c0 = native.stats() if native is not None else {}
        t0 = time.perf_counter()
        with Noop() if who == "mode" else _null():
            loss = forward(b)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        t3 = time.perf_counter()
        if i:  # the first is a warm-up
            for v, dt in zip(phases.values(), (t1 - t0, t2 - t1, t3 - t2), strict=True):
                v.append(dt)
            if native is not None:
                c1 = native.stats()
                counters.append({k: c1[k] - c0.get(k, 0) for k in c1 if isinstance(c1[k], int)})
    out = {k: statistics.median(v) * 1e3 for k, v in phases.items()}
    if prof is not None:
        import io
        import pstats

        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        print(f"{name} {who}: {len(batches) - 1} steps profiled\n" + text.getvalue(), file=sys.stderr)
    if counters:
        out["per_step"] = {k: statistics.median(c[k] for c in counters) for k in counters[0]}
    if native is not None:
        from torch_dtr.core.compiled import is_compiled

        out["compiled_core"] = is_compiled()
        native.disable()
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--one" in sys.argv:
        device, name, size_name, who = args
        print(json.dumps(one(device, name, size_name, who)))
        return
    size_name = sys.argv[sys.argv.index("--size") + 1] if "--size" in sys.argv else "full"
    if "--size" in sys.argv:
        args.remove(size_name)
    device = args[0] if args else "cpu"
    names = args[1:] or ["gpt2", "resnet50", "lstm"]
    contenders = CONTENDERS + (("native-profiled",) if "--profile" in sys.argv else ())
    results: dict = {}
    for name in names:
        for who in contenders:
            env = dict(os.environ)
            if who == "native-compiled":
                env["TORCH_DTR_CORE"] = "compiled"
            r = subprocess.run([sys.executable, __file__, device, name, size_name, who, "--one"], env=env,
                               capture_output=True, text=True, timeout=600)
            try:
                results.setdefault(name, {})[who] = json.loads(r.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                results.setdefault(name, {})[who] = {"error": r.stderr[-400:]}
            if who.endswith("profiled"):
                print(r.stderr[-6000:], flush=True)
            row = results[name][who]
            print(f"{name:9s} {who:16s} " + ("  ".join(f"{k} {row[k]:7.2f} ms" for k in ("forward", "backward",
                  "optimizer") if k in row) or row.get("error", "")), flush=True)
            if "per_step" in row:
                print("    per step: " + json.dumps(row["per_step"]), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"step-split-{device}.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
