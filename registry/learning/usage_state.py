"""The usage memory's per-registry state and its one-blob (``.npz``) encoding."""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from registry.learning.companions import CompanionCounts
from registry.learning.evidence import EvidenceConfig, EvidenceCounter
from registry.learning.profiles import PassedOver

__all__ = ["STATE_FORMAT", "RegistryMemory", "ToolMemory", "decode_state", "encode_state"]

STATE_FORMAT = 2
_READABLE = (1, 2)  # format 1: no evidence counter, no profiles (relearnt from new events)
_MAX_CALLERS = 10_000


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
    counter: EvidenceCounter = field(default_factory=EvidenceCounter)
    profile_sums: dict[str, np.ndarray] = field(default_factory=dict)  # tool -> sum of w * q
    profile_mass: dict[str, float] = field(default_factory=dict)  # tool -> sum of w
    profile_seq: int = 0  # bumped on every profile change (readers cache by it)
    passed_over: PassedOver = field(default_factory=PassedOver)  # shown while another was used
    companions: CompanionCounts = field(default_factory=CompanionCounts)  # which tools go together
    _mean: tuple[int, np.ndarray | None] = (-1, None)  # (profile_seq, mean request) cache

    def profile_mean(self) -> np.ndarray | None:
        """The evidence-weighted mean request of every profile (``mu``; None: no profile),
        recomputed only when a profile changed."""
        seq, mean = self._mean
        if seq != self.profile_seq:
            mass = sum(self.profile_mass.values())
            sums = list(self.profile_sums.values())
            mean = (np.sum(sums, axis=0) / mass).astype(np.float32) if sums and mass > 0 else None
            self._mean = (self.profile_seq, mean)
        return mean

    def add_profile(self, tool: str, q: np.ndarray, weight: float) -> None:
        """Fold ``weight * q`` into ``tool``'s usage profile (issue 22)."""
        if weight <= 0:
            return
        total = self.profile_sums.get(tool)
        add = (weight * q).astype(np.float32)
        self.profile_sums[tool] = add if total is None else total + add
        self.profile_mass[tool] = self.profile_mass.get(tool, 0.0) + float(weight)
        self.profile_seq += 1

    def drop_profile(self, tool: str) -> None:
        self.profile_sums.pop(tool, None)
        if self.profile_mass.pop(tool, None) is not None:
            self.profile_seq += 1

    def bound_callers(self) -> None:
        """Keep the per-caller event counts (the report's shares) to the busiest callers."""
        if len(self.callers) > _MAX_CALLERS:
            for key in sorted(self.callers, key=self.callers.__getitem__)[: len(self.callers) - _MAX_CALLERS]:
                del self.callers[key]


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
        "counter": reg.counter.to_json(),
        "profile_tools": list(reg.profile_sums),
        "profile_mass": [reg.profile_mass[t] for t in reg.profile_sums],
        "passed_tools": list(reg.passed_over.sums),
        "passed_mass": [reg.passed_over.mass[t] for t in reg.passed_over.sums],
        "companions": reg.companions.to_json(),
    }
    passed = [reg.passed_over.sums[t] for t in reg.passed_over.sums]
    sums = [reg.profile_sums[t] for t in reg.profile_sums]
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
        profiles=np.stack(sums).astype(np.float32) if sums else np.empty((0, dim), np.float32),
        passed=np.stack(passed).astype(np.float32) if passed else np.empty((0, dim), np.float32),
    )
    return buffer.getvalue()


def decode_state(raw: bytes, config: EvidenceConfig | None = None) -> RegistryMemory:
    """Inverse of :func:`encode_state`.

    Raises:
        ValueError, KeyError, TypeError, OSError: an unreadable blob.
    """
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode("utf-8"))
        vectors = data["vectors"].astype(np.float32)
        counts = data["counts"].astype(np.float32)
        seen = data["seen"].astype(np.int64)
        profiles = data["profiles"].astype(np.float32) if "profiles" in data else None
        passed = data["passed"].astype(np.float32) if "passed" in data else None
    if meta.get("format") not in _READABLE:
        raise ValueError(f"format {meta.get('format')!r}, expected one of {_READABLE}")
    reg = RegistryMemory(
        counted=int(meta["counted"]),
        callers={str(k): int(v) for k, v in meta["callers"].items()},
        skipped={str(k): int(v) for k, v in meta["skipped"].items()},
        seq=int(meta["seq"]),
        watermark=float(meta["watermark"]),
        wiped_at=float(meta["wiped_at"]),
        seen_ids=OrderedDict((str(i), float(t)) for i, t in meta["seen_ids"]),
        counter=EvidenceCounter.from_json(meta.get("counter"), config or EvidenceConfig()),
        companions=CompanionCounts.from_json(meta.get("companions")),  # absent before companions
    )
    if passed is not None:
        for row, (tool, mass) in enumerate(zip(meta["passed_tools"], meta["passed_mass"], strict=True)):
            reg.passed_over.sums[str(tool)] = passed[row]
            reg.passed_over.mass[str(tool)] = float(mass)
    if profiles is not None:
        for row, (tool, mass) in enumerate(zip(meta["profile_tools"], meta["profile_mass"], strict=True)):
            reg.profile_sums[str(tool)] = profiles[row]
            reg.profile_mass[str(tool)] = float(mass)
    start = 0
    for name, size in zip(meta["tools"], meta["sizes"], strict=True):
        rows = slice(start, start + int(size))
        start += int(size)
        block = vectors[rows]
        block.setflags(write=False)
        reg.tools[str(name)] = ToolMemory(block, counts[rows], seen[rows])
        reg.entries += int(size)
    return reg


def unit_vector(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def weakest_entry(counts: np.ndarray, seen: np.ndarray) -> int:
    """Index of the entry to evict: lowest net count, then least recently touched."""
    return int(np.lexsort((seen, counts))[0])
