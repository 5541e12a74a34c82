"""The framework-agnostic DTR core. It must never import torch (a test checks this)."""

# ruff: noqa: E402  (the compiled core, if asked for, is put on the path before the modules are imported)

from .compiled import activate as _activate

COMPILED = _activate(__path__)  # the same modules, compiled, unless TORCH_DTR_CORE=python (NOTE [ Compiled core ])

from .errors import BudgetError, ConstantChangedError, InternalError, fmt_bytes
from .memory import Drop, Memory
from .policies import DEFAULT_POLICY, POLICIES, Policy, get_policy, register
from .records import Op, Storage
from .runtime import Listener, Runtime, Stats
from .swap import Tier
from .trackers import TRACKERS, Chain, Tracker, UFNode, register_tracker

__all__ = [
    "DEFAULT_POLICY", "POLICIES", "TRACKERS", "BudgetError", "Chain", "ConstantChangedError", "Drop", "InternalError",
    "Listener", "Memory", "Op", "Policy", "Runtime", "Stats", "Storage", "Tier", "Tracker", "UFNode", "fmt_bytes",
    "get_policy", "register", "register_tracker",
]
