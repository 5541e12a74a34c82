"""(Fixed during the writing of test_equivalence.py; kept as a regression check.)

An op that aliases a managed input without saying so in its schema (aten::_unsafe_view, which matmul and
linear emit for 3-D inputs) crashed in ``Front._run_locked``: ``geometry(o, r.storage.payload or o)``
evaluated ``bool(Tensor)`` -> "Boolean value of Tensor with more than one value is ambiguous" (and for a
one-element payload it silently chose a geometry from the tensor's *value*).

Run: python tests/eager/repros/unsafe_view_truthiness.py   (exit 1 while the bug is present)
"""

import sys

import torch

import torch_dtr


def main() -> bool:
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 3, 4)
    ref = torch.matmul(x, w).detach()
    torch_dtr.enable(budget=None)
    try:
        y = torch.matmul(x, w)  # aten::mm on a (6, 4) view, then aten::_unsafe_view back to (2, 3, 4)
        ok = torch.equal(torch_dtr.unwrap(y), ref)
    except RuntimeError as e:
        print("BUG:", e)
        return False
    finally:
        torch_dtr.disable()
    print("OK" if ok else "BUG: wrong value")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
