"""torch-dtr: Dynamic Tensor Rematerialization for eager PyTorch.

    import torch_dtr
    torch_dtr.enable(budget="3GiB")   # every op from here on is managed
    ...                               # train as usual
    torch_dtr.disable()
"""

from .core import BudgetError, InternalError, Policy, Stats
from .core.policies import POLICIES, register

_API = ("Session", "attach", "budget", "disable", "enable", "enabled", "front", "listen", "reset_peak", "runtime",
        "stats", "tenant", "unwrap")
_EAGER = ("ConstantChangedError", "CudaDevice", "DTRTensor", "Device", "parse_budget")


def __getattr__(name: str) -> object:
    # the eager front end imports torch; load it on first use so that ``torch_dtr.core`` (and the
    # simulator) work without torch installed
    if name in _API:  # torch_dtr/api.py: one entry for both front ends (NOTE [ Choosing the front end ])
        from . import api

        return getattr(api, name)
    if name == "native":  # the compiled front end's own module (benchmarks, tests)
        import importlib

        return importlib.import_module(".native", __name__)
    if name == "SimulatedDevice":  # the compiled front end's allocator, which both front ends run on
        from .native.simdevice import SimulatedDevice

        return SimulatedDevice
    if name == "CpuDevice":  # the CPU's tensor memory as a device (NOTE [ The CPU as a device ])
        from .native.cpudevice import CpuDevice

        return CpuDevice
    if name in _EAGER:
        from . import eager

        return getattr(eager, name)
    if name in ("Pool", "Store", "Value"):  # recomputable values of any kind, without torch (torch_dtr.store)
        from . import store

        return getattr(store, name)
    if name == "record":  # torch_dtr.record(path): write an operator log for the simulator
        from .recorder import record

        return record
    raise AttributeError(f"module 'torch_dtr' has no attribute {name!r}")

__version__ = "0.1.0"
__all__ = [
    "POLICIES", "BudgetError", "ConstantChangedError", "CpuDevice", "CudaDevice", "DTRTensor", "Device",
    "SimulatedDevice", "InternalError", "Pool", "Store", "Value", "Policy", "Session", "Stats", "attach",
    "budget", "disable", "enable", "enabled", "front", "listen", "parse_budget", "record", "register", "reset_peak",
    "runtime", "stats", "tenant", "unwrap",
]
