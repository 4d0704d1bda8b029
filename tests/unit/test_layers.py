"""The import graph follows the layers of docs/architecture.md (checked from the source)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import hps

ROOT = Path(hps.__file__).parent

LEAVES = {
    "hps.errors", "hps.types", "hps.config", "hps.validate", "hps.index", "hps.dedup",
    "hps.net", "hps.storage", "hps.cache", "hps.io", "hps.jit",
}  # fmt: skip
ABOVE = {
    "hps.build", "hps.lookup", "hps.tiers", "hps.topology", "hps.startup", "hps.plan",
    "hps.versions",
    "hps.loading", "hps.ctr", "hps.triton", "hps.updates", "hps.service", "hps.commands",
    "hps.bench", "hps.loadtest", "hps.cli",
}  # fmt: skip
# What the file formats (hps/io) may import of ours: nothing but these, below them.
IO_BELOW = {"hps.errors", "hps.types", "hps.config", "hps.io"}
STORAGE = "hps.storage"  # the backends, their interface and the factory that opens them
TIERS = "hps.tiers"  # the one way below L1
# Benchmarks of a backend itself (no tier above it to measure): they may hold one directly.
BACKEND_BENCHES = {"hps.bench.storage", "hps.bench.shm", "hps.bench.updates", "hps.bench.memory"}
MODEL = "hps.triton.model"  # runs inside Triton's Python stub
SUPERVISOR = "hps.triton.supervisor"  # what `hps serve` runs
CLIENT = "hps.triton.client"  # runs in whoever talks to Triton
PB_UTILS = "triton_python_backend_utils"  # exists only inside Triton's Python stub


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_imports() -> dict[str, set[str]]:
    """Module -> every module it imports (absolute imports, TYPE_CHECKING and lazy ones
    included), the model templates under hps/triton/model/templates/ too."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[_module(path)] = found
    return graph


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    return {
        mod: {m for m in deps if m == "hps" or m.startswith("hps.")}
        for mod, deps in _all_imports().items()
    }


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


def test_io_formats_import_nothing_of_ours_above_them() -> None:
    bad = [
        f"{mod} -> {dep}"
        for mod, deps in _imports().items()
        if _within(mod, {"hps.io"})
        for dep in deps
        if not _within(dep, IO_BELOW)
    ]
    assert bad == []


def _crossing(importer: str, imported: str) -> list[str]:
    return [
        f"{mod} -> {dep}"
        for mod, deps in _imports().items()
        if _within(mod, {importer})
        for dep in deps
        if _within(dep, {imported})
    ]


def test_nothing_but_tiers_imports_a_store_backend() -> None:
    """Every read or write below L1 goes through hps.tiers (a RowStore): only the storage
    package itself, hps.tiers and the backends' own benchmarks import hps.storage."""
    importers = {m for m, deps in _imports().items() if any(_within(d, {STORAGE}) for d in deps)}
    assert TIERS in importers, "hps.tiers opens the stores (the check would be vacuous)"
    allowed = {STORAGE, TIERS, *BACKEND_BENCHES}
    assert sorted(m for m in importers if not _within(m, allowed)) == []


def test_the_model_process_does_not_import_the_supervisor() -> None:
    assert _crossing(MODEL, SUPERVISOR) == []


def test_the_supervisor_does_not_import_the_model_process() -> None:
    assert _crossing(SUPERVISOR, MODEL) == []


def test_the_client_imports_neither_the_model_process_nor_the_supervisor() -> None:
    assert _crossing(CLIENT, MODEL) + _crossing(CLIENT, SUPERVISOR) == []


def test_only_the_model_package_imports_triton_python_backend_utils() -> None:
    importers = {
        mod
        for mod, deps in _all_imports().items()
        if any(d == PB_UTILS or d.startswith(PB_UTILS + ".") for d in deps)
    }
    assert importers, "the model process must import it (the check would be vacuous)"
    assert sorted(m for m in importers if not _within(m, {MODEL})) == []


def test_serving_without_the_redis_extra_imports_no_redis() -> None:
    """The serve extra has no redis-py: what `hps serve`, imports and versions load must not
    import it before a Redis L2 is configured (the wheel test's `hps serve` once died so)."""
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import hps.triton.supervisor.serve, hps.versions.rollout, hps.versions.models\n"
        "import hps.loading.imports, hps.commands.versions\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
