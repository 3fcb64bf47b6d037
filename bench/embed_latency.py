"""Single-query embedding latency: ONNX (unpadded), ONNX padded to 128, sentence-transformers.

    python bench/embed_latency.py [--cache-dir DIR] [--n 300] [--threads 1]

Exports the MiniLM ONNX file into the cache directory on first use (needs torch once).
Prints p50/p95/p99 in milliseconds. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tokenizers import Tokenizer

from registry.index.embed import ONNX_OUTPUT_NAME, TOKENIZER_FILE
from registry.index.embedders import load_minilm

QUERIES = [
    "what's the weather in Paris tomorrow",
    "send an email to the design team about the launch delay",
    "convert 250 dollars to euros",
    "create a jira ticket for the login bug",
    "find flights from Boston to Denver next Friday under $300",
    "summarise the last five messages in the #incidents slack channel",
    "book a table for two at 7pm",
    "what's on my calendar this afternoon",
    "search the knowledge base for the VPN setup guide and share it with Maria",
    "translate 'where is the train station' into Japanese",
    "list open pull requests that touch the billing service",
    "get the current price of AAPL",
    "restart the staging database",
    "play some jazz",
    "how many unread emails do I have from my manager this week, and which ones are urgent?",
    "set a reminder to call the dentist on Monday at 9",
    "upload the quarterly report pdf to the shared drive folder Finance/2024",
    "what is 17% of 2,340",
]


def _percentiles(samples_s: list[float]) -> str:
    ms = np.asarray(samples_s) * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    mean = statistics.fmean(ms)
    return f"p50 {p50:6.2f} ms   p95 {p95:6.2f} ms   p99 {p99:6.2f} ms   mean {mean:6.2f} ms"


def _time(fn: Callable[[str], object], n: int, warmup: int = 20) -> list[float]:
    for i in range(warmup):
        fn(QUERIES[i % len(QUERIES)])
    out = []
    for i in range(n):
        q = QUERIES[i % len(QUERIES)]
        t0 = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default_cache = Path(tempfile.gettempdir()) / "shortlist-embedder"
    parser.add_argument("--cache-dir", type=Path, default=default_cache)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    embedder = load_minilm(args.cache_dir, threads=args.threads)
    print(f"{embedder.model_id}, {args.threads} thread(s), {args.n} single queries")
    lengths = [len(embedder._query_feeds(q)["input_ids"][0]) for q in QUERIES]
    mean_len = statistics.fmean(lengths)
    print(f"query lengths: {min(lengths)}-{max(lengths)} tokens (mean {mean_len:.1f})")
    print(f"onnx, unpadded            {_percentiles(_time(embedder.embed_query, args.n))}")

    # The gotcha: the shipped tokenizer.json pads every input to 128 tokens.
    padded_tok = Tokenizer.from_file(str(args.cache_dir / "all-MiniLM-L6-v2" / TOKENIZER_FILE))
    names = embedder._input_names

    def padded(q: str) -> np.ndarray:
        enc = padded_tok.encode(q)
        arrays = {
            "input_ids": np.asarray([enc.ids], dtype=np.int64),
            "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
        }
        feeds = {k: arrays[k] for k in names}
        out: np.ndarray = embedder._session.run([ONNX_OUTPUT_NAME], feeds)[0]
        return out

    assert len(padded_tok.encode("x").ids) == 128
    print(f"onnx, padded to 128       {_percentiles(_time(padded, args.n))}")

    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers     (torch not installed, skipped)")
        return
    from registry.index.minilm_export import minilm_model_dir

    torch.set_num_threads(args.threads)
    st = SentenceTransformer(str(minilm_model_dir()), device="cpu")

    def st_encode(q: str) -> np.ndarray:
        out: np.ndarray = st.encode(q, convert_to_numpy=True, show_progress_bar=False)
        return out

    print(f"sentence-transformers     {_percentiles(_time(st_encode, args.n))}")


if __name__ == "__main__":
    main()
