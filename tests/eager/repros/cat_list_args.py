"""(Fixed during the writing of test_equivalence.py; kept as a regression check.)

Ops whose tensor arguments all sit inside a list (aten::cat, aten::stack) recursed forever:
``Front.scan`` only descended into a list/tuple holding a Tensor *directly*, and the top-level args tuple
``([a, b], 0)`` holds a list, so the managed tensors inside were never replaced by Refs; the op then ran
on DTRTensors, re-entered ``DTRTensor.__torch_dispatch__`` -> ``Front.run`` -> ... -> RecursionError.

Run: python tests/eager/repros/cat_list_args.py   (exit 1 while the bug is present)
"""

import sys

import torch

import torch_dtr


def main() -> bool:
    w = torch.randn(3, requires_grad=True)
    torch_dtr.enable(budget=None)
    try:
        a = w * 2  # managed
        y = torch.stack([torch.cat([a, a]), torch.cat([a, a])])
        ok = torch.equal(torch_dtr.unwrap(y), (w.detach() * 2).repeat(2).expand(2, 6))
    except RecursionError as e:
        print("BUG: RecursionError:", e)
        return False
    finally:
        torch_dtr.disable()
    print("OK" if ok else "BUG: wrong value")
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
