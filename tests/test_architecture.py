"""Layering: the domain library (registry/) never imports a web or metrics framework, nor service/;
and no module grows past 400 lines unless it is one concept."""

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
        "from registry.writes.writer import RegistryWriter\nfrom servicex import y\n"
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


# -- the layers inside registry/ ----------------------------------------------------------------


def registry_imports() -> dict[str, set[str]]:
    """``module -> registry modules it imports`` for every module of registry/ (functions and
    ``TYPE_CHECKING`` blocks included: a type-only import still couples the layers)."""
    modules = {}
    for path in sorted((ROOT / "registry").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{name}: relative import"
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer(module: str) -> str:
    """``registry.serving.shortlist`` -> ``registry.serving``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def offenders(source: str, targets: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        module: sorted(d for d in deps if d.startswith(targets))
        for module, deps in registry_imports().items()
        if layer(module) == source and any(d.startswith(targets) for d in deps)
    }


def test_the_query_path_never_imports_training_learning_or_the_write_path():
    assert offenders(
        "registry.serving",
        ("registry.offline", "registry.learning", "registry.writes", "registry.core", "registry.startup",
         "registry.assembly"),
    ) == {}


def test_learning_memory_never_imports_the_core_the_write_path_or_training():
    assert offenders(
        "registry.learning",
        ("registry.core", "registry.startup", "registry.writes", "registry.assembly", "registry.offline"),
    ) == {}


def test_the_write_path_never_imports_the_core_or_training():
    assert offenders(
        "registry.writes", ("registry.core", "registry.startup", "registry.assembly", "registry.offline")
    ) == {}


def test_the_write_path_never_imports_the_query_path():
    """Queries apart from writes: the writer and the runner only share the snapshot map
    (registry.snapshots); whatever a write needed of serving would be handed in by the core."""
    assert offenders("registry.writes", ("registry.serving",)) == {}


def test_the_snapshot_map_sits_below_both_paths():
    graph = registry_imports()
    assert not {d for d in graph["registry.snapshots"] if layer(d) in ("registry.serving", "registry.writes")}


def top_modules_imported(source: str, filename: str = "<source>") -> set[str]:
    """The top-level modules ``source`` imports, anywhere (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_redis_checker_sees_every_import_form():
    source = "import os\ndef f():\n    from redis.cluster import RedisCluster\n"
    assert "redis" in top_modules_imported(source)
    assert "redis" not in top_modules_imported("from registry.store import redis_stores\nimport redisx\n")


def test_only_the_store_package_and_the_assembly_import_redis():
    """One place per backend: a Redis-backed part lives in registry/store/ and is chosen by the
    assembly; nothing else (the web layer included) talks to Redis itself."""
    allowed = ROOT / "registry" / "store"
    files = sorted([*(ROOT / "registry").rglob("*.py"), *(ROOT / "service").rglob("*.py")])
    offenders = sorted(
        str(path.relative_to(ROOT))
        for path in files
        if allowed not in path.parents
        and path != ROOT / "registry" / "assembly.py"
        and "redis" in top_modules_imported(path.read_text(encoding="utf-8"), str(path))
    )
    assert offenders == []
    assert any("redis" in top_modules_imported(p.read_text(encoding="utf-8")) for p in allowed.glob("redis*.py"))


def test_settings_and_the_request_sit_at_the_bottom():
    graph = registry_imports()
    # settings reads the tool parser's limits as its defaults; both stay at the bottom
    assert graph["registry.settings"] <= {"registry.request", "registry.errors", "registry.tool_checks"}
    assert graph["registry.tool_checks"] <= {"registry.errors", "registry.name_checks"}
    assert graph["registry.request"] <= {"registry.errors", "registry.name_checks"}
    assert graph["registry.name_checks"] <= {"registry.errors"}


def test_no_import_cycles_between_the_packages_of_registry():
    graph = registry_imports()
    packages: dict[str, set[str]] = {}
    for module, deps in graph.items():
        packages.setdefault(layer(module), set()).update(layer(d) for d in deps)
    for package, deps in packages.items():
        deps.discard(package)
    assert len(packages) > 10 and "registry.serving" in packages

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in packages.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(p for p in packages if reaches(p, p, {p}))
    assert cycles == []


def test_no_import_cycles_between_modules_of_registry():
    graph = registry_imports()

    def path_back(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = {m: trail for m in graph if (trail := path_back(m)) is not None}
    assert cycles == {}


# -- bench/: scripts share helpers through bench/common.py only -----------------------------------

BENCH = ROOT / "bench"


def bench_scripts() -> list[Path]:
    """The maintained benchmarks (bench/*.py), the studies (bench/studies/*.py) and the artifact
    builders of scripts/ (bench/mcp/ is a package of its own, with its own modules)."""
    return sorted([*BENCH.glob("*.py"), *(BENCH / "studies").glob("*.py"), *(ROOT / "scripts").glob("*.py")])


def bench_imports(source: str, script_names: frozenset[str], filename: str = "<source>") -> list[str]:
    """The bench scripts ``source`` imports, however it reaches them: ``bench.peers``,
    ``bench.studies.x``, or a bare ``perf`` put on ``sys.path``; ``common`` is not counted."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "bench":
                name = parts[2] if parts[1:2] == ["studies"] and len(parts) > 2 else parts[1] if len(parts) > 1 else ""
            else:
                name = parts[0]
            if name in script_names and name != "common" and name not in found:
                found.append(name)
    return found


def test_the_bench_checker_sees_every_way_a_script_reaches_another():
    names = frozenset({"common", "perf", "peers", "leave_one_out"})
    source = (
        "import sys\nfrom common import serve\nfrom perf import synthetic_tools\n"
        "def f():\n    from bench.peers import ranker_for\n"
        "from bench.studies import leave_one_out\nfrom bench.common import ROOT\nimport perfx\n"
    )
    assert sorted(bench_imports(source, names)) == ["leave_one_out", "peers", "perf"]


def test_bench_scripts_import_no_other_bench_script_but_common():
    scripts = bench_scripts()
    names = frozenset(path.stem for path in scripts)
    assert {"common", "latency", "peers", "soak"} <= names and len(scripts) > 20
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in scripts
        if (found := bench_imports(path.read_text(encoding="utf-8"), names, str(path)))
    }
    assert offenders == {}, "share a helper through bench/common.py instead"


# -- what an object can do is said by a protocol, not probed ---------------------------------------

PROBE = ("getattr(", "hasattr(")


def test_at_most_five_attribute_probes_outside_offline_each_saying_why():
    """A ``Protocol`` says what an object can do; the few probes left (ctypes libc symbols,
    third-party private attributes, a proxy) each carry a comment, on their line or the one above."""
    probes = []
    for root in ("registry", "service"):
        for path in sorted((ROOT / root).rglob("*.py")):
            if path.is_relative_to(ROOT / "registry" / "offline"):
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for n, line in enumerate(lines):
                if any(p in line for p in PROBE):
                    explained = "#" in line or lines[n - 1].lstrip().startswith("#")
                    probes.append((f"{path.relative_to(ROOT)}:{n + 1}", explained))
    assert len(probes) <= 5, probes
    assert [where for where, explained in probes if not explained] == []


# -- settings by concern ---------------------------------------------------------------------------

# Only what assembles the parts holds the whole settings; a part is handed its group
# (registry.settings.ServingArgs, FeedbackArgs, ...). The offline package's command-line tools
# read the environment themselves, as a service would.
WHOLE_SETTINGS = frozenset({
    "registry.core", "registry.startup", "registry.assembly",
})


def whole_settings_users() -> list[str]:
    """registry modules, outside the assembly and offline/, that import ``Settings`` itself."""
    found = []
    for path in sorted((ROOT / "registry").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in WHOLE_SETTINGS or module.startswith(("registry.offline.", "registry.settings")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "registry.settings" and any(
                alias.name == "Settings" for alias in node.names
            ):
                found.append(module)
    return found


def test_parts_receive_their_settings_group_not_the_whole_settings():
    assert whole_settings_users() == [], "hand the part its group (registry.settings.*Args.of(settings))"


# -- module sizes ----------------------------------------------------------------------------------

MAX_MODULE_LINES = 400
# Modules past the limit, each one idea a reader holds at once (split along a concept, never to
# pass the count). A new entry names its concept; a module that shrinks below the limit leaves.
LARGE_MODULES: dict[str, str] = {
    "registry/store/redis.py": "RedisStore: registry versions, embeddings and change notices in one "
    "Redis, with the Lua scripts that keep each write atomic",
    "registry/learning/learner.py": "UsageLearner: the usage memory's life in a service (fed, read, "
    "switched, fitted at a refit, saved), one object every replica runs",
    "registry/learning/usage.py": "UsageMemory: the per-registry memory of queries and used tools, "
    "and the lift it gives",
    "registry/index/minilm_export.py": "the embedder cache: each ONNX file, its manifest, the "
    "export that makes it and the checks on every start",
    "registry/settings.py": "the domain's settings groups, one field per SHORTLIST_* variable",
    "registry/serving/shortlist.py": "QueryRunner: the query path, one walk from a resolved request "
    "to a Shortlist, each step a call into its own serving module",
    "client/src/tool_shortlist_client/adapters/langchain.py": "ShortlistMiddleware: one LangChain "
    "agent middleware, its hooks and the turn state they share",
}


def module_lines() -> dict[str, int]:
    """Lines of every Python module of the library, the web layer and the client."""
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for top in ("registry", "service", "client")
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def test_no_module_grows_past_the_limit_unless_it_is_one_concept():
    lines = module_lines()
    assert len(lines) > 100 and "registry/core.py" in lines
    too_long = {path: n for path, n in lines.items() if n > MAX_MODULE_LINES and path not in LARGE_MODULES}
    assert too_long == {}, f"split along a concept, or list it in LARGE_MODULES with its concept (>{MAX_MODULE_LINES} lines)"
    stale = sorted(path for path in LARGE_MODULES if lines.get(path, 0) <= MAX_MODULE_LINES)
    assert stale == [], "no longer over the limit (or gone): take it off LARGE_MODULES"
    assert all(reason.strip() for reason in LARGE_MODULES.values())
