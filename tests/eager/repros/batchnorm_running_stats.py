"""Rematerializing a training-mode BatchNorm output updates the running statistics a second time.

On CPU, ``nn.BatchNorm2d`` reaches the dispatch mode as ``aten::native_batch_norm``, whose schema does not
mark ``running_mean``/``running_var`` as written and whose kernel does not bump their version counters.
``Front._run_locked`` only puts a constant into the recipe's ``scratch`` set (NOTE [ In-place mutation ] 4)
when its ``_version`` changed during the op, so the recipe keeps the real buffers and every replay applies
the momentum update to them again. Losses and gradients stay exact (training mode does not read the
running statistics); the buffers drift.

Run: python tests/eager/repros/batchnorm_running_stats.py   (exit 1 while the bug is present)
"""

import sys

import torch
import torch.nn as nn

import torch_dtr


def program(bn, x):
    y = bn(x * 1.0)  # x requires grad -> managed; native_batch_norm writes bn.running_*
    if torch_dtr.enabled():
        rt = torch_dtr.runtime()
        for s in list(rt.candidates):  # evict everything evictable
            if not s.locks:
                rt.evict(s)
    return (y * y).sum()  # reads y -> rematerializes native_batch_norm


def main() -> bool:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    ref, got = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    v0 = got.running_mean._version
    program(ref, x).backward()
    torch_dtr.enable(budget=None)
    try:
        program(got, x).backward()
        remats = torch_dtr.stats().rematerializations
    finally:
        torch_dtr.disable()
    print("rematerializations:", remats, "| running_mean version:", v0, "->", got.running_mean._version)
    print("plain running_mean:", ref.running_mean)
    print("dtr   running_mean:", got.running_mean)
    ok = torch.equal(ref.running_mean, got.running_mean) and torch.equal(ref.running_var, got.running_var)
    print("OK" if ok else "BUG: running statistics updated again by the rematerialization")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
