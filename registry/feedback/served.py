"""Served shortlists: what the service remembers of each one until its feedback arrives, with
the fields the learning loop reads (query, caller, ranking, depth chosen, propensity, policy
version, margins, scores); the in-process bounded memory of them."""

from __future__ import annotations

import json
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from registry.errors import ShortlistNotFound
from registry.fsio import atomic_write_bytes

#: Longest request text remembered with a shortlist (and logged with its feedback).
MAX_LOGGED_QUERY_CHARS = 1_000
#: Ranked tools remembered beyond the shown ones.
RANKING_TAIL = 50


def packed(values: Iterable[float]) -> array[float]:
    """Floats as a compact float32 array (4 bytes each, not a 32-byte float object): remembered
    shortlists carry ~70 of them, times up to SHORTLIST_MAX_REMEMBERED_SHORTLISTS."""
    if isinstance(values, array) and values.typecode == "f":
        return values
    return array("f", values)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedTrace:
    """What the learning loop reads of a served shortlist, declared once: the remembered
    shortlist (:class:`ShownShortlist`) and the feedback event that joins it
    (:class:`registry.feedback.FeedbackEvent`) are both traces. Every field is optional:
    records written before it existed read its default.

    Attributes:
        query: the request text, cut to :data:`MAX_LOGGED_QUERY_CHARS`.
        caller: short stable hash of the bearer token that asked for the shortlist (of a
            feedback event: that sent the feedback); ``None``: no tokens configured.
        ranking: the shown tools, then the next ones of the request's ranking (up to
            :data:`RANKING_TAIL` more), so a used tool's rank is known even when not shown.
        depth_chosen: the depth the policy chose (``k`` differs when exploration served deeper;
            0: unknown, an old record: read as ``k``).
        propensity: probability of serving depth ``k`` under the serving policy, exploration
            included (1.0 for a fixed ``k`` or when nothing was explored).
        policy_version: the depth-policy version that served it ("" unknown).
        margins: ``Q_stop - Q_continue`` per depth of the learned policy on the request's own
            ranking (empty for other policies): a refit replays its stop rule on them.
        depth_bias: the request's operating knob (bits) the margins were compared with.
        scores: the top scores of that ranking (the policy's feature window), for a refit.
    """

    query: str = ""
    caller: str | None = None
    ranking: tuple[str, ...] = ()
    depth_chosen: int = 0
    propensity: float = 1.0
    policy_version: str = ""
    margins: Sequence[float] = ()
    depth_bias: float | None = None
    scores: Sequence[float] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "margins", packed(self.margins))
        object.__setattr__(self, "scores", packed(self.scores))

    def trace(self) -> dict[str, Any]:
        """The trace's fields as keywords: what a value built from this one carries on."""
        return dict(zip(TRACE_FIELDS, attrgetter(*TRACE_FIELDS)(self), strict=True))

    def trace_json(self) -> dict[str, Any]:
        """The trace's part of a record (a log line, a remembered shortlist)."""
        return {**self.trace(), "ranking": list(self.ranking), "margins": list(self.margins),
                "scores": list(self.scores)}

    @staticmethod
    def trace_from_json(d: dict[str, Any]) -> dict[str, Any]:
        """The trace's fields of a record as keywords, defaults for an old one (read as served at ``k``)."""
        caller = d.get("caller")
        bias = d.get("depth_bias")
        return {
            "query": str(d.get("query") or "")[:MAX_LOGGED_QUERY_CHARS],
            "caller": None if caller is None else str(caller),
            "ranking": tuple(str(n) for n in d.get("ranking") or ()),
            "depth_chosen": int(d["depth_chosen"] if "depth_chosen" in d else d["k"]),
            "propensity": float(d.get("propensity", 1.0)),
            "policy_version": str(d.get("policy_version") or ""),
            "margins": packed(float(m) for m in d.get("margins") or ()),
            "depth_bias": None if bias is None else float(bias),
            "scores": packed(float(v) for v in d.get("scores") or ()),
        }


TRACE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ServedTrace))


# -- served shortlists ----------------------------------------------------------------------------



def new_shortlist_id(now: float | None = None) -> str:
    """32 hex digits: the serve time in milliseconds (12), then 20 random ones. The time lets
    feedback for a shortlist whose record was lost (a restart, a wiped store) get a clear
    410 instead of a 404 (:func:`served_at`)."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"{ms & 0xFFFFFFFFFFFF:012x}{uuid.uuid4().hex[:20]}"


def served_at(shortlist_id: str) -> float | None:
    """When a shortlist with this id was served (None: not an id of that form)."""
    if len(shortlist_id) != 32:
        return None
    try:
        return int(shortlist_id[:12], 16) / 1000
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class ShownShortlist(ServedTrace):
    """What the service remembers about a shortlist it served: these fields, and the learning
    loop's (:class:`ServedTrace`, keywords).

    Attributes:
        shortlist_id: opaque id returned to the client.
        registry: registry name.
        version: registry version the shortlist was computed on.
        n_tools: registry size ``N`` at that version.
        k: shortlist length ``K``.
        shown: tool names shown, in rank order.
        created: wall-clock seconds (``time.time()``) when it was served.
    """

    shortlist_id: str
    registry: str
    version: int
    n_tools: int
    k: int
    shown: tuple[str, ...]
    created: float

    def to_json(self) -> dict[str, Any]:
        return {
            "shortlist_id": self.shortlist_id,
            "registry": self.registry,
            "version": self.version,
            "n_tools": self.n_tools,
            "k": self.k,
            "shown": list(self.shown),
            "created": self.created,
            **self.trace_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShownShortlist:
        """Inverse of :meth:`to_json`. Raises ``KeyError``/``TypeError``/``ValueError``."""
        return cls(
            shortlist_id=str(d["shortlist_id"]),
            registry=str(d["registry"]),
            version=int(d["version"]),
            n_tools=int(d["n_tools"]),
            k=int(d["k"]),
            shown=tuple(str(n) for n in d["shown"]),
            created=float(d["created"]),
            **ServedTrace.trace_from_json(d),
        )


@runtime_checkable
class RememberedShortlists(Protocol):
    """Where served shortlists wait for their feedback: :class:`ShortlistMemory` in one process,
    ``registry.store.redis.RedisShortlistMemory`` across replicas."""

    @property
    def retention_seconds(self) -> float:
        """How long a shortlist accepts feedback after it was served."""
        ...

    def remember(self, shortlist: ShownShortlist) -> None:
        """Remember ``shortlist`` until the retention period ends."""
        ...

    def get(self, shortlist_id: str) -> ShownShortlist | None:
        """The remembered shortlist, or ``None`` when unknown or expired."""
        ...

    def mark_feedback(self, shortlist_id: str) -> bool:
        """Flag that feedback was recorded: ``True`` the first time, ``False`` on a resend.

        Raises ``ShortlistNotFound`` when the id is unknown or expired.
        """
        ...

    def unmark_feedback(self, shortlist_id: str) -> None:
        """Undo :meth:`mark_feedback` (recording failed, so the client may retry)."""
        ...


class _Entry:
    __slots__ = ("has_feedback", "shortlist")

    def __init__(self, shortlist: ShownShortlist) -> None:
        self.shortlist = shortlist
        self.has_feedback = False


class ShortlistMemory:
    """Bounded, TTL'd memory of served shortlists, keyed by ``shortlist_id``.

    Entries are kept in insertion order; expired entries are dropped from the old end and the
    oldest ones are evicted beyond ``max_entries``, so every operation is amortised O(1).
    Ages are measured from ``ShownShortlist.created`` with the injected wall clock.

    Args:
        retention_seconds: how long feedback is accepted after a shortlist was served.
        max_entries: hard bound on remembered shortlists (memory bound under load).
        clock: wall clock in seconds; injectable for tests.
    """

    def __init__(
        self,
        retention_seconds: float = 3600,
        max_entries: int = 200_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not retention_seconds > 0:
            raise ValueError(f"retention_seconds must be > 0, got {retention_seconds}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.retention_seconds = float(retention_seconds)
        self.max_entries = int(max_entries)
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.shortlist.created > self.retention_seconds

    def _evict(self, now: float) -> None:
        entries = self._entries
        while entries and self._expired(next(iter(entries.values())), now):
            entries.popitem(last=False)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def _live(self, shortlist_id: str, now: float) -> _Entry | None:
        entry = self._entries.get(shortlist_id)
        if entry is None:
            return None
        if self._expired(entry, now):
            del self._entries[shortlist_id]
            return None
        return entry

    def remember(self, shortlist: ShownShortlist) -> None:
        """Remember ``shortlist`` (replacing any entry with the same id, feedback flag reset)."""
        with self._lock:
            self._entries.pop(shortlist.shortlist_id, None)
            self._entries[shortlist.shortlist_id] = _Entry(shortlist)
            self._evict(self._clock())

    def get(self, shortlist_id: str) -> ShownShortlist | None:
        """The remembered shortlist, or ``None`` when unknown, evicted or older than retention."""
        with self._lock:
            entry = self._live(shortlist_id, self._clock())
            return entry.shortlist if entry is not None else None

    def mark_feedback(self, shortlist_id: str) -> bool:
        """Atomically flag that feedback was recorded for ``shortlist_id``.

        Returns:
            ``True`` the first time, ``False`` on every later call (a resend).

        Raises:
            ShortlistNotFound: the id is unknown, evicted or expired (it may have expired
                between :meth:`get` and this call; then nothing must be recorded).
        """
        with self._lock:
            entry = self._live(shortlist_id, self._clock())
            if entry is None:
                raise ShortlistNotFound(shortlist_id)
            if entry.has_feedback:
                return False
            entry.has_feedback = True
            return True

    def unmark_feedback(self, shortlist_id: str) -> None:
        """Undo :meth:`mark_feedback` (recording failed, so the client may retry). No-op if gone."""
        with self._lock:
            entry = self._entries.get(shortlist_id)
            if entry is not None:
                entry.has_feedback = False

    def save(self, path: Path) -> int:
        """Write the live entries to ``path`` atomically (at a graceful shutdown: a restart
        then takes feedback for them); returns how many."""
        with self._lock:
            self._evict(self._clock())
            rows = [(e.shortlist.to_json(), e.has_feedback) for e in self._entries.values()]
        lines = (json.dumps({"shortlist": row, "feedback": flag}, allow_nan=False) for row, flag in rows)
        atomic_write_bytes(path, ("".join(line + "\n" for line in lines)).encode("utf-8"))
        return len(rows)

    def load(self, path: Path) -> int | None:
        """Restore what :meth:`save` wrote and delete the file (a later crash must not bring
        back stale flags); returns how many live entries, None when there was no file."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        restored = 0
        with self._lock:
            for line in raw.splitlines():
                try:
                    doc = json.loads(line)
                    entry = _Entry(ShownShortlist.from_json(doc["shortlist"]))
                except (ValueError, KeyError, TypeError):
                    continue
                entry.has_feedback = bool(doc.get("feedback"))
                self._entries[entry.shortlist.shortlist_id] = entry
                restored += 1
            self._evict(self._clock())
            restored = min(restored, len(self._entries))
        path.unlink()
        return restored

    def __len__(self) -> int:
        """Entries held, after dropping expired ones from the old end."""
        with self._lock:
            self._evict(self._clock())
            return len(self._entries)
