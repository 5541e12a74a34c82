"""A BudgetError raised while a constant is being registered leaves the front end inconsistent.

``Front.constant`` installs the weakref death callback and ``const_ids[id(c)]`` *before*
``rt.add_constant`` (which calls ``reserve`` and may raise ``BudgetError``), and sets ``const_keys[key]``
only after it. When ``add_constant`` raises, ``const_keys`` has no entry for that storage, so when the
constant later dies its callback's ``drain`` raises ``KeyError`` in ``self.const_keys[key] - 1``
("Exception ignored in: <function Front.constant.<locals>.died ...>") and the rest of that drain is lost.

Run: python tests/eager/repros/constant_after_budget_error.py   (exit 1 while the bug is present)
"""

import gc
import sys

import torch

import torch_dtr


def main() -> bool:
    errors = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: errors.append(u.exc_value)
    try:
        w = torch.randn(256, 256, requires_grad=True)  # a 256 KiB constant
        torch_dtr.enable(budget=100_000)  # smaller than the constant itself
        try:
            try:
                (w * 2).sum()
                print("no BudgetError?")
            except torch_dtr.BudgetError as e:
                print("BudgetError as expected:", str(e)[:60], "...")
            del w
            gc.collect()
        finally:
            torch_dtr.disable()
    finally:
        sys.unraisablehook = old_hook
    print("errors raised in callbacks:", [f"{type(e).__name__}: {e}" for e in errors] or "none")
    return not errors


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
