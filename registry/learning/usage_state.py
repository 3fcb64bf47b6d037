"""The usage memory's per-registry state and its one-blob (``.npz``) encoding."""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

__all__ = ["STATE_FORMAT", "RegistryMemory", "ToolMemory", "decode_state", "encode_state"]

STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ToolMemory:
    """One tool's entries; replaced, never mutated, so readers need no lock."""

    vectors: np.ndarray  # (n, dim) float32, unit rows
    counts: np.ndarray  # (n,) float32 net evidence
    seen: np.ndarray  # (n,) int64 sequence number of the last event that touched the entry
    positive: np.ndarray = field(init=False)  # max(counts, 0), what a lift reads
    positive_sum: float = field(init=False)

    def __post_init__(self) -> None:
        positive = np.maximum(self.counts, 0.0).astype(np.float32)
        object.__setattr__(self, "positive", positive)
        object.__setattr__(self, "positive_sum", float(positive.sum()))


@dataclass
class RegistryMemory:
    """Everything the memory holds for one registry."""

    tools: dict[str, ToolMemory] = field(default_factory=dict)
    entries: int = 0
    counted: int = 0
    callers: dict[str, int] = field(default_factory=dict)  # "" is the anonymous caller
    skipped: dict[str, int] = field(default_factory=dict)
    seq: int = 0
    watermark: float = 0.0  # newest ``received`` folded
    wiped_at: float = 0.0
    seen_ids: OrderedDict[str, float] = field(default_factory=OrderedDict)


def encode_state(reg: RegistryMemory) -> bytes:
    """``reg`` as one ``.npz`` blob: vectors as float16, the rest as JSON."""
    names = list(reg.tools)
    mems = [reg.tools[n] for n in names]
    meta = {
        "format": STATE_FORMAT,
        "tools": names,
        "sizes": [len(m.counts) for m in mems],
        "counted": reg.counted,
        "callers": reg.callers,
        "skipped": reg.skipped,
        "seq": reg.seq,
        "watermark": reg.watermark,
        "wiped_at": reg.wiped_at,
        "seen_ids": list(reg.seen_ids.items()),
    }
    dim = mems[0].vectors.shape[1] if mems else 0
    buffer = io.BytesIO()
    np.savez(
        buffer,
        meta=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8),
        vectors=np.concatenate([m.vectors for m in mems]).astype(np.float16)
        if mems
        else np.empty((0, dim), np.float16),
        counts=np.concatenate([m.counts for m in mems]) if mems else np.empty(0, np.float32),
        seen=np.concatenate([m.seen for m in mems]) if mems else np.empty(0, np.int64),
    )
    return buffer.getvalue()


def decode_state(raw: bytes) -> RegistryMemory:
    """Inverse of :func:`encode_state`.

    Raises:
        ValueError, KeyError, TypeError, OSError: an unreadable blob.
    """
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        vectors = data["vectors"].astype(np.float32)
        counts = data["counts"].astype(np.float32)
        seen = data["seen"].astype(np.int64)
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {STATE_FORMAT}")
    reg = RegistryMemory(
        counted=int(meta["counted"]),
        callers={str(k): int(v) for k, v in meta["callers"].items()},
        skipped={str(k): int(v) for k, v in meta["skipped"].items()},
        seq=int(meta["seq"]),
        watermark=float(meta["watermark"]),
        wiped_at=float(meta["wiped_at"]),
        seen_ids=OrderedDict((str(i), float(t)) for i, t in meta["seen_ids"]),
    )
    start = 0
    for name, size in zip(meta["tools"], meta["sizes"], strict=True):
        rows = slice(start, start + int(size))
        start += int(size)
        block = vectors[rows]
        block.setflags(write=False)
        reg.tools[str(name)] = ToolMemory(block, counts[rows], seen[rows])
        reg.entries += int(size)
    return reg
