"""SHORTLIST_EMBEDDER: the int8 MiniLM (made once, cached, its own model id), registries
re-embedded when the embedder changes (never mixed, the record and report name it), and int8
rankings close to fp32 on the fixtures (the real model)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from registry.request import ShortlistRequest
from tests.conftest import FIXTURES, CountingEmbedder
from tests.cores import new_core

PARITY_SETS = ("eval_office", "eval_weather")
# Stated tolerances for int8 against fp32 on the fixtures (44 queries, 36 tools). Measured when
# written: query/tool cosine to fp32 >= 0.985 (mean 0.995), top-1 tool the same for 43 of 44
# queries, hybrid found@1 equal on both sets. One query of 22 is 4.5 points.
MIN_COSINE = 0.97
MIN_MEAN_COSINE = 0.99
MIN_TOP1_AGREEMENT = 0.90
MAX_FOUND1_DROP = 0.05


@pytest.fixture(scope="session")
def int8_cache(minilm_cache: Path) -> Path:
    """The session's fp32 export plus its int8 quantisation (a few seconds, once)."""
    from registry.index.minilm_export import ensure_embedder_onnx

    ensure_embedder_onnx(minilm_cache, "minilm-int8")
    return minilm_cache


@pytest.fixture(scope="session")
def minilm_int8(int8_cache: Path):
    from registry.index.embedders import load_minilm

    return load_minilm(int8_cache, embedder="minilm-int8")


def _fixture_texts(name: str) -> tuple[list[str], list[str]]:
    from registry.offline.datasets import load_dataset

    data = load_dataset(FIXTURES / name)
    return [t.text() for t in data.tools], [q.query for q in data.queries]


def test_int8_file_is_cached_by_content_hash_with_its_own_model_id(
    int8_cache: Path, minilm, minilm_int8
) -> None:
    from registry.index.embed import MINILM_NAME, manifest_path, sha256_file
    from registry.index.minilm_export import INT8_FILE, INT8_FORMAT, ensure_embedder_onnx

    folder = int8_cache / MINILM_NAME
    int8 = folder / INT8_FILE
    manifest = json.loads(manifest_path(int8).read_text())
    assert manifest["format"] == INT8_FORMAT
    assert manifest["source_onnx_sha256"] == sha256_file(folder / "model.onnx")
    assert manifest["onnx_sha256"] == sha256_file(int8)
    assert manifest["quantization"] == {
        "method": "quantize_dynamic", "weight_type": "QInt8", "per_channel": True
    }
    assert int8.stat().st_size < (folder / "model.onnx").stat().st_size / 3

    before = int8.stat().st_mtime_ns
    assert ensure_embedder_onnx(int8_cache, "minilm-int8") == int8
    assert int8.stat().st_mtime_ns == before  # reused, not quantised again

    assert minilm_int8.model_id.startswith(f"{MINILM_NAME}/{INT8_FORMAT}/")
    assert minilm.model_id.startswith(f"{MINILM_NAME}/onnx-fp32/")
    assert minilm_int8.model_id != minilm.model_id and minilm_int8.dim == minilm.dim == 384


def test_int8_is_quantised_again_when_the_fp32_export_changes(
    int8_cache: Path, tmp_path: Path
) -> None:
    from registry.index.embed import MINILM_NAME, manifest_path, sha256_file
    from registry.index.minilm_export import INT8_FILE, ensure_embedder_onnx

    folder = tmp_path / "cache" / MINILM_NAME
    shutil.copytree(int8_cache / MINILM_NAME, folder)
    # As if the int8 file came from another fp32 export: it must not be served as this one's.
    meta_path = manifest_path(folder / INT8_FILE)
    meta = json.loads(meta_path.read_text())
    meta["source_onnx_sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    os.utime(folder / INT8_FILE, ns=(1, 1))

    path = ensure_embedder_onnx(tmp_path / "cache", "minilm-int8")
    again = json.loads(meta_path.read_text())
    assert again["source_onnx_sha256"] == sha256_file(folder / "model.onnx")
    assert path.stat().st_mtime_ns != 1 and again["onnx_sha256"] == sha256_file(path)


def test_int8_rankings_match_fp32_within_tolerance(minilm, minilm_int8) -> None:
    agree, total = 0, 0
    for name in PARITY_SETS:
        tools, queries = _fixture_texts(name)
        fp32_tools, int8_tools = minilm.embed_documents(tools), minilm_int8.embed_documents(tools)
        fp32_q = np.stack([minilm.embed_query(q) for q in queries])
        int8_q = np.stack([minilm_int8.embed_query(q) for q in queries])
        cos = np.concatenate([(fp32_tools * int8_tools).sum(1), (fp32_q * int8_q).sum(1)])
        assert cos.min() >= MIN_COSINE and cos.mean() >= MIN_MEAN_COSINE, (name, cos.min())
        top_fp32 = (fp32_q @ fp32_tools.T).argmax(1)
        top_int8 = (int8_q @ int8_tools.T).argmax(1)
        agree += int((top_fp32 == top_int8).sum())
        total += len(queries)
    assert agree / total >= MIN_TOP1_AGREEMENT, f"top-1 agreement {agree}/{total}"


def test_int8_found_at_1_within_tolerance_of_fp32(minilm, minilm_int8) -> None:
    from registry.offline.evaluate import evaluate_ranked
    from registry.offline.score_tables import score_table
    from registry.offline.tables import rank_table

    for name in PARITY_SETS:
        found = {}
        for label, embedder in (("fp32", minilm), ("int8", minilm_int8)):
            ranked = rank_table(score_table(FIXTURES / name, embedder), "hybrid")
            found[label] = evaluate_ranked(ranked, {})["found_at"]["1"]
        assert found["fp32"] > 0.5, found  # the fixture is meaningful for the model
        assert found["int8"] >= found["fp32"] - MAX_FOUND1_DROP, (name, found)


def test_switching_embedder_reembeds_every_registry_never_mixed(
    int8_cache: Path, tmp_path: Path, bor_policy, minilm, minilm_int8
) -> None:
    from registry.index.embedders import default_embedder
    from registry.settings import EmbedderArgs, Settings

    payload = json.loads((FIXTURES / "eval_office" / "tools.json").read_text())
    n_tools = len(payload)
    settings = Settings(
        data_dir=tmp_path / "data", embedder_cache_dir=int8_cache, demo_registry=None
    )
    counters: list[CountingEmbedder] = []

    def run(embedder: str, write: bool = False) -> tuple[CountingEmbedder, np.ndarray, str]:
        def factory(s: EmbedderArgs) -> CountingEmbedder:
            counters.append(CountingEmbedder(default_embedder(s)))
            return counters[-1]

        core = new_core(settings, embedder_factory=factory, bor_policy=bor_policy, embedder=embedder)
        try:
            if write:
                core.put_registry("office", payload)
            snap = core.snapshot("office")
            assert core.shortlist(ShortlistRequest("office", "email the report to bob")).tools
            return counters[-1], np.array(snap.dense.embeddings), snap.embedder
        finally:
            core.close()

    first, fp32_vectors, fp32_id = run("minilm", write=True)
    assert first.documents == n_tools and fp32_id == minilm.model_id
    record = json.loads(next((tmp_path / "data").rglob("v00000001.json")).read_text())
    assert record["embedder"] == minilm.model_id  # the stored version names its embedder

    second, int8_vectors, int8_id = run("minilm-int8")
    assert int8_id == minilm_int8.model_id
    assert second.documents == n_tools  # every tool re-embedded: nothing reused from fp32
    texts, _ = _fixture_texts("eval_office")
    assert np.allclose(int8_vectors, minilm_int8.embed_documents(texts), atol=1e-5)
    assert not np.allclose(int8_vectors, fp32_vectors, atol=1e-3)

    third, back, back_id = run("minilm")
    assert back_id == fp32_id and third.documents == 0  # fp32 vectors cached under their own id
    assert np.array_equal(back, fp32_vectors)


def test_a_new_version_never_reuses_another_embedders_vectors(
    hashing_embedder, tmp_path: Path
) -> None:
    from registry.index.embed import HashingEmbedder
    from registry.index.snapshot import build_snapshot
    from registry.store.local import LocalStore
    from registry.tools import parse_tools
    from tests.conftest import weather_tools

    class Other(HashingEmbedder):
        def __init__(self) -> None:
            super().__init__(dim=384)
            self.model_id = "other-embedder"

    tools = parse_tools(weather_tools())
    store = LocalStore(tmp_path / "store")
    old = build_snapshot("r", 1, tools, hashing_embedder, store, hnsw_min_tools=10**6)
    other = CountingEmbedder(Other())
    new = build_snapshot("r", 2, tools, other, store, hnsw_min_tools=10**6, previous=old)
    assert other.documents == len(tools) and new.embedder == "other-embedder"
    assert old.embedder == hashing_embedder.model_id


def test_registry_report_names_the_embedder(client) -> None:
    from tests.conftest import weather_tools

    assert client.put("/registries/w", json=weather_tools()).status_code == 200
    body = client.get("/registries/w").json()
    assert body["embedder"] == "hashing-blake2b/dim384"
