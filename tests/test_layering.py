"""Guard the one-way layering: flows → pipelines → elmo_core."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "elmo_core": {"ray", "prefect", "mlflow", "pipelines", "flows"},
    "pipelines": {"prefect", "flows"},
}


def _imported_top_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upper_layers(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_modules(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}
