"""The MiniLM fine-tune on a tiny fixture: triplets, batches, loss falls, ONNX = torch, artifact checks."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from registry.errors import ArtifactError
from registry.index.embedders import load_minilm
from registry.index.minilm_export import (
    DELTA_FILE,
    FINETUNE_KIND,
    TRAIN_EMBEDDER_COMMAND,
    check_adapter,
    ensure_minilm_onnx,
    minilm_model_dir,
)
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.datasets import Dataset, LabelledQuery
from registry.offline.finetune import (
    FinetuneRecipe,
    Triplet,
    batches,
    curriculum_batches,
    encode,
    finetune,
    load_base,
    mine_triplets,
    write_finetuned,
)
from registry.tools import parse_tools

SENTENCES = [
    "save this summary as notes.md",
    "write_file: Create a new file or completely overwrite an existing file with new content.",
    "What's the weather in Paris tomorrow?",
    "a " * 300,
]

FILES = [
    ("write_file", "Create a new file or overwrite an existing file with new content."),
    ("read_file", "Read the complete contents of a file from the file system."),
    ("get_file_info", "Retrieve metadata about a file: size, creation time, permissions."),
    ("list_directory", "List the files and directories in a given path."),
    ("move_file", "Move or rename files and directories."),
]
WEATHER = [
    ("get_weather", "Current weather conditions for a city."),
    ("get_weather_forecast", "Weather forecast for the next days for a city."),
    ("get_air_quality", "Air quality index for a location."),
    ("convert_units", "Convert temperatures between Celsius and Fahrenheit."),
]
QUERIES = {
    "files": [
        ("save this summary as notes.md", "write_file"),
        ("show me what is inside config.yaml", "read_file"),
        ("how big is the log file", "get_file_info"),
        ("what files are in my downloads folder", "list_directory"),
        ("rename draft.txt to final.txt", "move_file"),
    ],
    "weather": [
        ("is it raining in Oslo right now", "get_weather"),
        ("what will the weather be in Paris tomorrow", "get_weather_forecast"),
        ("is the air safe to breathe in Delhi today", "get_air_quality"),
        ("what is 30 celsius in fahrenheit", "convert_units"),
    ],
}


def _dataset(name: str, tools: list[tuple[str, str]]) -> Dataset:
    queries = [LabelledQuery(f"{name}{i}", q, (g,)) for i, (q, g) in enumerate(QUERIES[name])]
    defs = [{"name": n, "description": d, "parameters": {"type": "object", "properties": {}}} for n, d in tools]
    return Dataset(name, parse_tools(defs), queries)


def _vectors(data: Dataset, seed: int) -> SourceVectors:
    """Stand-in base vectors: only their ranking (which non-gold tools are hard) is used."""
    rng = np.random.default_rng(seed)
    row = {t.name: i for i, t in enumerate(data.tools)}
    gold = tuple(tuple(row[g] for g in q.gold) for q in data.queries)
    tools = rng.normal(size=(len(data.tools), 8)).astype(np.float32)
    queries = rng.normal(size=(len(data.queries), 8)).astype(np.float32)
    bm25 = np.zeros((len(data.queries), len(data.tools)), np.float32)
    return SourceVectors(data.name, tools, queries, bm25, gold)


@pytest.fixture(scope="module")
def corpus() -> tuple[list[Dataset], list[SourceVectors]]:
    data = [_dataset("files", FILES), _dataset("weather", WEATHER)]
    return data, [_vectors(d, i) for i, d in enumerate(data)]


RECIPE = FinetuneRecipe(steps=8, batch=4, lr=3e-4, threads=1, hard_pool=2)


def test_triplets_pair_each_gold_with_a_non_gold_tool_of_its_own_registry(corpus) -> None:
    data, vectors = corpus
    triplets = mine_triplets(data, vectors, RECIPE)
    assert len(triplets) == sum(len(d.queries) for d in data)
    texts = {d.name: {t.name: t.text() for t in d.tools} for d in data}
    for t in triplets:
        gold = dict(QUERIES[t.source])[t.query]
        assert t.positive == texts[t.source][gold]
        assert t.negative in texts[t.source].values() and t.negative != t.positive
    assert mine_triplets(data, vectors, RECIPE) == triplets  # seeded


def test_batches_never_repeat_a_text() -> None:
    triplets = [Triplet("s", f"q{i % 3}", f"p{i % 4}", f"n{i}") for i in range(12)]
    plan = batches(triplets, 4, 10, seed=0)
    assert len(plan) == 10
    for batch in plan:
        texts = [x for t in batch for x in (t.query, t.positive, t.negative)]
        assert len(texts) == len(set(texts)) and len(batch) >= 2


def test_the_curriculum_holds_multi_tool_requests_back_for_its_share_of_the_steps() -> None:
    single = [Triplet("s", f"q{i}", f"p{i}", f"n{i}") for i in range(8)]
    multi = [Triplet("s", f"m{i // 2}", f"mp{i}", f"mn{i}", n_gold=2) for i in range(8)]
    plan = curriculum_batches(single + multi, 2, 10, seed=0, share=0.4)
    assert len(plan) == 10
    assert all(t.n_gold == 1 for batch in plan[:4] for t in batch)
    later = [t for batch in plan[4:] for t in batch]
    assert any(t.n_gold == 2 for t in later) and any(t.n_gold == 1 for t in later)
    assert curriculum_batches(single + multi, 2, 10, 0, 0.0) == batches(single + multi, 2, 10, 0)
    # no single-tool request to start on: every step sees them all
    assert curriculum_batches(multi, 2, 5, 0, 0.4) == batches(multi, 2, 5, 0)


@pytest.fixture(scope="module")
def trained(corpus):
    data, vectors = corpus
    model = load_base(minilm_model_dir(), RECIPE)
    return finetune(model, mine_triplets(data, vectors, RECIPE) * 3, RECIPE)


def test_a_few_steps_run_and_the_loss_falls(trained) -> None:
    assert len(trained.losses) == RECIPE.steps
    assert np.mean(trained.losses[-3:]) < 0.8 * np.mean(trained.losses[:3])


@pytest.fixture(scope="module")
def artifact(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finetuned")
    write_finetuned(out, trained.model, minilm_model_dir(), {"datasets": {"fixture": {}}})
    return out


def test_the_manifest_is_checked_at_load(artifact: Path) -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    info = check_adapter(artifact)
    assert manifest["kind"] == FINETUNE_KIND == info["kind"] and manifest["file"] == DELTA_FILE
    assert info["sha256"] == manifest["sha256"]
    # Only the trained encoder layers travel: far smaller than the 90 MB base.
    assert (artifact / DELTA_FILE).stat().st_size < 25_000_000


def test_the_onnx_export_matches_torch_within_1e_4(trained, artifact: Path, tmp_path: Path) -> None:
    onnx = load_minilm(tmp_path / "cache", embedder="tuned", adapter_dir=artifact)
    model = trained.model
    model.max_seq_length = 256  # the service's truncation
    expected = encode(model, SENTENCES)
    got = onnx.embed_documents(SENTENCES)
    assert np.max(np.abs(got - expected)) < 1e-4
    plain = load_minilm(tmp_path / "cache").embed_documents(SENTENCES)
    assert np.max(np.abs(plain - got)) > 1e-3  # the fine-tune is really in the graph
    assert "tool-finetune" in onnx.model_id


def test_a_corrupt_delta_names_the_file_and_the_command(artifact: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text((artifact / "manifest.json").read_text())
    data = bytearray((artifact / DELTA_FILE).read_bytes())
    data[-1] ^= 0xFF
    (broken / DELTA_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupt") as err:
        load_minilm(tmp_path / "cache", embedder="tuned", adapter_dir=broken)
    assert str(broken / DELTA_FILE) in err.value.message
    assert f"{TRAIN_EMBEDDER_COMMAND} --finetune --out {broken}" in err.value.message


def test_a_missing_delta_or_manifest_names_the_file_and_the_command(artifact: Path, tmp_path: Path) -> None:
    for missing, rebuild in ((DELTA_FILE, "--finetune --out"), ("manifest.json", "--out")):
        partial = tmp_path / f"without-{missing}"
        partial.mkdir()
        for name in ("manifest.json", DELTA_FILE):
            if name != missing:
                (partial / name).write_bytes((artifact / name).read_bytes())
        with pytest.raises(ArtifactError, match="not exist") as err:
            load_minilm(tmp_path / "cache", embedder="tuned", adapter_dir=partial)
        assert str(partial / missing) in err.value.message
        assert f"{TRAIN_EMBEDDER_COMMAND} {rebuild} {partial}" in err.value.message
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("model-tuned*.onnx"))


def test_an_unknown_artifact_kind_is_refused(artifact: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    odd.mkdir()
    manifest = json.loads((artifact / "manifest.json").read_text())
    (odd / "manifest.json").write_text(json.dumps({**manifest, "kind": "lora"}))
    (odd / DELTA_FILE).write_bytes((artifact / DELTA_FILE).read_bytes())
    with pytest.raises(ArtifactError, match="kind 'lora'"):
        check_adapter(odd)


def test_recipe_round_trips_into_the_manifest() -> None:
    assert replace(RECIPE, steps=3).as_dict()["steps"] == 3


@pytest.mark.e2e
def test_a_real_server_serves_the_fine_tune_and_refuses_a_corrupt_one(
    artifact: Path, tmp_path: Path
) -> None:
    import httpx

    from registry.index.minilm_export import ensure_embedder_onnx
    from tests.conftest import ROOT
    from tests.server import Servers

    cache = tmp_path / "cache"
    ensure_embedder_onnx(cache, "tuned", artifact)  # composed here, not in the readiness timeout
    servers = Servers(tmp_path / "servers", cache)
    try:
        server = servers.start(embedder="tuned", tuned_embedder_dir=str(artifact))
        tools = json.loads((ROOT / "tests" / "fixtures" / "mcp_filesystem.json").read_text())
        assert httpx.put(f"{server.url}/registries/fs", json=tools, timeout=300).status_code == 200
        r = httpx.post(
            f"{server.url}/shortlist", json={"registry": "fs", "query": "save this summary as notes.md"}, timeout=60
        )
        assert r.status_code == 200 and r.json()["tools"], r.text
        assert "tool-finetune" in json.dumps(httpx.get(f"{server.url}/registries/fs", timeout=30).json())
        server.stop()

        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "manifest.json").write_text((artifact / "manifest.json").read_text())
        (broken / DELTA_FILE).write_bytes((artifact / DELTA_FILE).read_bytes()[:-8])
        failed = servers.start(embedder="tuned", tuned_embedder_dir=str(broken), wait=False)
        deadline = time.monotonic() + 120
        while "start-up failed" not in failed.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        log = failed.log_path.read_text()
        assert str(broken / DELTA_FILE) in log and f"{TRAIN_EMBEDDER_COMMAND} --finetune" in log
        if failed.proc.poll() is None:  # still up: it must not report ready
            assert httpx.get(f"{failed.url}/readyz", timeout=5).status_code != 200
    finally:
        servers.close()


def _write_source(directory: Path, tools: list[tuple[str, str]], queries: list[tuple[str, str]]) -> None:
    directory.mkdir(parents=True)
    (directory / "tools.json").write_text(json.dumps([{"name": n, "description": d} for n, d in tools]))
    rows = [{"id": f"{directory.name}{i}", "query": q, "gold": [g]} for i, (q, g) in enumerate(queries)]
    (directory / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_train_embedder_cli_trains_the_layers_asked_on_root_and_extra_sources(
    tmp_path: Path, minilm_cache: Path
) -> None:
    from registry.offline.train_embedder import main

    files = [("write_file", "Write text to a file"), ("read_file", "Read a file"), ("move_file", "Move a file"),
             ("delete_file", "Delete a file"), ("list_directory", "List a folder"), ("get_file_info", "File size")]
    _write_source(tmp_path / "data" / "train" / "files", files,
                  [("save notes.md", "write_file"), ("open the log", "read_file"), ("rename a.txt", "move_file"),
                   ("remove old.csv", "delete_file"), ("what is in src", "list_directory"),
                   ("how big is app.log", "get_file_info")])
    weather = [("get_weather", "Weather now"), ("get_forecast", "Weather for days ahead"),
               ("get_alerts", "Storm warnings"), ("get_air_quality", "Air pollution index")]
    _write_source(tmp_path / "own", weather,
                  [("is it raining", "get_weather"), ("weather tomorrow", "get_forecast"),
                   ("any storm coming", "get_alerts"), ("is the air bad today", "get_air_quality")])
    out = tmp_path / "out"
    rc = main(["--data", str(tmp_path / "data"), "--extra", str(tmp_path / "own"), "--folds", "0",
               "--steps", "2", "--batch", "2", "--layers", "1", "--embedder-cache", str(minilm_cache),
               "--vectors-cache", str(tmp_path / "vectors"), "--out", str(out)], log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert rc == 0 and manifest["recipe"]["trainable_layers"] == 1 and manifest["recipe"]["steps"] == 2
    assert set(manifest["datasets"]) == {"files", "own"}
    assert check_adapter(out)["sha256"] == manifest["sha256"]


def test_held_out_embedder_picks_the_fold_that_held_the_source_out(tmp_path: Path, minilm_cache: Path) -> None:
    """bench/peers.py --fold-embedders: each source is ranked by the fold model that never saw it."""
    import shutil

    from registry.index.embed import TOKENIZER_FILE
    from registry.offline.finetune_loso import fold_dir, fold_onnx, held_out_embedder

    onnx = ensure_minilm_onnx(minilm_cache)
    trained = fold_onnx(fold_dir(tmp_path, ("acebench", "tooleyes")))
    trained.parent.mkdir(parents=True)
    shutil.copy(onnx, trained)
    shutil.copy(onnx.parent / TOKENIZER_FILE, trained.parent / TOKENIZER_FILE)
    fold_dir(tmp_path, ("api_bank",)).mkdir()  # a fold cut short before its export
    embedder = held_out_embedder(tmp_path, "tooleyes")
    assert embedder.embed_query("weather in Paris").shape == (embedder.dim,)
    for source in ("api_bank", "metatool", "ace"):  # untrained, in no fold, a substring only
        with pytest.raises(FileNotFoundError, match=source):
            held_out_embedder(tmp_path, source)


def test_held_out_vectors_come_from_the_fold_that_held_the_source_out(tmp_path: Path) -> None:
    """The studies read a held-out source's fine-tuned vectors as its fold cached them."""
    from registry.offline.finetune_loso import fold_dir, held_out_vectors, vectors_file

    base = SourceVectors("tooleyes", np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32),
                         np.ones((2, 3), np.float32), ((0,), (1, 2)))  # fmt: skip
    assert held_out_vectors(tmp_path, base) is None  # no fold has finished
    other = fold_dir(tmp_path, ("acebench",))
    other.mkdir()
    np.savez(vectors_file(other, "tooleyes"), tools=np.ones((3, 4)), queries=np.ones((2, 4)))  # not its fold
    fold = fold_dir(tmp_path, ("tooleyes", "metatool"))
    fold.mkdir()
    assert held_out_vectors(tmp_path, base) is None  # its fold has not scored it yet
    tools, queries = np.full((3, 4), 0.5, np.float32), np.full((2, 4), 0.25, np.float32)
    np.savez(vectors_file(fold, "tooleyes"), tools=tools, queries=queries)
    got = held_out_vectors(tmp_path, base)
    assert got is not None and np.array_equal(got.tools, tools) and np.array_equal(got.queries, queries)
    assert got.bm25 is base.bm25 and got.gold == base.gold and got.name == "tooleyes"
