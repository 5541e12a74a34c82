"""torch_dtr.core must import and work without torch (its package docstring promises it)."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys
import textwrap

# located without importing the package (find_spec of a top-level name does not run its __init__)
_spec = importlib.util.find_spec("torch_dtr")
assert _spec is not None and _spec.submodule_search_locations
CORE_DIR = pathlib.Path(list(_spec.submodule_search_locations)[0]) / "core"

BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test (import of {name!r})")
            return None

    sys.meta_path.insert(0, BlockTorch())
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        del sys.modules[name]
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_blocker_really_blocks_torch() -> None:
    # guards the test below: if the blocker did nothing, importing the core would prove nothing
    p = _run("import torch\n")
    assert p.returncode != 0
    assert "torch is blocked in this test" in p.stderr


def test_core_imports_and_runs_without_torch() -> None:
    # Regression (was a bug): torch_dtr/__init__.py imports torch_dtr.eager (and so torch) eagerly, so
    # `import torch_dtr.core` fails whenever torch cannot be imported. Fails until the package
    # __init__ stops importing torch at import time (e.g. a lazy module __getattr__).
    p = _run(
        """
        import torch_dtr.core as core
        rt = core.Runtime(64, policy="dtr_eq")
        c = rt.output(None, 8, 1); rt.add_ref(c)
        rt.reserve(8)
        op = rt.ran([c], 1.0, lambda: [c.payload + 1])
        s = rt.output(op, 8, 2); rt.add_ref(s)
        rt.evict(s)
        rt.rematerialize(s)
        assert s.payload == 2
        rt.check()
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("CORE-OK")
        """
    )
    assert p.returncode == 0, p.stderr
    assert "CORE-OK" in p.stdout


def test_core_sources_do_not_import_torch() -> None:
    # a static check of every module of the core, independent of the package __init__
    files = sorted(CORE_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "records.py", "policies.py", "memory.py", "runtime.py"}
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
                if node.level > 1:  # `from .. import x` reaches outside the core
                    names = [f"..{node.module or ''}"]
            else:
                continue
            for n in names:
                assert n.split(".")[0] != "torch", f"{f.name} imports {n}"
                assert not n.startswith(".."), f"{f.name} imports {n} from outside torch_dtr.core"


def test_simulator_imports_and_replays_without_torch() -> None:
    # the simulator (every module of torch_dtr.sim) drives the same core and must not need torch
    p = _run(
        """
        import importlib, pkgutil
        import torch_dtr.sim
        mods = [m.name for m in pkgutil.iter_modules(torch_dtr.sim.__path__)]
        assert {"baselines", "chains", "checkmate", "command", "log", "replay"} <= set(mods), mods
        for m in mods:
            importlib.import_module(f"torch_dtr.sim.{m}")
        from torch_dtr.sim import chains, replay
        out = replay.simulate(chains.linear_chain(100), budget=20)
        assert out.status == "ok" and out.rematerializations > 0, out
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("SIM-OK")
        """
    )
    assert p.returncode == 0, p.stderr
    assert "SIM-OK" in p.stdout
