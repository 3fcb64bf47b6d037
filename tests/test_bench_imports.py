"""The benchmark scripts are not run by ``make test`` (they need ../shared data and minutes),
so at least check that every name they import from the project exists: a refactor that
renames a helper must not leave a script that fails after minutes of work."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*(ROOT / "bench").glob("*.py"), *(ROOT / "bench" / "studies").glob("*.py"),
                  *(ROOT / "scripts").glob("*.py")])
PROJECT = ("registry", "service", "bench")


def _project_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` for every ``from <project module> import name``, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in PROJECT
        ):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 10
    assert any(_project_imports(p) for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_script_imports_resolve(script: Path) -> None:
    missing = []
    for module_name, name, line in _project_imports(script):
        module = importlib.import_module(module_name)
        if name != "*" and not hasattr(module, name):
            try:  # a submodule imported by name (from registry.offline import train)
                importlib.import_module(f"{module_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{script.name}:{line}: {module_name}.{name}")
    assert not missing, f"names that no longer exist: {missing}"
