"""A small MLP's forward and backward under the native front end on a device: the check that found the GIL crash.

    python benchmarks/experiments/native/first_op.py [cuda|cpu] [main|thread]
    cuda-gdb -batch -ex run -ex "bt 30" --args python benchmarks/experiments/native/first_op.py cuda main

On an H100 (torch 2.11, Python 3.12, 2026-11-27) it died at the first op (`aten::t` of the first Linear) with a
segmentation fault in `PyObject_Malloc` under the kernel: the kernel built a Python string without the GIL
(docs/decisions.md, 2026-11-27). ``thread`` runs the backward on another thread, as autograd does on CUDA.
"""

from __future__ import annotations

import faulthandler
import sys
import threading

import torch

from torch_dtr import native


def main() -> int:
    faulthandler.enable()
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    mode = sys.argv[2] if len(sys.argv) > 2 else "main"
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    x = torch.randn(16, 64, device=dev)
    want = m(x).sum()
    want.backward()
    grad = m[0].weight.grad.clone()
    m.zero_grad()
    native.enable(None)
    try:
        y = m(x).sum()
        print("forward ok", flush=True)
        if mode == "thread":
            t = threading.Thread(target=y.backward)
            t.start()
            t.join()
        else:
            y.backward()
        print("backward ok", flush=True)
    finally:
        native.disable()
    same = torch.equal(y.detach(), want.detach()) and torch.equal(m[0].weight.grad, grad)
    print(f"bitwise equal to plain: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
