"""Layout figures for a checkout: long modules, shortlist-parameter re-listings, import cycles, settings.

Run on this tree and on an older one to compare (issue 20's before/after figures):

    python bench/layout_figures.py              # this checkout
    python bench/layout_figures.py /tmp/before  # e.g. `git archive <commit> | tar -x -C /tmp/before`

Counts, all from the source text (nothing is imported, so any checkout can be measured):

* modules over 400 lines in ``registry/``, ``service/`` and ``client/src`` (tests: over 600), and
  the largest one;
* re-listings of the shortlist request: function signatures (``def``), calls passing them one by
  one (``call``) and class bodies (``class``: models, including the request value itself and
  responses that echo it) naming at least five of the eight request parameters (``registry,
  query, k, max_k, policy, scorer, depth_bias, allow_empty``);
* import cycles between modules of ``registry/`` (strongly connected components of the import
  graph, imports inside functions included) and between its packages (``registry.serving``,
  ``registry.offline``, ...; top-level modules count as their own package);
* imports that run the wrong way: ``registry.serving`` -> ``registry.offline``,
  ``registry.learning`` -> ``registry.core``/``registry.writes``/``registry.backends``,
  ``service`` -> ``registry.offline``/``registry.store``, and ``registry.settings`` -> anything
  but ``registry.request``/``registry.errors``;
* fields of ``Settings`` (annotated assignments in its class bodies, nested groups included).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REQUEST_PARAMS = frozenset(
    {"registry", "query", "k", "max_k", "policy", "scorer", "depth_bias", "allow_empty"}
)
SOURCE_DIRS = ("registry", "service", "client/src")
WRONG_WAY = (
    ("registry.serving", ("registry.offline",)),
    ("registry.learning", ("registry.core", "registry.writes", "registry.backends")),
    ("service", ("registry.offline", "registry.store")),
)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, this: str, is_package: bool) -> set[str]:
    """Every module ``this`` imports (``from a import b`` counts ``a.b`` when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = this.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs with more than one member (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def relistings(tree: ast.AST) -> list[str]:
    """Signatures, class bodies and calls that name >= 5 of the request parameters, each tagged
    ``def`` (a parameter list), ``class`` (a model's fields) or ``call`` (passed one by one)."""
    hits = []
    for node in ast.walk(tree):
        names: set[str] = set()
        kind = ""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            kind, label = "def", node.name
        elif isinstance(node, ast.ClassDef):
            names = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            kind, label = "class", node.name
        elif isinstance(node, ast.Call):
            names = {kw.arg for kw in node.keywords if kw.arg}
            kind, label = "call", ast.unparse(node.func)[:40]
        if len(names & REQUEST_PARAMS) >= 5:
            hits.append(f"{kind} {label}:{node.lineno}")
    return hits


def settings_fields(tree: ast.AST) -> int:
    """Annotated fields of ``Settings`` and of the classes its fields are typed with."""
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

    def count(cls: ast.ClassDef, seen: set[str]) -> int:
        total = 0
        for s in cls.body:
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                if s.target.id.startswith("model_"):
                    continue
                nested = ast.unparse(s.annotation)
                if nested in classes and nested not in seen:
                    total += count(classes[nested], seen | {nested})
                else:
                    total += 1
        return total

    return count(classes["Settings"], {"Settings"}) if "Settings" in classes else 0


def main(root: Path) -> None:
    lines: dict[str, int] = {}
    graph: dict[str, set[str]] = defaultdict(set)
    outside: dict[str, set[str]] = {}
    relisted: list[str] = []
    modules: dict[str, Path] = {}
    for top in (*SOURCE_DIRS, "tests"):
        for path in sorted((root / top).rglob("*.py")):
            modules[str(path.relative_to(root))] = path
    registry_modules = {
        module_name(root, p) for rel, p in modules.items() if rel.startswith("registry/")
    }
    for rel, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines[rel] = text.count("\n")
        tree = ast.parse(text, rel)
        if rel.startswith("tests/"):
            continue
        relisted += [f"{rel}::{hit}" for hit in relistings(tree)]
        src_root = root / "client/src" if rel.startswith("client/") else root
        this = module_name(src_root, path)
        deps = imported_modules(tree, this, path.name == "__init__.py")
        if rel.startswith("registry/"):
            graph[this] |= {d for d in deps if d in registry_modules and d != this}
        else:
            outside[this] = {d for d in deps if d in registry_modules}
    src = {k: v for k, v in lines.items() if not k.startswith("tests/")}
    long_src = sorted((n, k) for k, n in src.items() if n > 400)
    long_tests = sorted((n, k) for k, n in lines.items() if k.startswith("tests/") and n > 600)
    largest = max((n, k) for k, n in src.items())
    module_cycles = strongly_connected(graph)
    packages: dict[str, set[str]] = defaultdict(set)
    for mod, deps in graph.items():
        packages[package_of(mod)] |= {package_of(d) for d in deps} - {package_of(mod)}
    package_cycles = strongly_connected(packages)
    wrong = []
    everything = {**graph, **outside}
    for mod, deps in sorted(everything.items()):
        for source, targets in WRONG_WAY:
            if mod == source or mod.startswith(source + "."):
                wrong += [f"{mod} -> {d}" for d in sorted(deps) if d.startswith(targets)]
        if mod == "registry.settings":
            wrong += [
                f"{mod} -> {d}" for d in sorted(deps)
                if d not in {"registry.request", "registry.errors", "registry"}
            ]
    settings_path = root / "registry" / "settings.py"
    n_settings = settings_fields(ast.parse(settings_path.read_text(encoding="utf-8")))
    top_level = sorted(
        p.name for p in (root / "registry").glob("*.py") if p.name != "__init__.py"
    )
    print(f"checkout: {root}")
    print(f"source modules over 400 lines: {len(long_src)}")
    for n, k in long_src:
        print(f"  {n:5d} {k}")
    print(f"test modules over 600 lines: {len(long_tests)}")
    for n, k in long_tests:
        print(f"  {n:5d} {k}")
    print(f"largest source module: {largest[1]} ({largest[0]} lines)")
    print(f"shortlist-parameter re-listings (>=5 of 8 names): {len(relisted)}")
    for kind in ("def", "call", "class"):
        hits = [h for h in relisted if h.split(":", 2)[2].startswith(kind + " ")]
        print(f"  {kind}: {len(hits)}")
        for hit in hits:
            print(f"    {hit}")
    print(f"module import cycles in registry/: {len(module_cycles)}")
    for cycle in module_cycles:
        print(f"  {' <-> '.join(cycle)}")
    print(f"package import cycles in registry/: {len(package_cycles)}")
    for cycle in package_cycles:
        print(f"  {' <-> '.join(cycle)}")
    print(f"wrong-way imports: {len(wrong)}")
    for edge in wrong:
        print(f"  {edge}")
    print(f"Settings fields: {n_settings}")
    print(f"modules at the top of registry/: {len(top_level)} ({' '.join(top_level)})")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
