"""The training corpus loader, LOSO folds and the one tool text (small fixtures, never ../shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.index.lexical import LexicalIndex, tokenize
from registry.offline.corpus import (
    DEV_SOURCES,
    MCP_SOURCE,
    corpus_dirs,
    load_corpus,
    loso_folds,
    subsample,
    tool_texts,
    training_pairs,
)
from registry.offline.datasets import load_dataset


def _write_source(directory: Path, tools: list[dict], queries: list[dict]) -> None:
    directory.mkdir(parents=True)
    (directory / "tools.json").write_text(json.dumps(tools))
    (directory / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))


def _tool(name: str, description: str, **params: str) -> dict:
    props = {k: {"type": "string", "description": v} for k, v in params.items()}
    return {"name": name, "description": description, "parameters": {"type": "object", "properties": props}}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    _write_source(
        tmp_path / "train" / "alpha",
        [_tool("calendar.CreateEvent", "Add an event", start_time="when"), _tool("mail/send_mail", "Send")],
        [
            {"id": "a0", "query": "book a meeting", "gold": ["calendar.CreateEvent"]},
            {"id": "a1", "query": "meet and mail", "gold": ["calendar.CreateEvent", "mail/send_mail"]},
            {"id": "a2", "query": "unknown gold only", "gold": ["not_a_tool"]},
        ],
    )
    _write_source(
        tmp_path / "train" / "beta",
        [_tool("getWeatherForecast", "Weather for days ahead", city="a city")],
        [{"id": f"b{i}", "query": f"weather {i}", "gold": ["getWeatherForecast"]} for i in range(5)],
    )
    (tmp_path / "train" / "not_a_set").mkdir()  # no files: ignored
    _write_source(
        tmp_path / DEV_SOURCES[1],
        [_tool("ResearchHelper", "Find papers")],
        [{"id": "m0", "query": "papers please", "gold": ["ResearchHelper"]}],
    )
    return tmp_path


def test_corpus_dirs_lists_train_sets_then_dev_sets(root: Path) -> None:
    assert [p.name for p in corpus_dirs(root)] == ["alpha", "beta", DEV_SOURCES[1]]


def test_extra_sources_come_last_and_load_like_the_others(root: Path, tmp_path: Path) -> None:
    extra = tmp_path / "own_tasks"
    _write_source(extra, [_tool("write_file", "Write a file", path="where")],
                  [{"id": "o0", "query": "save notes", "gold": ["write_file"]}])
    assert [p.name for p in corpus_dirs(root, [extra])] == ["alpha", "beta", DEV_SOURCES[1], "own_tasks"]
    assert [q.id for q in {d.name: d for d in load_corpus(root, extra=[extra])}["own_tasks"].queries] == ["o0"]
    assert [d.name for d in load_corpus(root)] == ["alpha", "beta", DEV_SOURCES[1]]  # not by default


def test_an_extra_directory_that_is_not_a_source_is_named(root: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        corpus_dirs(root, [tmp_path / "nowhere"])


def test_the_shipped_mcp_source_holds_every_task_with_its_gold() -> None:
    data = load_dataset(MCP_SOURCE)
    tasks = (MCP_SOURCE.parent / "mcp_tasks.jsonl").read_text().splitlines()
    assert len(data.queries) == len(tasks)  # no task dropped for a gold name the union lacks
    names = [t.name for t in data.tools]
    assert len(names) == len(set(names))  # names two servers share carry their server
    assert "github__create_issue" in names and "gitlab__create_issue" in names


def test_the_shipped_mcp_source_is_what_its_script_writes_now() -> None:
    from bench.mcp.corpus_source import build_source

    tools, rows = build_source()
    assert json.loads((MCP_SOURCE / "tools.json").read_text()) == tools
    lines = (MCP_SOURCE / "queries.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows  # re-run the script after editing the tasks


def test_corpus_dirs_without_any_set_names_the_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        corpus_dirs(tmp_path)


def test_load_corpus_drops_unknown_gold_and_subsamples(root: Path) -> None:
    data = {d.name: d for d in load_corpus(root)}
    assert [q.id for q in data["alpha"].queries] == ["a0", "a1"]
    assert data["alpha"].queries[1].gold == ("calendar.CreateEvent", "mail/send_mail")
    small = {d.name: d for d in load_corpus(root, max_queries=2, seed=3)}
    assert len(small["beta"].queries) == 2
    ids = [q.id for q in small["beta"].queries]
    assert ids == sorted(ids)  # original order kept
    assert ids == [q.id for q in load_corpus(root, max_queries=2, seed=3)[1].queries]  # seeded
    assert [d.name for d in load_corpus(root, only=["beta"])] == ["beta"]


def test_subsample_is_seeded_and_bounded() -> None:
    items = list(range(100))
    a = subsample(items, 10, seed=1)
    assert len(a) == 10 and a == sorted(a) and a == subsample(items, 10, seed=1)
    assert a != subsample(items, 10, seed=2)
    assert subsample(items, None, seed=0) == items


def test_loso_folds_partition_sources_and_balance_sizes() -> None:
    sizes = {"a": 100, "b": 90, "c": 50, "d": 40, "e": 10}
    folds = loso_folds(sizes, 2)
    tested = sorted(n for fold in folds for n in fold.test)
    assert tested == sorted(sizes)  # every source held out exactly once
    for fold in folds:
        assert not set(fold.test) & set(fold.train)
        assert set(fold.test) | set(fold.train) == set(sizes)
    loads = [sum(sizes[n] for n in fold.test) for fold in folds]
    assert max(loads) - min(loads) <= 10
    plain = loso_folds(sizes)
    assert [f.test for f in plain] == [(n,) for n in ("a", "b", "c", "d", "e")]
    with pytest.raises(ValueError):
        loso_folds({"a": 1})
    with pytest.raises(ValueError):
        loso_folds(sizes, 1)


def test_tool_text_splits_every_name_form_and_bm25_matches_the_words(root: Path) -> None:
    data = {d.name: d for d in load_corpus(root)}
    texts = dict(zip([t.name for t in data["alpha"].tools], tool_texts(data["alpha"].tools)))
    assert "calendar create event" in texts["calendar.CreateEvent"]
    assert "start time: when" in texts["calendar.CreateEvent"]  # parameter name split, with its text
    assert "mail send mail" in texts["mail/send_mail"]
    (weather,) = tool_texts(data["beta"].tools)
    assert "get weather forecast" in weather and "city: a city" in weather
    # BM25 sees the same text: a query word that only appears inside the name still matches.
    index = LexicalIndex(list(texts.values()))
    scores = index.scores(tokenize("create an event on the calendar"))
    assert scores[0] > 0 and scores[1] == 0


def test_training_pairs_one_per_gold_tool(root: Path) -> None:
    corpus = load_corpus(root)
    pairs = training_pairs(corpus, seed=0)
    assert len(pairs) == 2 + 1 + 5 + 1  # a1 has two gold tools
    assert {p[0] for p in pairs} == {"alpha", "beta", DEV_SOURCES[1]}
    assert pairs == training_pairs(corpus, seed=0)
    assert len(training_pairs(corpus, max_pairs=3)) == 3


def test_cap_registry_keeps_every_needed_tool(root: Path) -> None:
    capped = {d.name: d for d in load_corpus(root, max_tools=1)}
    names = [t.name for t in capped["alpha"].tools]
    assert names == ["calendar.CreateEvent", "mail/send_mail"]  # both needed: over the cap
    only_one = {d.name: d for d in load_corpus(root, max_queries=1, max_tools=1, seed=0)}
    (kept,) = only_one["alpha"].queries
    assert {t.name for t in only_one["alpha"].tools} == set(kept.gold)


def test_unseen_split_keeps_exactly_the_requests_the_fine_tune_did_not_train_on(tmp_path: Path) -> None:
    from bench.studies.unseen_split import write_unseen

    tools = [_tool("get_weather", "Current weather"), _tool("send_mail", "Send a mail")]
    queries = [{"id": f"q{i}", "query": f"request {i}", "gold": ["get_weather"]} for i in range(10)]
    _write_source(tmp_path / "data" / "train" / "gamma", tools, queries)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"datasets": {"gamma": {}}, "subsample": {"max_queries": 4, "seed": 7}}))
    trained = {q.id for q in load_corpus(tmp_path / "data", max_queries=4, seed=7)[0].queries}
    assert write_unseen(tmp_path / "data" / "train" / "gamma", manifest, tmp_path / "out") == 6
    kept = {q.id for q in load_dataset(tmp_path / "out" / "gamma").queries}
    assert kept == {q["id"] for q in queries} - trained and len(trained) == 4
    assert json.loads((tmp_path / "out" / "gamma" / "tools.json").read_text()) == tools
    manifest.write_text(json.dumps({"datasets": {"gamma": {}}, "subsample": {"max_queries": 40, "seed": 7}}))
    assert write_unseen(tmp_path / "data" / "train" / "gamma", manifest, tmp_path / "none") == 0  # all trained on
    assert not (tmp_path / "none").exists()
