"""Packaging: every import is declared in pyproject.toml, optional ones fail with one clear line, and CI runs
exactly the README's commands. (CI itself builds a fresh environment, so a missing declaration fails there
too; these tests say which import it was.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
# distribution name -> import name, where they differ
IMPORT_NAME: dict[str, str] = {}


def _name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m, f"cannot read requirement {req!r}"
    return m.group(1).lower().replace("-", "_")


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """Import names of the core dependencies, and of each extra (self-references such as
    ``torch-dtr[sim,bench]`` resolved)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {IMPORT_NAME.get(_name(r), _name(r)) for r in project["dependencies"]}
    raw = project["optional-dependencies"]

    def resolve(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for r in raw[extra]:
            m = re.match(r"\s*torch-dtr\[([^\]]+)\]", r)
            if m:
                for e in m.group(1).split(","):
                    assert e.strip() not in seen, f"extra {extra!r} includes itself"
                    out |= resolve(e.strip(), seen | {extra})
            else:
                out.add(IMPORT_NAME.get(_name(r), _name(r)))
        return out

    return core, {e: resolve(e) for e in raw}


def _imports(paths: list[Path]) -> dict[str, list[str]]:
    """Top-level modules imported anywhere in ``paths`` (function-level imports too), and where."""
    found: dict[str, list[str]] = {}
    for p in paths:
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for m in mods:
                found.setdefault(m.split(".")[0], []).append(f"{p.relative_to(ROOT)}:{node.lineno}")
    return found


def _needs(paths: list[Path]) -> list[tuple[str, str, str]]:
    """``need("module", "extra", ...)`` calls (torch_dtr/deps.py): (module, extra, where)."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "need" and len(node.args) >= 2
                    and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                out.append((node.args[0].value, node.args[1].value, f"{p.relative_to(ROOT)}:{node.lineno}"))
    return out


def _undeclared(found: dict[str, list[str]], allowed: set[str]) -> dict[str, list[str]]:
    std = set(sys.stdlib_module_names)
    return {m: w for m, w in found.items() if m not in std and m not in allowed}


def test_package_imports_are_declared() -> None:
    core, extras = _declared()
    everything = core.union(*extras.values())
    src = sorted((ROOT / "src" / "torch_dtr").rglob("*.py"))
    bad = _undeclared(_imports(src), everything | {"torch_dtr"})
    assert not bad, f"imports under src/ not declared in pyproject.toml (dependencies or an extra): {bad}"


def test_optional_imports_name_the_extra_that_declares_them() -> None:
    _, extras = _declared()
    files = sorted((ROOT / "src" / "torch_dtr").rglob("*.py"))
    calls = _needs(files)
    assert calls, "no need(...) calls found: the check reads nothing"
    wrong = [(m, e, w) for m, e, w in calls if e not in extras or m.split(".")[0] not in extras[e]]
    assert not wrong, f"need(module, extra) where the extra does not declare the module: {wrong}"


def test_test_and_benchmark_imports_are_declared() -> None:
    core, extras = _declared()
    tests = sorted((ROOT / "tests").rglob("*.py"))
    local = {p.stem for p in tests} | {p.name for p in (ROOT / "tests").rglob("*") if p.is_dir()}
    bad = _undeclared(_imports(tests), core | extras["test"] | local | {"torch_dtr"})
    assert not bad, f"imports under tests/ not declared in the [test] extra: {bad}"
    benches = sorted((ROOT / "benchmarks").rglob("*.py"))
    local |= {p.stem for p in benches}  # benchmarks/experiments import the kept scripts (dispatch)
    bad = _undeclared(_imports(benches), core | extras["bench"] | extras["sim"] | local | {"torch_dtr"})
    assert not bad, f"imports under benchmarks/ not declared in the [bench] or [sim] extras: {bad}"


def test_ci_runs_the_readmes_test_command_in_a_fresh_environment() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = [line.strip() for b in blocks for line in b.splitlines() if line.strip().startswith("pip install")]
    assert len(commands) == 2, f"the README should give exactly two set-up commands, found {commands}"
    test_cmd = next(c for c in commands if "pytest" in c)
    ci_lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert test_cmd in ci_lines, f".ci/run does not run the README's test command {test_cmd!r}"
    assert "python3 -m venv" in ci and "--system-site-packages" not in ci


def test_missing_optional_dependency_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    # a fresh interpreter where matplotlib cannot be imported: `simulate --plot` must say what to install
    log = tmp_path / "tiny.log"  # one constant and one op
    log.write_text("\n".join([
        '{"INSTRUCTION": "CONSTANT", "NAME": "a"}', '{"INSTRUCTION": "MEMORY", "NAME": "a", "MEMORY": "8"}',
        '{"INSTRUCTION": "CALL", "NAME": "relu", "ARGS": ["a"], "RESULT": ["b"], "TIME": "10"}',
        '{"INSTRUCTION": "MEMORY", "NAME": "b", "MEMORY": "8"}', '{"INSTRUCTION": "ALIAS", "NAME": "b", "ALIAS": "-1"}',
    ]) + "\n")
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from torch_dtr.cli import main\n"
            f"sys.exit(main(['simulate', {str(log)!r}, '--ratios', '0.9', '--plot', {str(tmp_path / 'x.png')!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 2, p.stdout[-1000:] + p.stderr[-2000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "matplotlib" in err[0] and 'torch-dtr[sim]' in err[0], err[0]
