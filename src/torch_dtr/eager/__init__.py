"""The PyTorch front end: a dispatch mode and a wrapper tensor that drive the core runtime."""

from .api import budget, disable, enable, enabled, parse_budget, peek, reset_peak, runtime, stats, unwrap
from .tensor import DTRTensor

__all__ = ["DTRTensor", "budget", "disable", "enable", "enabled", "parse_budget", "peek", "reset_peak",
           "runtime", "stats", "unwrap"]
