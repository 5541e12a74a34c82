"""The PyTorch front end: a dispatch mode and a wrapper tensor that drive the core runtime."""

from .api import budget, disable, enable, enabled, listen, parse_budget, peek, reset_peak, runtime, stats, unwrap
from .recipe import ConstantChangedError
from .tensor import DTRTensor

__all__ = ["ConstantChangedError", "DTRTensor", "budget", "disable", "enable", "enabled", "listen", "parse_budget",
           "peek", "reset_peak", "runtime", "stats", "unwrap"]
