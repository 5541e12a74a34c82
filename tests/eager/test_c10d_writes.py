"""What c10d's in-place collectives write into a managed tensor is kept, never recomputed from before the write.

``dist.all_reduce(t)``, ``dist.broadcast(t)``, ``dist.all_gather(outs, t)`` and the rest run c10d's ops
(``c10d::allreduce_``, ...), whose schemas do not mark the tensors they write. Until 2026-11-30 both front ends took
them for reads: a managed tensor a collective had written kept the recipe of what it was before (an ``empty_like``
buffer, the local value before the sum) and, evicted, came back as that, silently. Found through
``DTensor``'s ``distribute_tensor``, which scatters into an ``empty_like`` buffer. Now the first argument of
c10d's in-place ops counts as written (``eager/funcinfo.py``, ``native/front.cpp``): the value is pinned.

Two gloo ranks in a subprocess, under ``torch_dtr.enable(budget)`` at a budget that evicts; the same checks
without torch-dtr first, which must pass whatever the budget does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

_SCRIPT = textwrap.dedent("""
    import json, socket, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

    def checks(rank, world, managed):
        import torch_dtr
        base = torch.arange(16384.0) + 1
        want_b = base.clone()
        want_s = sum((base + r * 0.5) * 2 for r in range(world))
        want_g = [(base + r * 0.5) * 3 for r in range(world)]
        if managed:
            torch_dtr.enable(budget=1 << 20)
        try:
            with torch.no_grad():  # (ops on plain tensors are managed under no_grad: NOTE [ Managed vs constant ] 5)
                x = base + rank * 0.5
                b = torch.empty_like(x)  # every rank's buffer; rank 0's value goes to all
                if rank == 0:
                    b.copy_(x)
                dist.broadcast(b, src=0)
                s = x * 2  # the local value; summed over the ranks in place (a logged loss, averaged)
                dist.all_reduce(s)
                gathered = [torch.empty_like(x) for _ in range(world)]
                dist.all_gather(gathered, x * 3)
                ballast = [x * k for k in range(24)]  # 1.5 MiB made after: what was written is evicted, if anything
                sums = [float(t.sum()) for t in ballast]
                got = {"broadcast": bool(torch.equal(torch_dtr.unwrap(b), want_b)),
                       "all_reduce": bool(torch.equal(torch_dtr.unwrap(s), want_s)),
                       "all_gather": all(bool(torch.equal(torch_dtr.unwrap(g), w)) for g, w in zip(gathered, want_g)),
                       "ballast": sums == [float(t.sum()) for t in ballast]}
            got["evictions"] = torch_dtr.stats().evictions if managed else 0
            return got
        finally:
            torch_dtr.disable()

    def rank_main(rank, world, port, q):
        import datetime
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        try:
            q.put({"rank": rank, "plain": checks(rank, world, False), "managed": checks(rank, world, True)})
        except Exception as e:  # said, so that the test shows what failed on which rank
            q.put({"rank": rank, "error": f"{type(e).__name__}: {str(e)[:600]}"})
        dist.destroy_process_group()

    if __name__ == "__main__":
        world = 2
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, world, port, q)) for r in range(world)]
        for p in procs:
            p.start()
        out = sorted((q.get(timeout=180) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join(timeout=60)
        print(json.dumps(out))
""")


def test_what_in_place_collectives_write_survives_eviction(tmp_path):
    script = tmp_path / "c10d_writes.py"
    script.write_text(_SCRIPT)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in json.loads(p.stdout.strip().splitlines()[-1]):
        assert "error" not in r, r
        assert all(r["plain"][k] for k in ("broadcast", "all_reduce", "all_gather", "ballast")), r
        m = r["managed"]
        assert m["evictions"] > 0, r
        assert m["broadcast"] and m["all_reduce"] and m["all_gather"] and m["ballast"], r
