"""Guard the one-way layering (flows → pipelines → elmo_core) and the absence of import cycles.

Imports are read from the source with ``ast``, those inside functions included: a lazy import
that closes a cycle still makes two modules unable to stand alone. Imports under
``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("elmo_core", "pipelines", "flows")
FORBIDDEN = {
    "elmo_core": {"ray", "prefect", "mlflow", "pipelines", "flows"},
    "pipelines": {"prefect", "flows"},
    "flows": {"mlflow", "ray"},
}
# The stages in the order they run, serving (the one biLM loader and the pyfunc models, used by
# most) first: a stage imports only those before it. Chaining them is pipelines.cli's and the
# flows' work.
STAGE_ORDER = ("serving", "prepare", "train", "evaluate", "registry", "adapt", "analyze", "embed")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imported_names(module: str) -> set[str]:
    """Dotted names ``module`` imports at run time."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _names_in(path.read_text(encoding="utf-8"), package)


def _names_in(source: str, package: str) -> set[str]:
    """Dotted names imported by ``source``, a module of ``package`` (for relative imports);
    ``from a import b`` gives ``a`` and ``a.b``, since ``b`` may be a submodule."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _resolve(name: str) -> str | None:
    """The project module ``name`` imports: itself, else its nearest enclosing module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module in MODULES:
        targets = {_resolve(name) for name in _imported_names(module)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _top_level(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upper_layers(package: str) -> None:
    offenders = {
        str(MODULES[module].relative_to(ROOT)): sorted(
            _top_level(_imported_names(module)) & FORBIDDEN[package]
        )
        for module in MODULES
        if module.split(".")[0] == package
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_pipelines_common_and_tracking_import_no_stage() -> None:
    stages = {f"pipelines.{stage}" for stage in STAGE_ORDER}
    offenders = {
        module: sorted(n for n in _imported_names(module) if ".".join(n.split(".")[:2]) in stages)
        for module in MODULES
        if module.startswith(("pipelines.common", "pipelines.tracking"))
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_no_stage_imports_a_later_stage() -> None:
    def stage(module: str) -> int | None:
        parts = module.split(".")
        if parts[0] != "pipelines" or len(parts) < 2 or parts[1] not in STAGE_ORDER:
            return None
        return STAGE_ORDER.index(parts[1])

    graph = _graph()
    against = sorted(
        f"{module} → {target}"
        for module, targets in graph.items()
        for target in targets
        if module.rpartition(".")[2] != "__main__"  # an entry point may start the whole command
        and (here := stage(module)) is not None
        and (there := stage(target)) is not None
        and there > here
    )
    assert against == []


def test_pipelines_package_inits_import_nothing() -> None:
    """Ray workers and prepare's pool import stage modules by path: their packages stay cheap."""
    offenders = [
        module
        for module, path in MODULES.items()
        if module.startswith("pipelines") and path.name == "__init__.py" and _imported_names(module)
    ]
    assert offenders == []


def test_only_location_imports_fsspec() -> None:
    """Storage in one place: every other module reads and writes through elmo_core.location."""
    offenders = sorted(
        module
        for module in MODULES
        if module != "elmo_core.location" and "fsspec" in _top_level(_imported_names(module))
    )
    assert offenders == []


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_sees_lazy_submodule_imports_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pipelines.train import stage\n"
        "def lazy():\n"
        "    from pipelines.common import settings\n"
        "    from . import params\n"
    )
    names = _names_in(source, "flows")
    resolved = {_resolve(name) for name in names}

    assert {"pipelines.common.settings", "flows.params"} <= resolved
    assert "pipelines.train.stage" not in resolved
    assert _resolve("pipelines.common.settings.elmo_home") == "pipelines.common.settings"
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}, "b": set()}
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]
