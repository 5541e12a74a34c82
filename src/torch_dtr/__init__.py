"""torch-dtr: Dynamic Tensor Rematerialization for eager PyTorch.

    import torch_dtr
    torch_dtr.enable(budget="3GiB")   # every op from here on is managed
    ...                               # train as usual
    torch_dtr.disable()
"""

from .core import BudgetError, Policy, Stats
from .core.policies import POLICIES, register
from .eager import DTRTensor, budget, disable, enable, enabled, parse_budget, reset_peak, runtime, stats, unwrap

__version__ = "0.1.0"
__all__ = [
    "POLICIES", "BudgetError", "DTRTensor", "Policy", "Stats", "budget", "disable", "enable", "enabled",
    "parse_budget", "register", "reset_peak", "runtime", "stats", "unwrap",
]
