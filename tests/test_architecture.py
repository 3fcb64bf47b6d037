"""Layering: the domain library (registry/) never imports a web or metrics framework, nor service/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = frozenset({"service", "fastapi", "starlette", "uvicorn", "prometheus_client", "mcp"})


def forbidden_imports(source: str, filename: str = "<source>") -> list[str]:
    """Top-level modules from FORBIDDEN that ``source`` imports, anywhere (functions included)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in FORBIDDEN]
    return found


def test_the_checker_sees_every_import_form():
    source = (
        "import os\nimport fastapi.routing as r\nfrom service.app import create_app\n"
        "def f():\n    from prometheus_client import Counter\n    import starlette, uvicorn\n"
        "from registry.writes.engine import ShortlistEngine\nfrom servicex import y\n"
    )
    assert forbidden_imports(source) == [
        "fastapi.routing", "service.app", "prometheus_client", "starlette", "uvicorn"
    ]


def test_registry_imports_no_web_layer():
    files = sorted((ROOT / "registry").rglob("*.py"))
    assert len(files) > 20 and ROOT / "registry" / "core.py" in files
    offenders = {
        str(path.relative_to(ROOT)): names
        for path in files
        if (names := forbidden_imports(path.read_text(encoding="utf-8"), str(path)))
    }
    assert offenders == {}
