"""Optional dependencies: import one, or fail with one line that names the extra to install.

The package needs only torch (and the simulator not even that). Each extra in ``pyproject.toml`` brings
what one command needs; a command that lacks it stops with ``MissingDependency``, whose message is the
whole story (the CLI prints it alone, without a traceback).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# extra -> what it is for (the extras themselves are declared in pyproject.toml)
EXTRAS = {
    "sim": "the simulator's exact baseline and plots (scipy, numpy, matplotlib, tqdm)",
    "bench": "the demo and the benchmarks (transformers, matplotlib, tqdm)",
}


class MissingDependency(ImportError):
    """An optional dependency of the command being run is not installed."""


def need(module: str, extra: str, what: str) -> ModuleType:
    """``import module``, or raise ``MissingDependency`` saying that ``what`` needs ``pip install torch-dtr[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise MissingDependency(
            f"torch_dtr: {what} needs {top!r}, which is not installed ({e}); install it with "
            f"pip install \"torch-dtr[{extra}]\" (or pip install -e \".[{extra}]\" from a checkout)"
        ) from None


def need_all(modules: tuple[str, ...], extra: str, what: str) -> None:
    """Check up front that every module a command will import is installed (``need`` for each)."""
    for m in modules:
        need(m, extra, what)
