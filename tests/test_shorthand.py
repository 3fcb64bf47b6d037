"""Shorthand users type, spelled out before ranking (registry.serving.shorthand).

The unit tests pin the expansion itself; the last test ranks the paired phrasings of
tests/fixtures/shorthand_pairs.jsonl (abbreviated vs spelled out, on harvested MCP tools/list
files and the demo registry) through a real core with the shipped tuned MiniLM."""

from __future__ import annotations

import json

import pytest

from registry.serving.shorthand import SHORTHAND, expand_shorthand
from tests.conftest import FIXTURES, ROOT

PAIRS = [json.loads(line) for line in (FIXTURES / "shorthand_pairs.jsonl").read_text().splitlines() if line]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("open a PR from feature-x into main", "open a PR (pull request) from feature-x into main"),
        ("DM Bob the cfg", "DM (direct message) Bob the cfg (configuration)"),
        ("restart the k8s pods", "restart the k8s (Kubernetes) pods"),
        ("fork the repo, then list repos", "fork the repo (repository), then list repos (repositories)"),
        ("open an MR from dev", "open an MR (merge request) from dev"),
        ("where is the config? and the env.", "where is the config (configuration)? and the env (environment)."),
    ],
)
def test_shorthand_is_spelled_out_after_the_word(text, expected):
    assert expand_shorthand(text) == expected


@pytest.mark.parametrize(
    "text",
    ["list the files in /tmp", "the procedure for a dbx-env rollout", "prepare the approval", "", "PR-1234 is done",
     "the cases of Mr. X and Mrs. Y", "open config.yaml", "cat .env", "clone github.com/acme/repo"],
)
def test_text_without_whole_word_shorthand_is_unchanged(text):
    # Words that merely start with an abbreviation, hyphenated identifiers and empty text stay as typed.
    assert expand_shorthand(text) == text


def test_expansion_is_idempotent_and_keeps_an_existing_spelling():
    once = expand_shorthand("merge PR 42 in the repo")
    assert expand_shorthand(once) == once
    assert expand_shorthand("open a PR (pull request) now") == "open a PR (pull request) now"


def test_every_expansion_is_a_different_word_in_lowercase_keys():
    assert all(k == k.lower() and v.lower() != k for k, v in SHORTHAND.items())


def test_the_fixture_pairs_differ_only_by_shorthand():
    assert len(PAIRS) >= 40
    for pair in PAIRS:
        assert expand_shorthand(pair["short"]) != pair["short"], pair  # each carries shorthand
        assert (ROOT / pair["registry"]).is_file()


@pytest.fixture(scope="module")
def tuned_core(tmp_path_factory, minilm_cache):
    from registry.index.embedders import default_embedder
    from registry.settings import Settings
    from tests.cores import new_core

    settings = Settings(
        data_dir=tmp_path_factory.mktemp("shorthand"), embedder_cache_dir=minilm_cache,
        embedder="tuned", demo_registry=None,
    )
    core = new_core(settings, embedder_factory=default_embedder)  # the real tuned MiniLM
    for path in sorted({p["registry"] for p in PAIRS}):
        payload = json.loads((ROOT / path).read_text())
        core.put_registry(path.rsplit("/", 1)[-1].removesuffix(".json"), {"tools": payload["tools"]})
    yield core
    core.close()


def test_an_abbreviated_request_finds_what_the_spelled_out_one_finds(tuned_core):
    from registry.request import ShortlistRequest

    def top3(registry: str, query: str) -> list[str]:
        name = registry.rsplit("/", 1)[-1].removesuffix(".json")
        return [t.name for t in tuned_core.shortlist(ShortlistRequest(registry=name, query=query, k=3)).tools]

    misses, same_top = [], 0
    for pair in PAIRS:
        short, long = top3(pair["registry"], pair["short"]), top3(pair["registry"], pair["long"])
        if pair["tool"] in long and pair["tool"] not in short:
            misses.append((pair["short"], short))
        same_top += short[0] == long[0]
    # As typed (no expansion) 4 of the 42 lost their tool from the top 3 and 9 changed the top tool.
    assert not misses, misses
    assert same_top >= len(PAIRS) - 2, same_top
