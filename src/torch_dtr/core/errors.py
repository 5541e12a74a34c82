"""The core's exceptions and the byte formatting its messages use."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from typing import Any


class BudgetError(RuntimeError):
    """The budget cannot be kept: everything that could be evicted has been, and the op still does not fit.
    ``budget``: the one budget the message suggests trying (bytes), or None."""

    def __init__(self, message: str = "", budget: int | None = None) -> None:
        super().__init__(message)
        self.budget = budget

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.budget)

# how a BudgetError says to raise the budget (``Runtime.fix``: a front end puts its own calls there; {n}: bytes)
FIX = "torch_dtr.enable(budget={n}), or `with torch_dtr.budget({n}):` for a scope inside a running session"

# ``Runtime.advise``: given the budget a BudgetError would suggest, a better one for the whole program and why (a
# front end that traced the program: NOTE [ Learned budgets ] in native/session.py), or None
Advise = Callable[[int], tuple[int, str] | None]


def suggest(need: float, fix: str = FIX, advise: Advise | None = None) -> tuple[int, str]:
    """The one budget a ``BudgetError`` suggests (its ``budget``) and the sentence that says so: 10% above ``need``
    (never below the floor), or what ``advise`` returns for it."""
    n, why = math.ceil(need * 1.1), "10% above what this op needs; it covers the program up to here only"
    better = advise(n) if advise is not None else None
    if better is not None:
        n, why = better
    return n, f"Budget to try: {fmt_bytes(n)} ({n} B; {why}): {fix.format(n=n)}."


class ConstantChangedError(RuntimeError):
    """A value cannot be recomputed any more: something its recipe read (a constant) changed after the value
    was evicted, in a way the front end did not see in advance (NOTE [ Changed inputs ])."""


class InternalError(AssertionError):
    """A bug in torch_dtr (never the user's mistake). Please report it with the message."""


def internal_assert(cond: bool, msg: str) -> None:
    if not cond:
        raise InternalError(f"torch_dtr internal error: {msg}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BUDGET_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_budget(budget: int | str | None) -> int | None:
    """Bytes from an int or a string like ``"512MB"``, ``"3GiB"``, ``"1.5 GB"`` (KB/MB/GB: powers of 1000,
    KiB/MiB/GiB: powers of 1024, case-insensitive). ``None`` means unlimited."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise ValueError(f"torch_dtr: budget must be bytes (int) or a size string like '3GiB', got {budget!r}")
    if isinstance(budget, numbers.Integral):  # int, numpy integers
        if budget < 0:
            raise ValueError(f"torch_dtr: budget must be >= 0 bytes, got {budget}; e.g. budget='3GiB'")
        return int(budget)
    if isinstance(budget, str):
        m = _BUDGET_RE.match(budget)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(
        f"torch_dtr: cannot read budget {budget!r}: use bytes (an int) or a number with a unit "
        f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. budget='3GiB' or budget='1.5 GB'"
    )
