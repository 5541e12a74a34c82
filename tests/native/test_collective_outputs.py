"""Outputs of functional collectives under the compiled front end are never recomputed.

``_c10d_functional``'s ops (and DTensor's ``_dtensor.shard_dim_alltoall``) have CompositeExplicitAutograd
kernels, which serve PrivateUse1 as well: their composite allocates the output from a managed input
(``new_empty``, ``clone``, ``empty_like``: a managed value whose recipe is that allocation) and the collective
writes into it where no op shows it. Before front.cpp's ``collective_kernel`` such a value, evicted and
recomputed, was garbage (all-to-all) or the unreduced input (all-reduce), silently: found through dtp's follower,
whose all-to-all gave wrong gradients once torch-dtr evicted. Now the kernel pins what these ops return. One
process, a gloo group of one rank (an all-to-all of one rank copies), in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from torch_dtr import native

pytestmark = [pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here"),
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")]

_SETUP = """
import json, os, socket, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
import torch.distributed._functional_collectives as funcol
import torch_dtr
from torch_dtr import native
G = dist.group.WORLD
"""


def _run(body: str) -> dict:
    code = _SETUP + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_an_all_to_all_output_is_never_recomputed_from_its_empty_buffer():
    """16 blocks each read an all-to-all's output; at 4 MB (about 0.6 of the peak) the runtime evicts around the
    pinned outputs, and the gradients are plain's bitwise (before the fix they were not)."""
    out = _run("""
        torch.manual_seed(0)
        lin, ln, x0 = torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.randn(64, 256)

        def grads(budget):
            if budget is not None:
                native.enable(budget)
            try:
                outs = []
                for k in range(16):
                    h = torch.tanh(lin(x0 * (k + 1)))
                    with torch.no_grad():
                        y = funcol.wait_tensor(funcol.all_to_all_single(h.contiguous(), None, None, G))
                    outs.append(ln(y) * h)
                sum(o.sum() for o in outs).backward()
                g = torch_dtr.unwrap(lin.weight.grad).clone()
                lin.weight.grad = None
                ev = torch_dtr.stats().evictions if budget is not None else 0
                return g, ev, ""
            except torch_dtr.BudgetError as e:
                return None, 0, str(e)[:200]
            finally:
                if budget is not None:
                    native.disable()

        ref, _, _ = grads(None)
        g, ev, err = grads(4_000_000)
        print(json.dumps({"equal": g is not None and bool(torch.equal(ref, g)), "evictions": ev, "error": err}))
    """)
    assert not out["error"] and out["evictions"] > 0 and out["equal"], out


def test_what_a_collective_writes_is_pinned():
    """The core may not recompute a collective's output by running the allocation of its buffer again: pinned."""
    out = _run("""
        ext = native.load()
        native.enable(None)
        lin = torch.nn.Linear(8, 8)
        h = torch.tanh(lin(torch.randn(4, 8)))
        group = funcol._group_or_group_name(G)
        made = {
            "all_to_all_single": lambda: funcol.all_to_all_single(h.contiguous(), None, None, G),
            "all_reduce": lambda: funcol.all_reduce(h, "sum", G),
            "broadcast": lambda: funcol.broadcast(h, 0, G),
            "shard_dim_alltoall": lambda: torch.ops._dtensor.shard_dim_alltoall(h, 0, 1, group),
        }
        recipes = {}
        for name, f in made.items():
            y = funcol.wait_tensor(f())
            y = getattr(y, "elem", y)
            st = ext.storage_of(y) if ext.is_managed(y) else None
            recipes[name] = None if st is None or st.op is None or st.pinned else st.op.name
        native.disable()
        print(json.dumps(recipes))
    """)
    assert all(r is None for r in out.values()), out
