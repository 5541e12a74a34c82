"""The house as docs/design.md draws it: core/ at the ground importing nothing of ours, eager/ and sim/ side
by side on it (neither imports the other), tools on top, and no import circle anywhere, function-level
imports included (they are how circles hide)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "torch_dtr"
# layer -> the layers it may import (besides itself); everything not listed is a tool on top
ALLOWED = {"core": set(), "eager": {"core", "deps"}, "sim": {"core", "deps"}, "deps": set()}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _graph() -> dict[str, set[str]]:
    """Module -> the torch_dtr modules it imports (anywhere in its body)."""
    files = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and _type_checking(b.test)
                       for s in b.body for n in ast.walk(s)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from pkg import name` may name a submodule
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in files else target for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_graph_reads_the_package() -> None:
    g = _graph()
    assert "torch_dtr.eager.front" in g and "torch_dtr.core.runtime" in g["torch_dtr.core"]
    assert "torch_dtr.eager.front" in g["torch_dtr.eager.api"]
    assert "torch_dtr.core.lifetimes" in g["torch_dtr.core.runtime"]
    assert "torch_dtr.core.runtime" not in g["torch_dtr.core.lifetimes"], "a type-only import is not an edge"


def test_no_import_circle() -> None:
    g = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(g[m]):
            if state.get(n) == 1:
                cycle = path[path.index(n):] + [n] if n in path else [m, n]
                raise AssertionError(f"import circle: {' -> '.join(cycle)}")
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_layers_import_only_what_is_below_them() -> None:
    bad = []
    for mod, deps in _graph().items():
        layer = _layer(mod)
        if layer not in ALLOWED:
            continue
        for d in deps:
            other = _layer(d)
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{mod} imports {d}")
    assert not bad, "layering broken (core < eager | sim < tools): " + "; ".join(sorted(bad))
