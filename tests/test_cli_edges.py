"""The command line and the client at their edges: an unknown registry, a missing path and a file
that is not JSON each end in one line naming the problem (exit 2 on the command line, a typed
error in the client), never a traceback or a silent success."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.store.base import RegistryRecord
from registry.store.local import LocalStore
from tests.conftest import ROOT
from tool_shortlist_client import ShortlistClient, ShortlistClientError, ToolsFileError


def _cli(*args: str, data_dir: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHORTLIST_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    env.update({f"SHORTLIST_{key.upper()}": value for key, value in settings.items()})
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_refit_of_an_unknown_registry_exits_2_naming_it(tmp_path: Path) -> None:
    proc = _cli("refit", "--registry", "nope", data_dir=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "shortlist refit: registry 'nope' does not exist"
    assert proc.stdout == ""


def test_refit_of_an_unknown_registry_on_redis_exits_2_naming_it(tmp_path: Path, redis_server, redis_prefix) -> None:
    proc = _cli("refit", "--registry", "nope", data_dir=tmp_path, redis_url=redis_server.url, redis_prefix=redis_prefix)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "shortlist refit: registry 'nope' does not exist"


def test_refit_of_a_known_registry_still_runs(tmp_path: Path) -> None:
    LocalStore(tmp_path).save(RegistryRecord("known", 1, [{"name": "get_weather", "description": "weather"}]))
    proc = _cli("refit", "--registry", "known", data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    assert job["registry"] == "known" and job["state"] in ("refused", "done")


def test_refit_help_has_a_description(tmp_path: Path) -> None:
    text = _cli("refit", "--help", data_dir=tmp_path).stdout
    assert "Refit one registry's depth policy from the feedback logged" in text
    assert "exit 1 if it failed, 2 if the registry does not exist" in " ".join(text.split())


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--data", "/nonexistent"], "shortlist evaluate: --data /nonexistent: no such directory"),
        (["--data", "{tmp}"], "shortlist evaluate: --data {tmp}: no tools.json in it"),
        (["--data", "{data}", "--policy", "{tmp}"], "shortlist evaluate: --policy {tmp}: no manifest.json in it"),
    ],
)
def test_evaluate_with_a_missing_input_says_so_in_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    data = tmp_path / "set"
    data.mkdir()
    (data / "tools.json").write_text("[]")
    (data / "queries.jsonl").write_text("")
    filled = [a.format(tmp=tmp_path, data=data) for a in args]
    out = tmp_path / "out"
    proc = _cli("evaluate", *filled, "--out", str(out), data_dir=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line.format(tmp=tmp_path, data=data)), proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"<html>not json</html>", "not JSON (Expecting value at line 1 column 1)"),
        (b'{"tools": [\n  {"name": "a",}\n]}', "not JSON (Expecting property name enclosed in double quotes at line 2 column 16)"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
)
def test_uploading_a_file_that_is_not_json_is_a_typed_client_error(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "tools.json"
    path.write_bytes(content)
    # Nothing listens on port 9: the error comes before any request.
    with ShortlistClient("http://127.0.0.1:9") as client, pytest.raises(ToolsFileError) as err:
        client.upload_registry("r", path)
    assert isinstance(err.value, ShortlistClientError) and err.value.path == str(path)
    assert str(err.value).startswith(f"cannot read the tools file {path}: {reason}")
    with ShortlistClient("http://127.0.0.1:9") as client, pytest.raises(ToolsFileError, match="No such file"):
        client.upload_registry("r", tmp_path / "missing.json")
