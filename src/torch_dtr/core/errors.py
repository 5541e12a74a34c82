"""The core's exceptions and the byte formatting its messages use."""

from __future__ import annotations


class BudgetError(RuntimeError):
    """The budget cannot be kept: everything that could be evicted has been, and the op still does not fit."""


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
