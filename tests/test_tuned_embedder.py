"""The tuned embedder: adapter training on a tiny fixture, its ONNX export, the artifact checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from registry.errors import ArtifactError
from registry.index.embed import OnnxEmbedder
from registry.index.embedders import load_minilm
from registry.index.minilm_export import (
    TRAIN_EMBEDDER_COMMAND,
    TUNED_FILE,
    check_adapter,
    ensure_embedder_onnx,
    load_adapter_weight,
    minilm_model_dir,
)
from registry.offline.adapter import AdapterRecipe, apply_adapter, fit_adapter
from registry.offline.corpus_vectors import SourceVectors
from registry.offline.ranking import score_source
from registry.offline.train_embedder import ADAPTER_FILE, write_adapter

SENTENCES = [
    "save this summary as notes.md",
    "write_file: Create a new file or completely overwrite an existing file with new content.",
    "What's the weather in Paris tomorrow?",
    "東京の天気を教えてください",
    "a " * 300,
]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _source(name: str, rng: np.random.Generator, n_tools: int = 30, n_queries: int = 60) -> SourceVectors:
    """Query and tool share a topic in the first 8 dims; the last 8 are loud nuisance (no signal).

    Plain cosine is dominated by the nuisance dims; a map that damps them finds the gold tool.
    """
    topics = rng.normal(size=(n_tools, 8))
    tools = np.hstack([topics, 3.0 * rng.normal(size=(n_tools, 8))])
    gold = tuple((int(i),) for i in rng.integers(0, n_tools, size=n_queries))
    signal = np.stack([topics[g[0]] for g in gold]) + 0.3 * rng.normal(size=(n_queries, 8))
    queries = np.hstack([signal, 3.0 * rng.normal(size=(n_queries, 8))])
    bm25 = np.zeros((n_queries, n_tools), np.float32)
    return SourceVectors(name, _unit(tools), _unit(queries), bm25, gold)


def test_adapter_training_loss_falls_and_generalises_to_an_unseen_source() -> None:
    rng = np.random.default_rng(0)
    dim = 16
    train = [_source(f"s{i}", rng) for i in range(3)]
    held_out = _source("held_out", rng)
    recipe = AdapterRecipe(steps=80, batch=32, lr=5e-2, temperature=0.1, identity_pull=0.0)
    fit = fit_adapter(train, recipe)
    assert len(fit.losses) >= 2 and fit.losses[-1] < 0.8 * fit.losses[0]
    assert fit.weight.shape == (dim, dim) and fit.weight.dtype == np.float32
    before = score_source(held_out, None, 0.0).found_at_1
    after = score_source(held_out, fit.weight, 0.0).found_at_1
    assert after > before + 0.2
    again = fit_adapter(train, recipe)  # deterministic for one recipe
    assert np.array_equal(again.weight, fit.weight)


def test_apply_adapter_identity_and_unit_rows() -> None:
    x = _unit(np.random.default_rng(1).normal(size=(5, 8)))
    assert apply_adapter(x, None) is x
    np.testing.assert_allclose(apply_adapter(x, np.eye(8, dtype=np.float32)), x, atol=1e-6)
    y = apply_adapter(x, np.diag(np.arange(1, 9)).astype(np.float32))
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-6)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(2)
    weight = (np.eye(384) + 0.05 * rng.normal(size=(384, 384))).astype(np.float32)
    out = tmp_path_factory.mktemp("adapter")
    write_adapter(out, weight, {"datasets": {"fixture": {}}, "command": TRAIN_EMBEDDER_COMMAND})
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedder-cache")


@pytest.fixture(scope="module")
def tuned(adapter_dir: Path, cache: Path) -> OnnxEmbedder:
    return load_minilm(cache, embedder="tuned", adapter_dir=adapter_dir)


def test_manifest_is_checked_at_load(adapter_dir: Path) -> None:
    info = check_adapter(adapter_dir)
    manifest = json.loads((adapter_dir / "manifest.json").read_text())
    assert info["sha256"] == manifest["sha256"] and manifest["file"] == ADAPTER_FILE
    assert load_adapter_weight(adapter_dir).shape == (384, 384)


def test_tuned_onnx_matches_torch_within_1e_4(tuned: OnnxEmbedder, adapter_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    st.max_seq_length = 256
    base = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)
    expected = apply_adapter(base.astype(np.float32), load_adapter_weight(adapter_dir))
    got = tuned.embed_documents(SENTENCES)
    assert np.max(np.abs(got - expected)) < 1e-4
    assert "tool-adapter" in tuned.model_id
    plain = (base @ base.T)[0, 1]
    assert abs(float(got[0] @ got[1]) - float(plain)) > 1e-3  # the adapter is really in the graph


def test_tuned_int8_is_quantised_from_the_tuned_export(
    tuned: OnnxEmbedder, adapter_dir: Path, cache: Path
) -> None:
    int8_path = ensure_embedder_onnx(cache, "tuned-int8", adapter_dir)
    manifest = json.loads(int8_path.with_name(int8_path.name + ".json").read_text())
    assert manifest["model"].endswith("tool-adapter")
    from registry.index.embed import sha256_file

    assert manifest["source_onnx_sha256"] == sha256_file(cache / "all-MiniLM-L6-v2" / TUNED_FILE)
    int8 = load_minilm(cache, embedder="tuned-int8", adapter_dir=adapter_dir)
    a, b = tuned.embed_documents(SENTENCES), int8.embed_documents(SENTENCES)
    assert float(np.min(np.sum(a * b, axis=1))) > 0.95


def test_a_missing_manifest_names_the_file_and_the_command(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as err:
        ensure_embedder_onnx(tmp_path / "cache", "tuned", tmp_path / "nowhere")
    assert str(tmp_path / "nowhere" / "manifest.json") in err.value.message
    assert TRAIN_EMBEDDER_COMMAND in err.value.message


def test_corrupt_or_missing_weights_name_the_file_and_the_command(adapter_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text((adapter_dir / "manifest.json").read_text())
    with pytest.raises(ArtifactError, match="do not exist") as err:
        check_adapter(broken)
    assert str(broken / ADAPTER_FILE) in err.value.message and TRAIN_EMBEDDER_COMMAND in err.value.message
    data = bytearray((adapter_dir / ADAPTER_FILE).read_bytes())
    data[-1] ^= 0xFF
    (broken / ADAPTER_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupt") as err:
        ensure_embedder_onnx(tmp_path / "cache", "tuned", broken)
    assert str(broken / ADAPTER_FILE) in err.value.message and TRAIN_EMBEDDER_COMMAND in err.value.message
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot read"):
        check_adapter(broken)


# -- the default: tuned, with the relevance gate fitted on its scores ----------------------------


def test_the_default_embedder_is_the_tuned_one_with_its_own_relevance_gate(tmp_path: Path) -> None:
    from registry.serving.relevance import RelevanceModel
    from registry.settings import EMBEDDERS, Settings

    assert Settings().embedder == "tuned"
    gates = {name: Settings.model_validate({"embedder": name}).resolved_relevance_model() for name in EMBEDDERS}
    assert gates["tuned"] == gates["tuned-int8"] and gates["minilm"] == gates["minilm-int8"]
    assert gates["tuned"] != gates["minilm"]
    for name, path in gates.items():
        # each shipped gate loads and says which embedder's scores it was fitted on
        RelevanceModel.load(path)
        assert json.loads(path.read_text(encoding="utf-8"))["embedder"] == name.removesuffix("-int8")
    # an explicit file wins; another directory is honoured; an empty value means the default
    mine = tmp_path / "gate.json"
    assert Settings(relevance_model=mine).resolved_relevance_model() == mine
    assert Settings(relevance_dir=tmp_path).resolved_relevance_model() == tmp_path / gates["tuned"].name
    assert Settings.model_validate({"relevance_model": ""}).resolved_relevance_model() == gates["tuned"]


def test_a_missing_or_broken_relevance_model_names_the_file_and_the_command(tmp_path: Path) -> None:
    from registry.serving.relevance import RelevanceModel
    from registry.settings import Settings

    path = Settings(relevance_dir=tmp_path).resolved_relevance_model()
    with pytest.raises(ArtifactError) as err:
        RelevanceModel.load(path)
    assert str(path) in err.value.message and "scripts/calibrate_relevance.py" in err.value.message
    (tmp_path / path.name).write_text("{not json", encoding="utf-8")
    with pytest.raises(ArtifactError, match="rebuild it with"):
        RelevanceModel.load(path)


def test_a_missing_relevance_model_is_a_start_up_error(make_core, tmp_path: Path) -> None:
    core = make_core(relevance_dir=tmp_path / "nowhere")  # readiness reports it, naming file and command
    assert not core.ready and core.load_error
    assert "nowhere" in core.load_error and "calibrate_relevance.py" in core.load_error


def test_the_announced_export_path_is_the_file_the_export_writes(adapter_dir: Path, cache: Path) -> None:
    from registry.index.minilm_export import embedder_onnx_path

    for name in ("tuned", "tuned-int8"):  # what `shortlist serve` checks to say "first start"
        assert ensure_embedder_onnx(cache, name, adapter_dir) == embedder_onnx_path(cache, name)
