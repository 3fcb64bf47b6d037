"""A disk cache of text embeddings for benchmarks: each text is embedded once across runs.

Benchmarks over the training corpus embed the same ~11,000 tool texts and ~7,000 requests in
the score tables, the carving sources and the in-process engines; on two shared cores each
pass costs minutes. :class:`DiskCachedEmbedder` wraps the real embedder (same ``model_id``, so
score-table keys do not change) and answers a text it has seen from ``<dir>/<model>.npz``.
``embed_documents`` and ``embed_query`` agree up to float rounding (``OnnxEmbedder``), so one
cache serves both.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_SAVE_EVERY = 256  # new query vectors between saves


def disk_cached(inner: Any, directory: Path | None) -> Any:
    """``inner`` behind a :class:`DiskCachedEmbedder` in ``directory`` (None: ``inner`` as is)."""
    return inner if directory is None else DiskCachedEmbedder(inner, directory)


class DiskCachedEmbedder:
    """``embed_query`` / ``embed_documents`` of ``inner``, memoised on disk."""

    def __init__(self, inner: Any, directory: Path) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        tag = hashlib.sha256(self.model_id.encode()).hexdigest()[:12]
        self.path = Path(directory) / f"embeddings-{tag}.npz"
        self._vectors: dict[str, np.ndarray] = {}
        self._unsaved = 0
        if self.path.is_file():
            with np.load(self.path, allow_pickle=False) as z:
                self._vectors = dict(zip(z["keys"].tolist(), z["vectors"]))

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def embed_query(self, text: str) -> np.ndarray:
        key = self._key(text)
        hit = self._vectors.get(key)
        if hit is None:
            hit = np.asarray(self.inner.embed_query(text), dtype=np.float32)
            self._vectors[key] = hit
            self._unsaved += 1
            if self._unsaved >= _SAVE_EVERY:
                self.save()
        return hit

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._vectors))
        if missing:
            by_key = dict(zip(keys, texts))
            vecs = np.asarray(self.inner.embed_documents([by_key[k] for k in missing], batch_size=batch_size))
            self._vectors.update(zip(missing, vecs.astype(np.float32)))
            self._unsaved += len(missing)
            self.save()
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[k] for k in keys])

    def save(self) -> None:
        if not self._unsaved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():  # another process may have added texts meanwhile: keep them
            with np.load(self.path, allow_pickle=False) as z:
                for key, vector in zip(z["keys"].tolist(), z["vectors"]):
                    self._vectors.setdefault(key, vector)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp.npz")
        keys = list(self._vectors)
        np.savez(tmp, keys=np.array(keys, dtype=np.str_), vectors=np.stack([self._vectors[k] for k in keys]))
        tmp.replace(self.path)
        self._unsaved = 0
