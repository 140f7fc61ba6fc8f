"""The tree keeps its design: no import cycle, Stage 1 and Stage 2 meet only at the cache contract
and the ground modules, evaluation knows nothing of training, the library imports without the apps.

Imports are read with ``ast`` (function-local ones included), so a lazy import cannot hide a
crossing or a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: modules both stages may import: the cache contract and the small ground modules
SHARED = ("mmcse.cache", "mmcse.errors", "mmcse.registry", "mmcse.hub", "mmcse.devices",
          "mmcse.rundir", "mmcse.pooling", "mmcse.distributed", "mmcse.tiny", "mmcse.logs",
          "mmcse.settings", "mmcse.environment", "mmcse.textfiles", "mmcse.files", "mmcse")  # fmt: skip
#: the top-level modules of ``mmcse/`` that are not ground modules, each with why; every other
#: top-level module is ground (README, Layout: the last line of ``mmcse/``), so a new one is
#: checked from the day it lands (none today: the update moved into mmcse.training, issue 30)
NOT_GROUND: dict[str, str] = {}
#: the lowest layer: what each may import (the run layout knows files, nothing of its users)
LEAVES = {"mmcse.pooling": {"mmcse.errors"}, "mmcse.files": {"mmcse.errors"},
          "mmcse.precision": set(), "mmcse.packing": {"mmcse.errors"}, "mmcse.rundir": {"mmcse.errors", "mmcse.files"}}  # fmt: skip
#: the applications: they may import both stages
APPS = ("cli", "mmcse.commands", "mmcse.bench", "mmcse.demo")


def ground_modules(modules) -> set[str]:
    """The ground modules of Stage 2: the package itself and its top-level modules (each imports
    only ground modules), less :data:`NOT_GROUND`."""
    top = {m for m in modules if m == "mmcse" or (m.startswith("mmcse.") and m.count(".") == 1)}
    packages = {m for m in top if (ROOT / m.replace(".", "/")).is_dir() and m != "mmcse"}
    return top - packages - set(NOT_GROUND)


def module_files() -> dict[str, Path]:
    found = {"cli": ROOT / "cli.py"}
    for base in ("mmcse", "pipeline"):
        for path in (ROOT / base).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def resolve(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (resolve(a.name, known) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}", known) or resolve(base, known)
                if target:
                    found.add(target)
    found.discard(name)
    if path.name == "__init__.py":  # a package re-exporting its own submodules is no cycle
        found = {m for m in found if not m.startswith(name + ".")}
    return found


def in_group(module: str, group: tuple[str, ...]) -> bool:
    return any(module == g or module.startswith(g + ".") for g in group)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_stage1_and_stage2_meet_only_at_the_cache_and_ground_modules(graph):
    crossings = []
    for module, deps in graph.items():
        if in_group(module, APPS):
            continue
        for dep in deps:
            stage1_to_2 = module.startswith("pipeline") and dep.startswith("mmcse")
            if stage1_to_2 and not in_group(dep, SHARED):
                crossings.append(f"{module} -> {dep}")
            if module.startswith("mmcse") and dep.startswith("pipeline"):
                crossings.append(f"{module} -> {dep}")
    assert crossings == []


def test_evaluation_knows_nothing_of_training_recipes_or_reports(graph):
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if in_group(m, ("mmcse.evaluation",))
        for d in deps
        if in_group(d, ("mmcse.training", "mmcse.recipes", "mmcse.reports", "mmcse.bench"))
    ]
    assert bad == []


def test_losses_and_methods_know_nothing_of_training(graph):
    """A method composes losses and declares heads; the trainer runs it, never the other way."""
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if in_group(m, ("mmcse.losses", "mmcse.methods"))
        for d in deps
        if in_group(d, ("mmcse.training", "mmcse.recipes", "mmcse.reports", "mmcse.bench"))
    ]
    assert bad == []


def test_recipes_import_no_report(graph):
    """Reports render what recipes produce (tables, cards), never the reverse: published numbers
    are recipe data (mmcse.recipes.published)."""
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if in_group(m, ("mmcse.recipes",))
        for d in deps
        if in_group(d, ("mmcse.reports",))
    ]
    assert bad == []


def test_ground_modules_import_only_ground_modules(graph):
    ground = ground_modules(graph)
    bad = [
        f"{m} -> {d}" for m, deps in graph.items() if m in ground for d in deps if d not in ground
    ]
    assert bad == []


def test_the_ground_is_every_top_level_module_and_names_the_documented_ones(graph):
    """Derived, so a new top-level module cannot escape the rule; the ones the README names as
    ground (and the leaves) must be among them."""
    ground = ground_modules(graph)
    documented = {"mmcse.errors", "mmcse.registry", "mmcse.settings", "mmcse.hub", "mmcse.model",
                  "mmcse.pooling", "mmcse.precision", "mmcse.devices", "mmcse.distributed",
                  "mmcse.rundir", "mmcse.files", "mmcse.environment", "mmcse.logs",
                  "mmcse.textfiles", "mmcse.tiny", "mmcse.packing", "mmcse.corpusfiles", "mmcse"}  # fmt: skip
    assert documented | set(LEAVES) <= ground
    new_module = {"mmcse", "mmcse.errors", "mmcse.newly_added", "mmcse.training", *NOT_GROUND}
    assert ground_modules(new_module | {"mmcse.training.loop"}) == {
        "mmcse", "mmcse.errors", "mmcse.newly_added"
    }  # fmt: skip


@pytest.mark.parametrize("module", sorted(LEAVES))
def test_the_lowest_modules_import_only_what_lies_below_them(graph, module):
    """pooling is a leaf; the run layout holds no recipe, report or rendering knowledge."""
    assert graph[module] <= LEAVES[module]


def test_the_library_imports_no_app(graph):
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if not in_group(m, APPS)
        for d in deps
        if in_group(d, APPS)
    ]
    assert bad == []


def test_a_crossing_is_found_even_inside_a_function(tmp_path):
    """The walker itself: a function-local import is an import."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pipeline.extract import x\n    return x\n")
    assert imports_of("mmcse.m", module, {"pipeline.extract", "mmcse.m"}) == {"pipeline.extract"}
