"""The import graph follows the layers of docs/architecture.md (checked from the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import hps

ROOT = Path(hps.__file__).parent

LEAVES = {
    "hps.errors", "hps.types", "hps.config", "hps.validate", "hps.index", "hps.dedup",
    "hps.net", "hps.storage", "hps.cache", "hps.io.sparse_model", "hps.io.npy",
    "hps.io.keyset", "hps.io.frequency", "hps.io.progress",
}  # fmt: skip
ABOVE = {"hps.build", "hps.lookup", "hps.triton", "hps.updates", "hps.service", "hps.startup"}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[_module(path)] = {m for m in found if m == "hps" or m.startswith("hps.")}
    return graph


def _within(module: str, group: set[str]) -> str | None:
    return next((g for g in group if module == g or module.startswith(g + ".")), None)


def test_leaf_packages_import_nothing_above_them() -> None:
    bad = [
        f"{mod} -> {dep}"
        for mod, deps in _imports().items()
        if _within(mod, LEAVES)
        for dep in deps
        if _within(dep, ABOVE)
    ]
    assert bad == []


def test_no_cycle_between_packages() -> None:
    def package(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2])

    edges: dict[str, set[str]] = {}
    for mod, deps in _imports().items():
        for dep in deps:
            if package(dep) != package(mod):
                edges.setdefault(package(mod), set()).add(package(dep))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(p for p in edges if reaches(p, p, {p}))
    assert cycles == []
