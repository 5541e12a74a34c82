"""The framework-agnostic DTR core. It must never import torch (a test checks this)."""

from .memory import Drop, Memory
from .policies import DEFAULT_POLICY, POLICIES, Policy, get_policy, register
from .records import Op, Storage, UFNode
from .runtime import BudgetError, InternalError, Runtime, Stats, fmt_bytes

__all__ = [
    "DEFAULT_POLICY", "POLICIES", "BudgetError", "Drop", "InternalError", "Memory", "Op", "Policy",
    "Runtime", "Stats", "Storage", "UFNode", "fmt_bytes", "get_policy", "register",
]
