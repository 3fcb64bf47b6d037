"""allowed_tools, a token's bound patterns and several queries in one call, on the engine with
the fast fake embedder: the scope applies before the cap, nothing outside it is ever shown, bad
input is refused naming the field, and merged lists keep each request's tools."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from registry.assembly import Registries
from registry.errors import ScopeForbidden, ValidationFailed
from registry.index.hybrid import SCORERS
from registry.request import MAX_QUERIES, ShortlistRequest
from registry.serving.depth_policies import POLICIES
from registry.settings import Settings
from tests.cores import new_engine

GITHUB = ["create_issue", "close_issue", "list_issues", "merge_pull_request", "review_pull_request",
          "create_pull_request", "list_pull_requests", "comment_on_issue"]  # fmt: skip
FS = ["read_file", "read_dir", "write_file", "delete_file", "move_file", "stat_file"]


def toolbox() -> list[dict]:
    tools = [
        {
            "name": f"github/{n}",
            "description": f"GitHub: {n.replace('_', ' ')} in a repository issue tracker.",
        }
        for n in GITHUB
    ]
    tools += [
        {"name": f"fs/{n}", "description": f"Files: {n.replace('_', ' ')} on the local disk."}
        for n in FS
    ]
    tools += [
        {"name": f"misc_{i}", "description": f"Unrelated helper number {i} for weather and maps."}
        for i in range(10)
    ]
    return tools


@pytest.fixture
def scoped(engine):
    engine.writer.put_registry("r", toolbox())
    return engine


def ask(engine: Registries, token_scope=None, **fields) -> list[str]:
    fields.setdefault("registry", "r")
    return [t.name for t in engine.shortlist(ShortlistRequest(**fields), token_scope).tools]


def test_the_scope_applies_before_the_cap_so_no_slot_is_wasted(scoped):
    query = "create an issue or review a pull request in the repository issue tracker"
    everything = ask(scoped, query=query, k=5)
    assert all(n.startswith("github/") for n in everything)  # filtering these would leave 0
    files = ask(scoped, query=query, k=5, allowed_tools=["fs/*"])
    assert len(files) == 5 and all(n.startswith("fs/") for n in files)
    adaptive = scoped.shortlist(
        ShortlistRequest("r", query, max_k=4, allowed_tools=["fs/read_*", "misc_1"])
    )
    assert {t.name for t in adaptive.tools} <= {"fs/read_file", "fs/read_dir", "misc_1"}
    assert adaptive.n_tools == 3 and adaptive.k >= 1  # depth and p_rand see the allowed tools


def test_exact_names_and_patterns_mix_and_the_order_is_the_registry_ranking(scoped):
    query = "read the file from the local disk"
    whole = ask(scoped, query=query, k=len(toolbox()))
    allowed = ["fs/read_file", "github/*", "misc_?"]
    kept = [n for n in whole if n == "fs/read_file" or n.startswith("github/") or n[:5] == "misc_"]
    assert ask(scoped, query=query, k=12, allowed_tools=allowed) == kept[:12]
    assert ask(scoped, query=query, k=30, allowed_tools=allowed) == kept  # all 19 allowed


def test_a_named_or_usage_lifted_tool_outside_the_scope_is_never_shown(
    settings, hashing_embedder, bor_policy
):
    class Intruder:
        """A usage memory that lifts a disallowed tool to the top of every ranking."""

        def rerank(self, snap, query, ids, scores, **_):
            intruder = snap.by_name["github/create_issue"]
            return np.concatenate([[intruder], ids]), np.concatenate([[9.0], scores]).astype(
                np.float32
            )

        def companions(self, snap):
            return None

    engine = new_engine(settings, embedder=hashing_embedder, bor_policy=bor_policy, usage=Intruder())
    engine.writer.put_registry("r", toolbox())
    assert ask(engine, query="read a file", k=3)[0] == "github/create_issue"  # the lift works
    for fields in ({"k": 3}, {"max_k": 5}, {"policy": "gap"}):
        names = ask(
            engine,
            query="run github/create_issue then read a file",
            allowed_tools=["fs/*"],
            **fields,
        )
        assert names and all(n.startswith("fs/") for n in names), (fields, names)


def test_bad_allowed_tools_are_refused_naming_the_field(scoped):
    for allowed, field in (
        ([], "allowed_tools"),
        ([""], "allowed_tools[0]"),
        ("fs/*", "allowed_tools"),
    ):
        with pytest.raises(ValidationFailed) as caught:
            ask(scoped, query="read a file", allowed_tools=allowed)
        assert [p["field"] for p in caught.value.details] == [field]
    with pytest.raises(ValidationFailed) as caught:
        ask(scoped, query="read a file", allowed_tools=["fs/*", "jira/*", "nope"])
    assert [(p["field"], p["pattern"]) for p in caught.value.details] == [
        ("allowed_tools", "jira/*"),
        ("allowed_tools", "nope"),
    ]
    assert "'jira/*', 'nope' match no tool of registry 'r'" in caught.value.message


def test_a_token_scope_is_narrowed_by_the_request_never_widened(scoped):
    bound = ("github/*", "fs/read_file")
    names = ask(scoped, bound, query="read the file from the local disk", k=20)
    assert set(names) == {f"github/{n}" for n in GITHUB} | {"fs/read_file"}
    assert ask(scoped, bound, query="read the file", k=20, allowed_tools=["fs/*"]) == [
        "fs/read_file"
    ]
    with pytest.raises(ValidationFailed) as caught:  # exists, but not for this token: same answer
        ask(scoped, bound, query="read the file", allowed_tools=["fs/write_file", "nope"])
    assert [p["pattern"] for p in caught.value.details] == ["fs/write_file", "nope"]
    assert "none of the tools this token may use" in caught.value.message
    with pytest.raises(ScopeForbidden):
        ask(scoped, ("jira/*",), query="read the file")


def test_queries_merge_each_requests_list_round_robin_with_tags(scoped):
    issue, files = "close the issue in the issue tracker", "delete the file on the local disk"
    one = ask(scoped, query=issue, k=3)
    two = ask(scoped, query=files, k=3)
    merged = scoped.shortlist(ShortlistRequest("r", queries=[issue, files], k=3))
    expected = list(dict.fromkeys(n for pair in zip(one, two) for n in pair))
    assert [t.name for t in merged.tools] == expected
    assert [t.rank for t in merged.tools] == list(range(1, len(expected) + 1))
    for tool in merged.tools:
        assert tool.queries == tuple(i for i, names in enumerate((one, two)) if tool.name in names)
    assert merged.k == len(expected) and merged.trace is None
    same = scoped.shortlist(ShortlistRequest("r", queries=[issue, issue], k=3))
    assert [t.name for t in same.tools] == one and {t.queries for t in same.tools} == {(0, 1)}


def test_queries_and_allowed_tools_combine(scoped):
    merged = ask(
        scoped, queries=["close the issue", "delete the file"], k=2, allowed_tools=["fs/*"]
    )
    assert merged and all(n.startswith("fs/") for n in merged)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"queries": []}, "queries"),
        ({"queries": ["weather"] * (MAX_QUERIES + 1)}, "queries"),
        ({"queries": ["weather", "  "]}, "queries[1]"),
        ({"queries": "weather"}, "queries"),
        ({"query": "weather", "queries": ["weather"]}, "query"),
        ({}, "query"),
    ],
)
def test_bad_queries_are_refused_naming_the_field(fields, field):
    with pytest.raises(ValidationFailed) as caught:
        ShortlistRequest("r", **fields).resolve(Settings(), SimpleNamespace(scorers=SCORERS, policies=POLICIES))
    assert [p["field"] for p in caught.value.details] == [field]


def test_sixteen_queries_are_answered(scoped):
    merged = scoped.shortlist(
        ShortlistRequest("r", queries=[f"read file {i}" for i in range(MAX_QUERIES)], k=1)
    )
    assert merged.k >= 1 and {q for t in merged.tools for q in t.queries} == set(range(MAX_QUERIES))


def test_a_remembered_scope_follows_the_registrys_new_versions(scoped):
    query = "read the file from the local disk"
    assert set(ask(scoped, query=query, k=20, allowed_tools=["fs/read_*"])) == {"fs/read_file", "fs/read_dir"}
    scoped.writer.upsert_tools("r", [{"name": "fs/read_link", "description": "Files: read a symbolic link."}])
    assert "fs/read_link" in ask(scoped, query=query, k=20, allowed_tools=["fs/read_*"])
    scoped.writer.put_registry("r", [t for t in toolbox() if not t["name"].startswith("fs/")])
    with pytest.raises(ValidationFailed):
        ask(scoped, query=query, allowed_tools=["fs/read_*"])
