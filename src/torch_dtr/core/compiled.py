"""The compiled core (the default): the core's own modules compiled with mypyc, for the per-op path's cost.

    TORCH_DTR_CORE=python python train.py     # the interpreted core instead (set before torch_dtr is imported)

# NOTE [ Compiled core ]
#
# 1. What: mypyc compiles the core's typed Python (records, memory, trackers, policies, swap, runtime, feed) into C
#    extension modules; errors.py stays interpreted (exceptions). One definition of every rule: the compiled
#    modules are built from these very files, so the simulator's outcomes cannot drift
#    (``benchmarks/sim_digest.py`` writes byte-identical files with either; tests/core/test_compiled_core.py).
# 2. When: by default (``TORCH_DTR_CORE`` unset or ``compiled`` when ``torch_dtr`` is first imported;
#    ``TORCH_DTR_CORE=python``: the interpreted core). The first import builds it (mypy, setuptools and a C
#    compiler, all but the compiler dependencies of the package; about 20 s on 2 cores) into a cache folder named
#    by a hash of the core's sources, the Python version and mypy's (``TORCH_DTR_CACHE``, else
#    ``~/.cache/torch_dtr``); later imports load it. Where it cannot be built, a warning says why (once per
#    process) and the interpreted core runs: the same decisions, slower.
# 3. How it loads: the cached folder goes first on the core package's ``__path__`` (mypyc's shared support
#    module on ``sys.path``), so ``torch_dtr.core.runtime`` resolves to the compiled module. An edit to a core
#    source changes the hash: a stale build is never loaded.
# 4. What it asks of the core's code: compiled classes take no attribute they do not declare and cannot be
#    patched at run time, and a value that contradicts its annotation raises TypeError: annotations must be
#    true. ``Memory``, ``Tier`` and ``Tracker`` allow interpreted subclasses (the front ends' own).
# 5. What it gains: docs/native.md (the front end's added time per op, the simulator's run time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

MODULES = ("records", "memory", "trackers", "policies", "lifetimes", "swap", "plan", "eviction", "remat", "versions",
           "runtime", "feed")
HERE = Path(__file__).resolve().parent
_SUFFIXES = (".so", ".pyd")


class CompiledCoreUnavailable(RuntimeError):
    """The compiled core could not be built here (no mypy, no C compiler, a compile error)."""


def cache_root() -> Path:
    base = os.environ.get("TORCH_DTR_CACHE")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_dtr"


def _key() -> str:
    h = hashlib.sha256(sys.version.encode())
    for name in (*MODULES, "errors"):
        h.update((HERE / f"{name}.py").read_bytes())
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError as e:
        raise CompiledCoreUnavailable("the compiled core needs mypy (pip install mypy setuptools)") from e
    h.update(mypy_version.encode())
    return h.hexdigest()[:16]


def build() -> Path:
    """The folder of the compiled core, built first if it is not in the cache."""
    out = cache_root() / f"core-{_key()}"
    if (out / "ok").exists():
        return out
    print("torch_dtr: compiling the core with mypyc (once; cached)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "torch_dtr" / "core"
        pkg.mkdir(parents=True)
        (pkg.parent / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        for name in (*MODULES, "errors"):
            shutil.copy(HERE / f"{name}.py", pkg)
        cmd = [sys.executable, "-m", "mypyc", *(f"torch_dtr/core/{m}.py" for m in MODULES)]
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=False)
        if r.returncode:
            tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-4:])
            raise CompiledCoreUnavailable(f"mypyc failed (exit {r.returncode}): {tail[-600:]}")
        stage = out.with_name(f"{out.name}.tmp{os.getpid()}")
        (stage / "core").mkdir(parents=True, exist_ok=True)
        for f in Path(tmp).iterdir():  # mypyc's shared support module
            if f.suffix in _SUFFIXES:
                shutil.copy(f, stage)
        for f in pkg.iterdir():
            if f.suffix in _SUFFIXES:
                shutil.copy(f, stage / "core")
        (stage / "ok").write_text("")
        try:
            stage.rename(out)
        except OSError:  # another process built it first
            shutil.rmtree(stage, ignore_errors=True)
    return out


def activate(package_path: list[str]) -> bool:
    """Put the compiled core first on the core package's path unless ``TORCH_DTR_CORE=python`` (rule 2);
    whether it did."""
    mode = os.environ.get("TORCH_DTR_CORE") or "compiled"
    if mode == "python":
        return False
    if mode != "compiled":
        warnings.warn(f"torch_dtr: TORCH_DTR_CORE={mode!r} is neither 'python' nor 'compiled'; the interpreted core "
                      f"runs", RuntimeWarning, stacklevel=3)
        return False
    try:
        out = build()
    except (CompiledCoreUnavailable, OSError) as e:
        warnings.warn(f"torch_dtr: the compiled core could not be built ({e}); the interpreted core runs (the "
                      f"same decisions, slower per op; TORCH_DTR_CORE=python chooses it without this warning)",
                      RuntimeWarning, stacklevel=3)
        return False
    sys.path.insert(0, str(out))
    package_path.insert(0, str(out / "core"))
    return True


def is_compiled() -> bool:
    """Whether the running core is the compiled one."""
    from . import runtime

    return Path(runtime.__file__).suffix in _SUFFIXES
