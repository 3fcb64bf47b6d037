"""docs/api.md's curl examples, run in document order with the real curl against a real server
(the default tuned embedder, the shipped policy, `make run`'s demo registry), each answer checked against the
status and JSON shape the document gives for it: a stale example fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import doc_examples
from tests.doc_examples import Example, examples, match, parse_shape

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "api.md"
PLACEHOLDER = re.compile(r"<(\w+)>")


def run_example(example: Example, base: str, seen: dict[str, str]) -> tuple[int, str]:
    """Run one example with curl against ``base``; documented ids and ``<key>`` placeholders are
    replaced by what earlier answers served."""

    def resolve(arg: str) -> str:
        for name, value in example.variables.items():
            arg = arg.replace(f"${name}", value).replace(f"${{{name}}}", value)
        for documented, served in seen.items():
            arg = arg.replace(documented, served)
        arg = PLACEHOLDER.sub(lambda m: seen.get(f"<{m.group(1)}>", m.group(0)), arg)
        return arg.replace("localhost:8080", base)

    argv = [resolve(arg) for arg in example.argv[1:]]
    proc = subprocess.run(
        ["curl", "-sS", "--max-time", "120", "-w", "\n%{http_code}", *argv],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, f"docs/api.md:{example.line}: curl failed: {proc.stderr}"
    body, _, status = proc.stdout.rpartition("\n")
    return int(status), body


def test_parser_reads_elided_shapes_and_catches_a_stale_answer() -> None:
    shape = parse_shape('{"id": "...", "k": 2, "tools": [..., {"name": "a", ...}, ...], "x"} prose')
    good = {"id": "z", "k": 2, "tools": [{"name": "b"}, {"name": "a", "n": 1}], "x": None}
    assert not match(shape, good).problems
    assert match(shape, {**good, "k": 3}).problems  # a changed value
    assert match(shape, {**good, "new_field": 1}).problems  # an undocumented key
    assert match(shape, {**good, "tools": [{"name": "b"}]}).problems  # a documented item gone
    (example,) = examples("```bash\ncurl -X DELETE localhost:8080/x   # 204\n```\n")
    assert (example.argv, example.status) == (["curl", "-X", "DELETE", "localhost:8080/x"], 204)
    multi = '```bash\nJ=\'a: b\'\ncurl -H "$J" x -d \'{\n  "q": 1}\'\n# -> {"ok": true}\n```\n'
    (example,) = examples(multi)
    assert example.variables == {"J": "a: b"} and example.argv[-1] == '{\n  "q": 1}'
    assert isinstance(example.shape, doc_examples.Shape)
    continued = '```bash\ncurl x\n# -> {"a": 1,\n#     "b": [2]}\n```\n'
    (example,) = examples(continued)
    assert not match(example.shape, {"a": 1, "b": [2]}).problems
    assert match(example.shape, {"a": 1, "b": [3]}).problems


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path):
    from registry.settings import Settings
    from tests.server import Servers

    servers = Servers(tmp_path_factory.mktemp("api-docs"), minilm_cache)
    # make run's demo registry; no exploration, so the documented depth is the policy's own.
    started = servers.start(demo_registry=str(Settings().demo_registry), explore_share="0")
    yield started
    servers.close()


def test_every_curl_example_of_docs_api_md_answers_as_documented(server) -> None:
    markdown = API_DOC.read_text()
    found = examples(markdown)
    in_bash = sum(
        1
        for block in re.findall(r"^```bash\n(.*?)^```", markdown, re.S | re.M)
        for line in block.splitlines()
        if line.strip().startswith("curl ")
    )
    assert len(found) == in_bash >= 20, "every curl line of docs/api.md is an example run here"
    base = f"127.0.0.1:{server.port}"
    seen: dict[str, str] = {}
    problems: list[str] = []
    for example in found:
        status, body = run_example(example, base, seen)
        where = f"docs/api.md:{example.line} ({' '.join(example.argv[:4])}...)"
        expected = example.status
        if (expected is None and not 200 <= status < 300) or expected not in (None, status):
            problems.append(
                f"{where}: status {status}, documented {expected or '2xx'}: {body[:300]}"
            )
            continue
        answer: Any = None
        if body.strip().startswith(("{", "[")):
            answer = json.loads(body)
            for key in ("job", "shortlist_id"):
                if isinstance(answer, dict) and isinstance(answer.get(key), str):
                    seen[f"<{key}>"] = answer[key]
        if example.shape is not None:
            if answer is None:
                problems.append(f"{where}: JSON documented, got {body[:200]!r}")
                continue
            result = match(example.shape, answer)
            seen.update(result.seen)
            problems += [f"{where}: {problem}" for problem in result.problems]
    assert not problems, "\n".join(problems)


def test_a_stale_example_fails(server, tmp_path: Path) -> None:
    """The same runner over a copy of the shortlist example documenting another top tool."""
    markdown = API_DOC.read_text()
    start = markdown.index("### Shortlists (agents)")
    section = markdown[start : markdown.index("(What `make run`", start)]
    stale = section.replace('"name": "get_weather_forecast"', '"name": "send_email"', 1)
    assert stale != section
    (example,) = examples(stale)
    status, body = run_example(example, f"127.0.0.1:{server.port}", {})
    assert status == 200
    problems = match(example.shape, json.loads(body)).problems
    assert any("send_email" in problem for problem in problems), problems
    assert not match(examples(section)[0].shape, json.loads(body)).problems


def test_the_in_process_example_runs_as_written(tmp_path: Path, minilm_cache: Path) -> None:
    """docs/api.md's Python block, run verbatim in a fresh interpreter with SHORTLIST_* set as a
    user would (a data dir, the demo registry by default); then what it built is checked."""
    import sys

    (code,) = re.findall(r"^```python\n(.*?)^```", API_DOC.read_text(), re.S | re.M)
    check = (
        "\nimport json\n"
        "print(json.dumps({'names': [t.name for t in result.tools],"
        " 'report': core.report('demo')}, default=lambda o: getattr(o, '__dict__', str(o))))\n"
    )
    env = dict(
        os.environ,
        SHORTLIST_DATA_DIR=str(tmp_path / "data"),
        SHORTLIST_EMBEDDER_CACHE_DIR=str(minilm_cache),
        SHORTLIST_EXPLORE_SHARE="0",
    )
    proc = subprocess.run([sys.executable, "-c", code + check], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["names"] and set(out["names"]) <= {"get_weather_forecast", "get_weather"}
    report = out["report"]
    assert report["registry"] == "demo" and report["events"] == 1
    used = [tool for tool in report["tools"] if tool["used"]]
    assert [tool["name"] for tool in used] == out["names"][:1]
