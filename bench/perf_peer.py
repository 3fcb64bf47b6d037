"""What bench/perf.py compares the service with, and the int8 quality check (issue 15).

* :func:`peer_latency`: the peer baseline, what a LangGraph bigtool user would write in-process:
  the same all-MiniLM-L6-v2 ONNX fp32 file through onnxruntime + tokenizers (mean-pooled and
  normalised inside the graph), tool vectors in a FAISS ``IndexFlatIP``, one top-k search per
  query. No HTTP, no validation, no depth policy, no hybrid scorer: the floor of "embed + search".
* :func:`found_at_1`: hybrid-scorer found@1 of an embedder on a dev set, computed by the
  project's own evaluation pipeline (``score_table -> rank_table -> evaluate_ranked``, as
  ``shortlist evaluate`` does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PEER_K = 5


class BigtoolStyleRetriever:
    """Minimal in-process MiniLM + FAISS top-k, written the way a library user would.

    Args:
        onnx_path: the fp32 MiniLM export (inputs ids/mask/types, output ``sentence_embedding``).
        tokenizer_path: its ``tokenizer.json``.
        tool_texts: one text per tool (name + description), indexed once.
        threads: onnxruntime intra-op threads (1, like one request of the service).
    """

    def __init__(
        self, onnx_path: Path, tokenizer_path: Path, tool_texts: Sequence[str], threads: int = 1
    ) -> None:
        import faiss
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        vectors = np.concatenate([self.embed(text) for text in tool_texts])
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)

    def embed(self, text: str) -> np.ndarray:
        enc = self.tokenizer.encode(text)
        feeds = {
            "input_ids": np.array([enc.ids], dtype=np.int64),
            "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
        }
        return np.asarray(self.session.run(None, feeds)[0], dtype=np.float32)

    def top_k(self, query: str, k: int = PEER_K) -> list[int]:
        _, ids = self.index.search(self.embed(query), k)
        return [int(i) for i in ids[0]]


def tool_text(tool: dict) -> str:
    return f"{tool.get('name', '')}: {tool.get('description', '')}"


def peer_latency(
    embedder_cache: Path, tools: list[dict], queries: list[str], n: int = 1000
) -> dict[str, float]:
    """p50/p95/p99 (ms) and queries/s of :class:`BigtoolStyleRetriever` on one thread."""
    from registry.index.embed import MINILM_NAME, ONNX_FILE, TOKENIZER_FILE

    folder = embedder_cache / MINILM_NAME
    retriever = BigtoolStyleRetriever(
        folder / ONNX_FILE, folder / TOKENIZER_FILE, [tool_text(t) for t in tools]
    )
    for q in queries[:50]:
        retriever.top_k(q)
    times = []
    cpu = time.process_time()
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        retriever.top_k(queries[i % len(queries)])
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    cpu_ms = 1000 * (time.process_time() - cpu) / n
    ms = np.array(times) * 1000
    return {
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
        "qps": n / elapsed,
        "cpu_ms": cpu_ms,
    }


def found_at_1(data_dir: Path, embedder: object, max_queries: int | None) -> float:
    """Hybrid-scorer found@1 (share of queries whose top tool is gold) on one dev set."""
    from registry.offline.evaluate import evaluate_ranked
    from registry.offline.score_tables import score_table
    from registry.offline.tables import rank_table

    table = score_table(data_dir, embedder, max_queries=max_queries)  # type: ignore[arg-type]
    return float(evaluate_ranked(rank_table(table, "hybrid"), {})["found_at"]["1"])


def quality(
    data_root: Path, embedder_cache: Path, sets: Sequence[str], max_queries: int | None
) -> dict[str, dict[str, float]]:
    """found@1 of fp32 and int8 per dev set: ``{set: {"minilm": x, "minilm-int8": y, "n": q}}``."""
    from registry.index.minilm_export import load_minilm

    out: dict[str, dict[str, float]] = {}
    embedders = {name: load_minilm(embedder_cache, embedder=name) for name in ("minilm", "minilm-int8")}  # type: ignore[arg-type]
    for name in sets:
        lines = (data_root / name / "queries.jsonl").read_text().splitlines()
        row: dict[str, float] = {"n": float(min(len(lines), max_queries or len(lines)))}
        for label, embedder in embedders.items():
            row[label] = found_at_1(data_root / name, embedder, max_queries)
        out[name] = row
        print(f"found@1 {name}: {json.dumps(row)}", flush=True)
    return out
