"""The PyTorch front end: a dispatch mode and a wrapper tensor that drive the core runtime."""

from ..core.errors import ConstantChangedError
from .api import (
                  attach,
                  budget,
                  disable,
                  enable,
                  enabled,
                  listen,
                  parse_budget,
                  peek,
                  reset_peak,
                  runtime,
                  stats,
                  tenant,
                  unwrap,
)
from .device import CudaDevice, Device
from .tensor import DTRTensor

__all__ = ["ConstantChangedError", "CudaDevice", "DTRTensor", "Device", "attach", "budget",
           "disable", "enable", "enabled", "listen", "parse_budget", "peek", "reset_peak", "runtime", "stats", "tenant",
           "unwrap"]
