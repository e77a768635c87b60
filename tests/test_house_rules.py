"""House rules a review would otherwise have to re-check: every module has its tests (a mirror
file or a line in tests/README.md), no test file outlives its module, no script edits
``sys.path``, and module docstrings stay short, the scripts' with no exception (docs/style.md:
they say why; figures live in benchmarks/results/). Run as a script, it prints the figures these
rules are about: ``python tests/test_house_rules.py``."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
MIRRORED = ("elmo_core", "pipelines", "flows")
DOCUMENTED = ("elmo_core", "pipelines", "flows")
SCRIPTS = ("benchmarks", "infra", "experiments")  # their method lives in their results
LONG_DOCSTRING = 15  # lines
MAX_LONG_DOCSTRINGS = 5
MAX_DOCSTRING_SHARE = 0.03  # of all lines


def _modules(packages: tuple[str, ...]) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


def _docstring_lines(path: Path) -> int:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return len(docstring.splitlines()) if docstring else 0


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _listed(path: str) -> bool:
    return f"`{path}`" in README


def test_every_module_has_its_mirror_test_or_names_its_tests_in_the_readme() -> None:
    unmirrored = []
    for path in _modules(MIRRORED):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        relative = path.relative_to(ROOT)
        mirror = ROOT / "tests" / "unit" / relative.parent / f"test_{path.stem}.py"
        if not mirror.exists() and not _listed(str(relative)):
            unmirrored.append(str(relative))
    assert unmirrored == []


def test_every_test_file_is_named_after_a_module_or_says_what_it_checks() -> None:
    orphans = []
    for test in sorted((ROOT / "tests" / "unit").rglob("test_*.py")):
        relative = test.relative_to(ROOT / "tests" / "unit")
        module = ROOT / relative.parent / test.name.removeprefix("test_")
        if not module.exists() and not _listed(str(test.relative_to(ROOT))):
            orphans.append(str(relative))
    assert orphans == []


def test_the_readme_names_only_paths_that_exist() -> None:
    named = re.findall(r"^\| `([\w/.]+\.py)`", README, flags=re.MULTILINE)
    assert named and [path for path in named if not (ROOT / path).exists()] == []


def test_scripts_import_their_siblings_as_packages_not_through_sys_path() -> None:
    """benchmarks, experiments and infra run as ``python -m`` from the root: a path insert would
    let an import work from one folder only."""
    scripts = _modules(("elmo_core", "pipelines", "flows", "benchmarks", "experiments", "infra"))
    inserts = [p for p in scripts if "sys.path.insert" in p.read_text(encoding="utf-8")]
    assert [str(path.relative_to(ROOT)) for path in inserts] == []


TAG_PREFIX = "elmo."  # every MLflow tag the project writes
TAG_BUILDERS = "pipelines/registry/tags.py"  # score_tag and gain_tag name a task's metric


def _tag_names() -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Each ``elmo.`` tag declared as a module constant (value → (module, name)), and every other
    ``elmo.`` string: a tag typed where its name belongs."""
    declared: dict[str, list[tuple[str, str]]] = {}
    stray = []
    for path in _modules(MIRRORED):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = str(path.relative_to(ROOT))
        constants = set()
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Constant) and str(value.value).startswith(TAG_PREFIX):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    declared.setdefault(value.value, []).append((module, ast.unparse(target)))
                constants.add(id(value))
        for node in ast.walk(tree):
            text = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
            typed = isinstance(text, ast.Constant) and str(text.value).startswith(TAG_PREFIX)
            if typed and id(text) not in constants and module != TAG_BUILDERS:
                stray.append(f"{module}:{node.lineno}: {text.value!r}")
    return declared, stray


def test_mlflow_tags_are_declared_once_and_used_by_name() -> None:
    declared, stray = _tag_names()
    assert stray == []
    assert {value: where for value, where in declared.items() if len(where) > 1} == {}
    names = [name for where in declared.values() for _, name in where]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_module_docstrings_are_short() -> None:
    modules = _modules(DOCUMENTED)
    lines = {path: _docstring_lines(path) for path in modules}
    long = sorted(str(p.relative_to(ROOT)) for p, n in lines.items() if n >= LONG_DOCSTRING)
    total = sum(_lines(path) for path in modules)
    assert len(long) <= MAX_LONG_DOCSTRINGS, long
    assert sum(lines.values()) <= MAX_DOCSTRING_SHARE * total


def test_script_docstrings_are_short_without_exception() -> None:
    """A script's docstring says why it exists, what it compares and how to run it; its method
    and figures go to its dated results file."""
    modules = _modules(SCRIPTS)
    long = [str(p.relative_to(ROOT)) for p in modules if _docstring_lines(p) >= LONG_DOCSTRING]
    assert long == []


def house_figures() -> dict[str, object]:
    """Lines per top-level package, module docstrings (their share, the long ones) and the
    fsspec imports outside elmo_core/location.py."""
    packages = ("elmo_core", "pipelines", "flows", "benchmarks", "infra", "experiments")
    documented = _modules(DOCUMENTED)
    docstrings = {path: _docstring_lines(path) for path in documented}
    fsspec = re.compile(r"^\s*(import fsspec|from fsspec\b)", re.MULTILINE)
    return {
        "lines": {package: sum(map(_lines, _modules((package,)))) for package in packages},
        "docstring_share": round(sum(docstrings.values()) / sum(map(_lines, documented)), 4),
        "long_docstrings": sorted(
            str(p.relative_to(ROOT)) for p, n in docstrings.items() if n >= LONG_DOCSTRING
        ),
        "long_script_docstrings": sorted(
            str(p.relative_to(ROOT))
            for p in _modules(SCRIPTS)
            if _docstring_lines(p) >= LONG_DOCSTRING
        ),
        "fsspec_outside_location": sorted(
            str(path.relative_to(ROOT))
            for path in _modules(DOCUMENTED)
            if path.name != "location.py" and fsspec.search(path.read_text(encoding="utf-8"))
        ),
    }


if __name__ == "__main__":
    print(json.dumps(house_figures(), indent=2))


PATH_LIKE = re.compile(r"`([\w.*/-]+(?:/|\.py|\.yaml|\.md))`")


def test_every_path_readmes_layout_names_exists() -> None:
    """Each path in a row of README's Layout table exists under that row's folder (a file every
    stage package has, such as ``stage.py``, in one of them) or at the repository's root."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    missing = []
    for row in re.findall(r"^\| `([\w/]+)` \| (.+) \|$", layout, flags=re.MULTILINE):
        folder, owns = ROOT / row[0], row[1]
        for path in PATH_LIKE.findall(owns):
            here = [*folder.glob(path), *folder.glob(f"*/{path}"), *ROOT.glob(path)]
            if not here:
                missing.append(f"{row[0]}: {path}")
    assert missing == []
