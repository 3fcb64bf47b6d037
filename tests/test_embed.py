"""Embedders: the real MiniLM ONNX export against sentence-transformers, plus the hashing fake."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from registry.errors import ArtifactError
from registry.index.embed import (
    MINILM_DIM,
    MINILM_NAME,
    TOKENIZER_FILE,
    Embedder,
    HashingEmbedder,
    OnnxEmbedder,
    manifest_path,
)
from registry.index.embedders import load_minilm
from registry.index.minilm_export import ensure_minilm_onnx, minilm_model_dir

LONG = " ".join(
    f"step {i}: call the inventory tool, then reconcile the warehouse ledger." for i in range(60)
)  # ~900 tokens: truncated to 256 by both implementations

SENTENCES = [
    "",
    "hi",
    "weather",
    "What's the weather in Paris tomorrow?",
    "send an email to bob@example.com about the Q3 report",
    "Create a GitHub issue titled 'crash on start-up' in repo acme/api",
    "convert 250 USD to EUR",
    "Ünïcödé café naïve façade",
    "東京の天気を教えてください",
    "🚀🔥 launch the rocket 🚀",
    "SELECT * FROM users WHERE id = 42;",
    "get_current_weather(location: str, unit: Literal['c', 'f']) -> dict",
    "Book a table for four at an Italian restaurant near Union Square at 7pm on Friday.",
    "   leading and trailing whitespace   ",
    "UPPER CASE QUERY ABOUT STOCK PRICES",
    "résumé parsing: extract name, e-mail, phone, skills and years of experience",
    "Translate 'good morning' into German, French and Spanish.",
    "a " * 300,
    LONG,
    "List all open pull requests assigned to me that touch billing and have failing CI.",
]


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real export (subprocess, numpy + onnx) shared by the whole session."""
    cache = tmp_path_factory.mktemp("embedder-cache")
    return ensure_minilm_onnx(cache).parent


@pytest.fixture(scope="session")
def minilm(export_dir: Path) -> OnnxEmbedder:
    return load_minilm(export_dir.parent, threads=1)


@pytest.fixture(scope="session")
def st_model() -> Iterator[object]:
    import sentence_transformers  # the [test] extra installs [train]
    yield sentence_transformers.SentenceTransformer(str(minilm_model_dir()), device="cpu")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# --- (1) parity with sentence-transformers ---------------------------------------------------


def test_onnx_matches_sentence_transformers(minilm: OnnxEmbedder, st_model: object) -> None:
    ref = st_model.encode(  # type: ignore[attr-defined]
        SENTENCES, batch_size=8, convert_to_numpy=True
    )
    ours = minilm.embed_documents(SENTENCES, batch_size=8)
    cos = (ours * _unit(ref)).sum(axis=1)
    assert cos.min() >= 0.9999, dict(zip(SENTENCES, cos.round(6), strict=True))
    assert np.allclose(ours, ref, atol=1e-4)
    # The single-query path (no padding at all) agrees too.
    single = np.stack([minilm.embed_query(s) for s in SENTENCES])
    assert ((single * _unit(ref)).sum(axis=1)).min() >= 0.9999


def test_long_input_is_truncated_to_256_tokens(minilm: OnnxEmbedder) -> None:
    assert minilm._query_feeds(LONG)["input_ids"].shape == (1, 256)
    # Whatever follows token 256 cannot change the embedding.
    more = minilm.embed_query(LONG + " extra words")
    assert np.allclose(minilm.embed_query(LONG), more, atol=1e-6)


# --- (2) query path == batch path, order preserved -------------------------------------------


def test_query_equals_single_document(minilm: OnnxEmbedder) -> None:
    for q in ("book a flight to Lisbon", "", LONG):
        assert np.allclose(minilm.embed_query(q), minilm.embed_documents([q])[0], atol=1e-5)


def test_batch_order_preserved_across_lengths(minilm: OnnxEmbedder) -> None:
    texts = [LONG, "x", "medium length sentence about invoices", "a " * 120, "hi", LONG[:300]]
    batched = minilm.embed_documents(texts, batch_size=2)  # sorting by length reorders batches
    one_by_one = np.stack([minilm.embed_query(t) for t in texts])
    assert np.allclose(batched, one_by_one, atol=1e-5)
    assert np.allclose(minilm.embed_documents(texts, batch_size=64), one_by_one, atol=1e-5)


# --- (3) the padding gotcha ------------------------------------------------------------------


def test_query_is_not_padded(minilm: OnnxEmbedder, export_dir: Path) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(export_dir / TOKENIZER_FILE))
    assert len(raw.encode("find cheap flights").ids) == 128  # what the shipped file does
    feeds = minilm._query_feeds("find cheap flights")
    assert feeds["input_ids"].shape[1] < 20
    assert feeds["attention_mask"].all()
    assert all(v.dtype == np.int64 for v in feeds.values())


# --- (4) shapes, dtypes, norms ---------------------------------------------------------------


def test_shapes_dtype_norms(minilm: OnnxEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.dim == MINILM_DIM
    assert minilm.model_id.startswith(f"{MINILM_NAME}/onnx-fp32/")
    assert len(minilm.model_id.split("/")[2]) == 12 and minilm.model_id.split("/")[3].startswith("tok-")

    q = minilm.embed_query("turn off the lights")
    assert q.shape == (MINILM_DIM,) and q.dtype == np.float32
    assert abs(float(np.linalg.norm(q)) - 1.0) < 1e-5

    docs = minilm.embed_documents(SENTENCES[:5], batch_size=2)
    assert docs.shape == (5, MINILM_DIM) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)

    empty = minilm.embed_documents([])
    assert empty.shape == (0, MINILM_DIM) and empty.dtype == np.float32

    with pytest.raises(ValueError):
        minilm.embed_documents(["a"], batch_size=0)
    with pytest.raises(TypeError):
        minilm.embed_documents("not a list")


def test_semantics_sanity(minilm: OnnxEmbedder) -> None:
    q = minilm.embed_query("what's the weather like in Berlin")
    d = minilm.embed_documents(["get the weather forecast for a city", "send an email"])
    assert d[0] @ q > d[1] @ q + 0.2


# --- (5) export cache ------------------------------------------------------------------------


def test_ensure_reuses_existing_export(export_dir: Path) -> None:
    onnx_path = export_dir / "model.onnx"
    before = onnx_path.stat().st_mtime_ns
    assert ensure_minilm_onnx(export_dir.parent) == onnx_path
    assert onnx_path.stat().st_mtime_ns == before
    assert (export_dir / TOKENIZER_FILE).is_file()
    manifest = json.loads(manifest_path(onnx_path).read_text())
    assert manifest["opset"] == 17 and len(manifest["onnx_sha256"]) == 64
    assert len(manifest["source_safetensors_sha256"]) == 64
    assert manifest["builder"].startswith("registry.index.minilm_graph")
    assert "torch_version" not in manifest


def test_corrupt_export_raises(export_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "cache" / MINILM_NAME
    shutil.copytree(export_dir, copy)
    with open(copy / "model.onnx", "r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match="corrupt") as err:
        ensure_minilm_onnx(tmp_path / "cache")
    # One line naming the file and the command that makes it again; that command does.
    message = err.value.message
    command = f"python -m registry.index.export_embedder --out {copy / 'model.onnx'}"
    assert "\n" not in message and str(copy / "model.onnx") in message
    assert f"rebuild it with `{command}`" in message
    subprocess.run([sys.executable, *command.split()[1:]], check=True, capture_output=True)
    assert ensure_minilm_onnx(tmp_path / "cache") == copy / "model.onnx"

    (copy / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(ArtifactError, match="cannot load ONNX"):
        OnnxEmbedder(copy / "model.onnx", copy / TOKENIZER_FILE)
    with pytest.raises(ArtifactError, match="does not exist"):
        OnnxEmbedder(copy / "missing.onnx", copy / TOKENIZER_FILE)


def test_export_failure_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_python = tmp_path / "python-without-onnx"
    fake_python.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'onnx'\" >&2\nexit 1\n"
    )
    fake_python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake_python))
    with pytest.raises(ArtifactError) as info:
        ensure_minilm_onnx(tmp_path / "cache")
    assert "It needs onnx and safetensors: pip install tool-shortlist" in info.value.message
    assert "No module named 'onnx'" in info.value.message


def test_runtime_never_imports_torch(export_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from registry.index.embedders import load_minilm; "
        f"e = load_minilm(Path({str(export_dir.parent)!r})); e.embed_query('x'); "
        "heavy = ('torch', 'transformers', 'sentence_transformers'); "
        "bad = [m for m in heavy if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- (6) hashing fake ------------------------------------------------------------------------


def test_hashing_embedder_basics() -> None:
    emb = HashingEmbedder()
    assert isinstance(emb, Embedder)
    assert emb.dim == 384 and emb.model_id == "hashing-blake2b/dim384"

    q = emb.embed_query("Weather forecast for Paris")
    assert q.shape == (384,) and q.dtype == np.float32
    assert abs(float(np.linalg.norm(q)) - 1.0) < 1e-6
    assert np.array_equal(q, HashingEmbedder().embed_query("weather FORECAST for paris"))

    docs = emb.embed_documents(["paris weather today", "send an email to bob", "", "!!!"])
    assert docs.shape == (4, 384) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0)
    assert docs[0] @ q > docs[1] @ q
    assert emb.embed_documents([]).shape == (0, 384)

    small = HashingEmbedder(dim=16)
    assert small.embed_query("x").shape == (16,) and small.model_id != emb.model_id
    with pytest.raises(ValueError):
        HashingEmbedder(dim=0)
