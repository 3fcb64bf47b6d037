"""Feedback on served shortlists: which tools the agent used, and how useful each call was.

An agent quotes the ``shortlist_id`` of a shortlist it was served and reports the tools it
used (and optionally each call with its marginal-utility sign and the task outcome). From that
the service keeps two families of numbers.

Live presentation rate and Bits-over-Random. A shortlist *presented* the answer when it showed
at least one used tool. Under random selection of ``K`` out of ``N`` tools with ``R`` used
ones, that happens with probability ``P_rand(N, R, K)`` (:func:`registry.bor.p_rand`), so over
a sliding window of events::

    rate = presented / events        BoR = log2(rate / mean(P_rand))    bits

Two variants are kept side by side, as ToolEq recommends reporting both. *exact*: a used tool
was shown, ``R = |used|``. *equivalent*: a used tool or any declared equivalent of one was
shown (max over equivalents: any valid alternative earns the credit) and, to stay
chance-corrected, ``R = |union of the equivalence classes of the used tools|``.

Tool efficiency (marginal tool utility). Each reported call carries the sign of its marginal
utility (``useful`` is ``Delta > 0``; ``Delta <= 0`` counts as not useful). Per tool::

    aggregate_utility = useful_calls - useless_calls      (the sum of the signs)
    efficiency        = useful_calls / (useful_calls + useless_calls)

and per trajectory (one feedback event) ``useful calls / calls``, averaged over events that
report calls. Tools with non-positive aggregate utility, or shown often and never used, are
pruning candidates.

Everything here is thread-safe: the HTTP layer calls in from worker threads.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from registry.bor import bor_bits, p_rand
from registry.errors import ShortlistNotFound, ValidationFailed
from registry.fsio import fsync_dir

__all__ = [
    "MATCHES",
    "MAX_CALLS",
    "EquivalenceClasses",
    "FeedbackEvent",
    "FeedbackListener",
    "FeedbackLog",
    "FeedbackRecorder",
    "LiveWindow",
    "LocalFeedbackLog",
    "RememberedShortlists",
    "SharedFeedbackLog",
    "ShortlistMemory",
    "ShownShortlist",
    "ToolCall",
    "ToolEfficiency",
    "WindowStats",
    "build_event",
    "parse_feedback",
    "validate_equivalents",
]

logger = logging.getLogger(__name__)

#: The two ways a shortlist can be credited with presenting a used tool.
MATCHES: tuple[str, str] = ("exact", "equivalent")
#: Upper bound on the calls one feedback event may report (keeps log lines bounded).
MAX_CALLS = 10_000


# -- served shortlists ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShownShortlist:
    """What the service remembers about a shortlist it served.

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


@runtime_checkable
class RememberedShortlists(Protocol):
    """Where served shortlists wait for their feedback: :class:`ShortlistMemory` in one process,
    ``registry.store.redis.RedisShortlistMemory`` across replicas."""

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
    __slots__ = ("shortlist", "has_feedback")

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

    def __len__(self) -> int:
        """Entries held, after dropping expired ones from the old end."""
        with self._lock:
            self._evict(self._clock())
            return len(self._entries)


# -- equivalent tools -----------------------------------------------------------------------------


class EquivalenceClasses:
    """Functionally equivalent tools, as disjoint classes.

    Overlapping groups merge transitively (union-find): ``[a, b]`` and ``[b, c]`` make one
    class ``{a, b, c}``. A name in no group is its own singleton class.

    Attributes:
        groups: the classes of two or more names, each sorted, sorted among themselves: the
            normalised form to store and serialise.
    """

    __slots__ = ("_class_of", "groups")

    def __init__(self, groups: Iterable[Iterable[str]] = ()) -> None:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            root = x
            while parent[root] != root:
                root = parent[root]
            while parent[x] != root:  # path compression
                parent[x], x = root, parent[x]
            return root

        for group in groups:
            names = list(dict.fromkeys(group))
            for name in names:
                parent.setdefault(name, name)
            for name in names[1:]:
                a, b = find(names[0]), find(name)
                if a != b:
                    parent[max(a, b)] = min(a, b)

        members: dict[str, list[str]] = {}
        for name in parent:
            members.setdefault(find(name), []).append(name)
        classes = sorted(tuple(sorted(m)) for m in members.values() if len(m) > 1)
        self.groups: tuple[tuple[str, ...], ...] = tuple(classes)
        self._class_of: dict[str, frozenset[str]] = {}
        for cls in classes:
            frozen = frozenset(cls)
            for name in cls:
                self._class_of[name] = frozen

    def class_of(self, name: str) -> frozenset[str]:
        """The class holding ``name``: ``{name}`` when it has no declared equivalent."""
        return self._class_of.get(name) or frozenset((name,))

    def expand(self, names: Iterable[str]) -> frozenset[str]:
        """Union of the classes of ``names``."""
        out: set[str] = set()
        for name in names:
            out |= self.class_of(name)
        return frozenset(out)

    def __len__(self) -> int:
        return len(self.groups)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EquivalenceClasses) and self.groups == other.groups

    def __hash__(self) -> int:
        return hash(self.groups)

    def __repr__(self) -> str:
        return f"EquivalenceClasses({[list(g) for g in self.groups]!r})"


def validate_equivalents(groups: Any, known: Collection[str]) -> list[list[str]]:
    """Check the ``equivalents`` field of a registry upload.

    Args:
        groups: the payload value: a list of groups, each a list of at least two distinct
            tool-name strings. ``None`` (field absent) means no equivalents.
        known: the tool names of the registry the groups refer to.

    Returns:
        The normalised groups (merged transitively, each sorted, sorted among themselves).

    Raises:
        ValidationFailed: listing every problem as ``{"field": "equivalents[i][j]",
            "message": ...}`` (plus ``"tool"`` for an unknown name).
    """
    if groups is None:
        return []
    problems: list[dict[str, Any]] = []
    if not isinstance(groups, list):
        problems.append(
            {"field": "equivalents", "message": "must be a list of lists of tool names"}
        )
        raise ValidationFailed("invalid equivalents", problems)
    known_set = known if isinstance(known, (set, frozenset, dict)) else set(known)
    clean: list[list[str]] = []
    for i, group in enumerate(groups):
        if not isinstance(group, list):
            problems.append(
                {"field": f"equivalents[{i}]", "message": "must be a list of tool names"}
            )
            continue
        names: list[str] = []
        for j, name in enumerate(group):
            field = f"equivalents[{i}][{j}]"
            if not isinstance(name, str):
                problems.append({"field": field, "message": "must be a tool name (a string)"})
            elif name not in known_set:
                problems.append(
                    {"field": field, "message": f"unknown tool {name!r}", "tool": name}
                )
            else:
                names.append(name)
        if len({name for name in group if isinstance(name, str)}) < 2:
            problems.append(
                {
                    "field": f"equivalents[{i}]",
                    "message": "a group needs at least 2 distinct tool names",
                }
            )
        clean.append(names)
    if problems:
        raise ValidationFailed(
            f"invalid equivalents: {len(problems)} problem(s)", problems
        )
    return [list(g) for g in EquivalenceClasses(clean).groups]


# -- feedback events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of the agent's trajectory and the sign of its marginal utility."""

    tool: str
    useful: bool

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "useful": self.useful}


@dataclass(frozen=True, slots=True)
class FeedbackEvent:
    """One accepted feedback report, joined with the shortlist it refers to.

    Attributes:
        presented_exact: some used tool was shown.
        presented_equivalent: some used tool, or an equivalent of one, was shown.
        p_rand_exact: ``P_rand(N=n_tools, R=|used|, K=k)``.
        p_rand_equivalent: ``P_rand(N, R=|union of the classes of used|, K)``, ``R`` clipped
            to ``N``.
        received: wall-clock seconds when the feedback was accepted.
    """

    shortlist_id: str
    registry: str
    version: int
    n_tools: int
    k: int
    shown: tuple[str, ...]
    used: tuple[str, ...]
    success: bool | None
    calls: tuple[ToolCall, ...]
    presented_exact: bool
    presented_equivalent: bool
    p_rand_exact: float
    p_rand_equivalent: float
    received: float

    def presented(self, match: str) -> bool:
        """``presented_exact`` or ``presented_equivalent`` by ``match`` name."""
        return self.presented_exact if match == "exact" else self.presented_equivalent

    def p_rand(self, match: str) -> float:
        """``p_rand_exact`` or ``p_rand_equivalent`` by ``match`` name."""
        return self.p_rand_exact if match == "exact" else self.p_rand_equivalent

    def to_json(self) -> dict[str, Any]:
        return {
            "shortlist_id": self.shortlist_id,
            "registry": self.registry,
            "version": self.version,
            "n_tools": self.n_tools,
            "k": self.k,
            "shown": list(self.shown),
            "used": list(self.used),
            "success": self.success,
            "calls": [call.to_json() for call in self.calls],
            "presented_exact": self.presented_exact,
            "presented_equivalent": self.presented_equivalent,
            "p_rand_exact": self.p_rand_exact,
            "p_rand_equivalent": self.p_rand_equivalent,
            "received": self.received,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FeedbackEvent:
        """Inverse of :meth:`to_json`. Raises ``KeyError``/``TypeError``/``ValueError``."""
        success = d["success"]
        if success is not None and not isinstance(success, bool):
            raise TypeError(f"success must be a bool or null, got {success!r}")
        return cls(
            shortlist_id=str(d["shortlist_id"]),
            registry=str(d["registry"]),
            version=int(d["version"]),
            n_tools=int(d["n_tools"]),
            k=int(d["k"]),
            shown=tuple(str(n) for n in d["shown"]),
            used=tuple(str(n) for n in d["used"]),
            success=success,
            calls=tuple(ToolCall(str(c["tool"]), bool(c["useful"])) for c in d["calls"]),
            presented_exact=bool(d["presented_exact"]),
            presented_equivalent=bool(d["presented_equivalent"]),
            p_rand_exact=float(d["p_rand_exact"]),
            p_rand_equivalent=float(d["p_rand_equivalent"]),
            received=float(d["received"]),
        )


_Checked = tuple[
    tuple[str, ...], list[tuple[str, str]], tuple[ToolCall, ...], bool | None, list[dict[str, Any]]
]


def _check_feedback(used: Any, calls: Any, success: Any) -> _Checked:
    """Structural checks. Returns (used, [(field, name)] to look up, calls, success, problems)."""
    problems: list[dict[str, Any]] = []
    names: list[tuple[str, str]] = []
    used_out: list[str] = []
    if not isinstance(used, (list, tuple)) or isinstance(used, str):
        problems.append({"field": "used", "message": "must be a non-empty list of tool names"})
    elif not used:
        problems.append({"field": "used", "message": "must name at least one tool"})
    else:
        for i, name in enumerate(used):
            if not isinstance(name, str) or not name:
                problems.append(
                    {"field": f"used[{i}]", "message": "must be a tool name (a non-empty string)"}
                )
            else:
                names.append((f"used[{i}]", name))
                used_out.append(name)

    calls_out: list[ToolCall] = []
    if calls is None:
        pass
    elif not isinstance(calls, (list, tuple)):
        problems.append({"field": "calls", "message": "must be a list of {tool, useful} objects"})
    elif len(calls) > MAX_CALLS:
        problems.append(
            {"field": "calls", "message": f"at most {MAX_CALLS} calls per feedback event"}
        )
    else:
        for i, call in enumerate(calls):
            tool: Any
            useful: Any
            if isinstance(call, ToolCall):
                tool, useful = call.tool, call.useful
            elif isinstance(call, dict):
                tool, useful = call.get("tool"), call.get("useful")
            else:
                problems.append(
                    {"field": f"calls[{i}]", "message": "must be an object {tool, useful}"}
                )
                continue
            tool_ok = isinstance(tool, str) and bool(tool)
            if not tool_ok:
                problems.append(
                    {
                        "field": f"calls[{i}].tool",
                        "message": "must be a tool name (a non-empty string)",
                    }
                )
            if not isinstance(useful, bool):
                problems.append({"field": f"calls[{i}].useful", "message": "must be true or false"})
            elif isinstance(tool, str) and tool_ok:
                names.append((f"calls[{i}].tool", tool))
                calls_out.append(ToolCall(tool, useful))

    if success is not None and not isinstance(success, bool):
        problems.append({"field": "success", "message": "must be true, false or null"})
        success = None
    return tuple(dict.fromkeys(used_out)), names, tuple(calls_out), success, problems


def parse_feedback(
    used: Any, calls: Any = None, success: Any = None
) -> tuple[tuple[str, ...], tuple[ToolCall, ...], bool | None]:
    """Structural validation of the feedback payload fields (no registry lookup).

    Args:
        used: non-empty list of tool-name strings; duplicates are collapsed (first order kept).
        calls: ``None`` or a list of ``{"tool": str, "useful": bool}`` (or :class:`ToolCall`).
        success: ``None``, ``True`` or ``False``.

    Returns:
        ``(used, calls, success)`` typed and de-duplicated.

    Raises:
        ValidationFailed: listing every problem with fields like ``"used"``, ``"used[2]"``,
            ``"calls[0].tool"``.
    """
    used_t, _, calls_t, success_v, problems = _check_feedback(used, calls, success)
    if problems:
        raise ValidationFailed(f"invalid feedback: {len(problems)} problem(s)", problems)
    return used_t, calls_t, success_v


def build_event(
    shortlist: ShownShortlist,
    used: Any,
    calls: Any,
    success: Any,
    known_tools: Collection[str],
    equivalence: EquivalenceClasses,
    received: float,
) -> FeedbackEvent:
    """Validate a feedback report against its shortlist and registry and score it.

    A name is accepted when it is a tool of the registry now (``known_tools``) or was shown
    in the shortlist (it was a tool of the registry when served, even if since deleted).

    Args:
        shortlist: the shortlist the feedback quotes.
        used, calls, success: raw payload values, as for :func:`parse_feedback`.
        known_tools: current tool names of ``shortlist.registry``.
        equivalence: the registry's equivalence classes.
        received: wall-clock seconds, stored on the event.

    Raises:
        ValidationFailed: every structural problem and every unknown tool (``"tool"`` key in
            the problem names it), all in one list.
    """
    used_t, names, calls_t, success_v, problems = _check_feedback(used, calls, success)
    shown = set(shortlist.shown)
    if not isinstance(known_tools, (set, frozenset, dict)):
        known_tools = set(known_tools)
    for field, name in names:
        if name not in known_tools and name not in shown:
            problems.append(
                {
                    "field": field,
                    "message": f"tool {name!r} does not exist in registry {shortlist.registry!r}",
                    "tool": name,
                }
            )
    if problems:
        raise ValidationFailed(f"invalid feedback: {len(problems)} problem(s)", problems)

    relevant_equiv = equivalence.expand(used_t)
    n = max(int(shortlist.n_tools), 1)
    k = max(int(shortlist.k), 0)
    return FeedbackEvent(
        shortlist_id=shortlist.shortlist_id,
        registry=shortlist.registry,
        version=shortlist.version,
        n_tools=shortlist.n_tools,
        k=shortlist.k,
        shown=tuple(shortlist.shown),
        used=used_t,
        success=success_v,
        calls=calls_t,
        presented_exact=not shown.isdisjoint(used_t),
        presented_equivalent=not shown.isdisjoint(relevant_equiv),
        p_rand_exact=p_rand(n, min(len(used_t), n), k),
        p_rand_equivalent=p_rand(n, min(len(relevant_equiv), n), k),
        received=float(received),
    )


# -- durable log ----------------------------------------------------------------------------------


@runtime_checkable
class FeedbackLog(Protocol):
    """Durable, append-only record of accepted feedback events."""

    def append(self, event: FeedbackEvent) -> None:
        """Store ``event``; it is durable when this returns."""
        ...

    def replay(self) -> Iterator[FeedbackEvent]:
        """Every stored event, oldest first."""
        ...


@runtime_checkable
class SharedFeedbackLog(FeedbackLog, Protocol):
    """A log several replicas append to (``registry.store.redis.RedisFeedbackLog``)."""

    def read_new(self, limit: int = 1000) -> list[FeedbackEvent]:
        """Up to ``limit`` events appended by *other* processes since the previous call (since
        the start of the log on the first call), oldest first; empty when caught up. The read
        position only advances when the read succeeds, so a failed call can simply be retried.
        """
        ...


class LocalFeedbackLog:
    """Feedback events as JSON Lines in one local file (one writer process per file).

    Each append writes one line and fsyncs it under a lock; a failed append is cut back
    off the file. A crash mid-append can leave a torn last line (no trailing newline): opening
    the log truncates it away so later appends stay parseable, and :meth:`replay` skips any
    line it cannot parse (with a warning). The file only grows; it is replayed in full at
    start-up.

    Args:
        path: the ``.jsonl`` file; parent directories are created.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.skipped = 0  # unparseable lines met by the last replay()
        created = not self.path.exists()
        self._truncate_torn_tail()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        if created:
            fsync_dir(self.path.parent)

    @classmethod
    def in_data_dir(cls, data_dir: Path | str) -> LocalFeedbackLog:
        """The log at ``<data_dir>/feedback/events.jsonl``."""
        return cls(Path(data_dir) / "feedback" / "events.jsonl")

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return
            # Scan back for the last newline; a torn line is at most one event long.
            chunk = 64 * 1024
            end = size
            while end > 0:
                start = max(0, end - chunk)
                handle.seek(start)
                data = handle.read(end - start)
                pos = data.rfind(b"\n")
                if pos >= 0:
                    keep = start + pos + 1
                    break
                end = start
            else:
                keep = 0
            if keep < size:
                logger.warning(
                    "feedback log %s: dropping a torn last line (%d bytes)", self.path, size - keep
                )
                handle.truncate(keep)
                handle.flush()
                os.fsync(handle.fileno())

    def append(self, event: FeedbackEvent) -> None:
        line = json.dumps(event.to_json(), separators=(",", ":"), allow_nan=False) + "\n"
        data = line.encode("utf-8")
        with self._lock:
            fd = self._fd
            if fd is None:
                raise ValueError(f"feedback log {self.path} is closed")
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                # Cut a partial line off so the next append starts on a line of its own.
                try:
                    os.ftruncate(fd, self._size)
                except OSError:
                    logger.exception("feedback log %s: cannot cut a failed append", self.path)
                raise
            self._size += len(data)

    def replay(self) -> Iterator[FeedbackEvent]:
        with self._lock:
            size = self._size if self._fd is not None else os.path.getsize(self.path)
        skipped = 0
        with open(self.path, "rb") as handle:
            read = 0
            for raw in handle:
                read += len(raw)
                if read > size:  # appended after replay() started
                    break
                if not raw.endswith(b"\n"):  # torn tail written by someone else
                    skipped += 1
                    break
                try:
                    yield FeedbackEvent.from_json(json.loads(raw))
                except (ValueError, KeyError, TypeError) as exc:
                    skipped += 1
                    logger.warning("feedback log %s: skipping unreadable line: %s", self.path, exc)
        self.skipped = skipped

    def close(self) -> None:
        """Close the file (idempotent); :meth:`replay` still works, :meth:`append` does not."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LocalFeedbackLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- live window ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Presentation rate and BoR over the live window for one ``(registry, match)``.

    Conventions for undefined values (all ``NaN``, never ``±inf``, so a gauge shows a gap):

    * ``events == 0``: ``presentation_rate``, ``mean_p_rand`` and ``bor_bits`` are ``NaN``.
    * ``presented == 0`` (rate 0): ``bor_bits`` is ``NaN`` (``log2 0`` is ``-inf``: the
      window holds no evidence of selectivity either way); the rate itself is ``0.0``.
    * ``mean_p_rand == 0`` (only ``K = 0`` shortlists): ``bor_bits`` is ``NaN``.

    Attributes:
        events: feedback events in the window.
        presentation_rate: ``presented / events``.
        mean_p_rand: mean ``P_rand`` of those events.
        bor_bits: ``log2(presentation_rate / mean_p_rand)``.
        presented: events whose shortlist presented a used tool.
    """

    events: int
    presentation_rate: float
    mean_p_rand: float
    bor_bits: float
    presented: int = 0


# Every finite double is an integer multiple of 2**-1074, so P_rand scaled by 2**1074 is an
# exact integer and running sums of it never drift (float add/subtract would: 1.0 + 1e-300
# - 1.0 == 0.0).
_FIXED_BITS = 1074


def _to_fixed(p: float) -> int:
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"P_rand must be in [0, 1], got {p}")
    num, den = p.as_integer_ratio()  # den is a power of two <= 2**1074
    return num << (_FIXED_BITS + 1 - den.bit_length())


class _Bucket:
    __slots__ = ("index", "events", "presented", "sum_p")

    def __init__(self, index: int) -> None:
        self.index = index
        self.events = 0
        self.presented = 0
        self.sum_p = 0  # fixed point, see _to_fixed


class _Series:
    __slots__ = ("buckets", "events", "presented", "sum_p")

    def __init__(self) -> None:
        self.buckets: deque[_Bucket] = deque()
        self.events = 0
        self.presented = 0
        self.sum_p = 0  # fixed point, see _to_fixed


class LiveWindow:
    """Sliding window of feedback events per ``(registry, match)``, with running sums.

    Events are grouped into buckets of ``resolution_seconds`` by their ``received`` time
    (bucket ``b`` covers ``[b*res, (b+1)*res)``); a bucket leaves the window once it ends at
    or before ``now - window_seconds``. Memory per key is bounded by
    ``window / resolution`` buckets whatever the traffic, and :meth:`stats` costs O(buckets
    evicted). Sums of ``P_rand`` are kept in exact fixed point, so adding and evicting never
    drifts: the statistics equal a recomputation from scratch, correctly rounded.

    Args:
        window_seconds: window length.
        clock: wall clock in seconds; injectable for tests.
        resolution_seconds: bucket width; the window edge is exact to this resolution.
    """

    def __init__(
        self,
        window_seconds: float = 3600,
        clock: Callable[[], float] = time.time,
        resolution_seconds: float = 1.0,
    ) -> None:
        if not window_seconds > 0:
            raise ValueError(f"window_seconds must be > 0, got {window_seconds}")
        if not resolution_seconds > 0:
            raise ValueError(f"resolution_seconds must be > 0, got {resolution_seconds}")
        self.window_seconds = float(window_seconds)
        self.resolution_seconds = float(resolution_seconds)
        self._clock = clock
        self._series: dict[tuple[str, str], _Series] = {}
        self._lock = threading.Lock()

    def _bucket_index(self, t: float) -> int:
        return math.floor(t / self.resolution_seconds)

    def _expired(self, index: int, cutoff: float) -> bool:
        return (index + 1) * self.resolution_seconds <= cutoff

    def _evict(self, series: _Series, cutoff: float) -> None:
        buckets = series.buckets
        while buckets and self._expired(buckets[0].index, cutoff):
            old = buckets.popleft()
            series.events -= old.events
            series.presented -= old.presented
            series.sum_p -= old.sum_p

    def add(self, event: FeedbackEvent) -> None:
        """Count ``event`` under both matches; ignored if already outside the window.

        Raises:
            ValueError: a ``P_rand`` of the event is not in ``[0, 1]`` (nothing is counted).
        """
        index = self._bucket_index(event.received)
        values = [(m, int(event.presented(m)), _to_fixed(event.p_rand(m))) for m in MATCHES]
        with self._lock:
            cutoff = self._clock() - self.window_seconds
            if self._expired(index, cutoff):
                return
            for match, presented, p in values:
                series = self._series.setdefault((event.registry, match), _Series())
                self._evict(series, cutoff)
                bucket = self._find_bucket(series.buckets, index)
                bucket.events += 1
                bucket.presented += presented
                bucket.sum_p += p
                series.events += 1
                series.presented += presented
                series.sum_p += p

    @staticmethod
    def _find_bucket(buckets: deque[_Bucket], index: int) -> _Bucket:
        if not buckets or buckets[-1].index < index:
            buckets.append(_Bucket(index))
            return buckets[-1]
        # Late event (threads race on wall-clock stamps): search from the new end, where it lands.
        pos = len(buckets) - 1
        while pos >= 0 and buckets[pos].index > index:
            pos -= 1
        if pos >= 0 and buckets[pos].index == index:
            return buckets[pos]
        bucket = _Bucket(index)
        buckets.insert(pos + 1, bucket)
        return bucket

    def stats(self, registry: str, match: str) -> WindowStats:
        """Window statistics for ``(registry, match)``; see :class:`WindowStats` conventions.

        Raises:
            ValueError: ``match`` is not ``"exact"`` or ``"equivalent"``.
        """
        if match not in MATCHES:
            raise ValueError(f"match must be one of {MATCHES}, got {match!r}")
        with self._lock:
            series = self._series.get((registry, match))
            if series is None:
                return WindowStats(0, math.nan, math.nan, math.nan, 0)
            self._evict(series, self._clock() - self.window_seconds)
            events, presented, sum_p = series.events, series.presented, series.sum_p
        if events == 0:
            return WindowStats(0, math.nan, math.nan, math.nan, 0)
        rate = presented / events
        mean_p = sum_p / (events << _FIXED_BITS)  # int / int: correctly rounded
        bits = bor_bits(rate, mean_p) if presented > 0 and mean_p > 0.0 else math.nan
        return WindowStats(events, rate, mean_p, bits, presented)

    def keys(self) -> list[tuple[str, str]]:
        """Every ``(registry, match)`` seen since start or :meth:`forget`, sorted.

        Keys stay listed after their events expire (their stats are then ``NaN``), so a gauge
        exporter can keep them in step until the registry is forgotten.
        """
        with self._lock:
            return sorted(self._series)

    def forget(self, registry: str) -> None:
        """Drop every key of ``registry`` (it was deleted)."""
        with self._lock:
            for match in MATCHES:
                self._series.pop((registry, match), None)


# -- tool efficiency ------------------------------------------------------------------------------


class _ToolCounts:
    __slots__ = ("shown", "used", "useful", "useless")

    def __init__(self) -> None:
        self.shown = 0
        self.used = 0
        self.useful = 0
        self.useless = 0


class _RegistryCounts:
    __slots__ = ("tools", "events", "trajectory_sum", "trajectories")

    def __init__(self) -> None:
        self.tools: dict[str, _ToolCounts] = {}
        self.events = 0
        self.trajectory_sum = 0.0
        self.trajectories = 0


class ToolEfficiency:
    """Per registry and tool: times shown and used, useful and useless calls (all time)."""

    def __init__(self) -> None:
        self._registries: dict[str, _RegistryCounts] = {}
        self._lock = threading.Lock()

    def add(self, event: FeedbackEvent) -> None:
        """Count ``event``: every shown tool, every used tool, every call and its trajectory."""
        with self._lock:
            reg = self._registries.setdefault(event.registry, _RegistryCounts())
            tools = reg.tools
            reg.events += 1
            for name in event.shown:
                tools.setdefault(name, _ToolCounts()).shown += 1
            for name in event.used:
                tools.setdefault(name, _ToolCounts()).used += 1
            useful = 0
            for call in event.calls:
                counts = tools.setdefault(call.tool, _ToolCounts())
                if call.useful:
                    counts.useful += 1
                    useful += 1
                else:
                    counts.useless += 1
            if event.calls:
                reg.trajectory_sum += useful / len(event.calls)
                reg.trajectories += 1

    def report(
        self,
        registry: str,
        *,
        tools: Iterable[str] | None = None,
        min_calls: int = 5,
        min_shown: int = 20,
    ) -> dict[str, Any]:
        """Efficiency report for ``registry``.

        Args:
            registry: registry name (an unseen one reports zeros).
            tools: when given, report exactly these names (the registry's current tools, with
                zeros for those never seen in feedback); otherwise every name seen.
            min_calls: calls needed before non-positive aggregate utility marks a tool for
                pruning.
            min_shown: times shown needed before never being used marks a tool for pruning.

        Returns:
            ``{"registry", "events", "mean_trajectory_efficiency" (None without calls),
            "prune_candidates": sorted names, "tools": [{"name", "shown", "used",
            "useful_calls", "useless_calls", "aggregate_utility", "efficiency"}] by name}``.
            ``aggregate_utility = useful_calls - useless_calls``; ``efficiency`` is
            ``useful_calls / calls`` or ``None`` without calls. A tool is a prune candidate
            when ``calls >= min_calls and aggregate_utility <= 0`` or
            ``shown >= min_shown and used == 0``.
        """
        with self._lock:
            reg = self._registries.get(registry)
            seen = {
                name: (c.shown, c.used, c.useful, c.useless)
                for name, c in (reg.tools.items() if reg else ())
            }
            events = reg.events if reg else 0
            mean_traj = (
                reg.trajectory_sum / reg.trajectories if reg and reg.trajectories else None
            )
        names = sorted(set(tools)) if tools is not None else sorted(seen)
        rows: list[dict[str, Any]] = []
        prune: list[str] = []
        for name in names:
            shown, used, useful, useless = seen.get(name, (0, 0, 0, 0))
            calls = useful + useless
            utility = useful - useless
            rows.append(
                {
                    "name": name,
                    "shown": shown,
                    "used": used,
                    "useful_calls": useful,
                    "useless_calls": useless,
                    "aggregate_utility": utility,
                    "efficiency": useful / calls if calls else None,
                }
            )
            if (calls >= min_calls and utility <= 0) or (shown >= min_shown and used == 0):
                prune.append(name)
        return {
            "registry": registry,
            "events": events,
            "mean_trajectory_efficiency": mean_traj,
            "prune_candidates": prune,
            "tools": rows,
        }

    def registries(self) -> list[str]:
        """Registries with counted feedback, sorted."""
        with self._lock:
            return sorted(self._registries)

    def forget(self, registry: str) -> None:
        """Drop every count of ``registry`` (it was deleted)."""
        with self._lock:
            self._registries.pop(registry, None)


# -- orchestration --------------------------------------------------------------------------------

FeedbackListener = Callable[[FeedbackEvent], None]


class FeedbackRecorder:
    """Accepts feedback for served shortlists: validate, deduplicate, log durably, then count.

    Args:
        memory: served shortlists.
        log: durable event log.
        window: live presentation-rate window.
        efficiency: per-tool efficiency counts.
        clock: wall clock stamped on events; injectable for tests.
        on_event: listeners called with every newly recorded event (not resends, not
            :meth:`restore`), e.g. to bump Prometheus counters. A listener that raises is
            logged and ignored: the event is already recorded.
    """

    def __init__(
        self,
        memory: RememberedShortlists,
        log: FeedbackLog,
        window: LiveWindow,
        efficiency: ToolEfficiency,
        clock: Callable[[], float] = time.time,
        on_event: Iterable[FeedbackListener] = (),
    ) -> None:
        self.memory = memory
        self.log = log
        self.window = window
        self.efficiency = efficiency
        self._clock = clock
        self._listeners: list[FeedbackListener] = list(on_event)

    def add_listener(self, listener: FeedbackListener) -> None:
        self._listeners.append(listener)

    def remember(self, shortlist: ShownShortlist) -> None:
        """Remember a served shortlist so feedback can quote its id."""
        self.memory.remember(shortlist)

    def submit(
        self,
        shortlist_id: str,
        used: Any,
        calls: Any,
        success: Any,
        *,
        known_tools: Callable[[str], Collection[str]],
        equivalence: Callable[[str], EquivalenceClasses],
    ) -> tuple[FeedbackEvent, bool]:
        """Record feedback for ``shortlist_id``.

        Args:
            shortlist_id: id of a served shortlist.
            used, calls, success: payload fields (see :func:`build_event`).
            known_tools: registry name -> its current tool names.
            equivalence: registry name -> its equivalence classes.

        Returns:
            ``(event, resent)``. On a resend (feedback already recorded for this id) the event
            is built from this request, and nothing is logged or counted.

        Raises:
            ShortlistNotFound: unknown or expired id.
            ValidationFailed: bad payload; nothing is recorded.
            OSError: the durable append failed; nothing is counted and a retry is accepted.
        """
        shortlist = self.memory.get(shortlist_id)
        if shortlist is None:
            raise ShortlistNotFound(shortlist_id)
        event = build_event(
            shortlist,
            used,
            calls,
            success,
            known_tools(shortlist.registry),
            equivalence(shortlist.registry),
            self._clock(),
        )
        if not self.memory.mark_feedback(shortlist_id):
            return event, True
        try:
            self.log.append(event)
        except BaseException:
            self.memory.unmark_feedback(shortlist_id)
            raise
        self._count(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("feedback listener %r failed", listener)
        return event, False

    def _count(self, event: FeedbackEvent) -> None:
        self.window.add(event)
        self.efficiency.add(event)

    def restore(self) -> int:
        """Replay the durable log into the counters (call once, at start-up, before serving).

        Every event goes into the efficiency counts; the window keeps those still inside it.
        Listeners are not called.

        Returns:
            The number of events replayed.
        """
        if isinstance(self.log, SharedFeedbackLog):
            return self.catch_up()  # resumable: a store outage mid-replay never double counts
        count = 0
        for event in self.log.replay():
            self._count(event)
            count += 1
        return count

    def catch_up(self) -> int:
        """Count the events other replicas appended to a shared log since the last call.

        Keeps the efficiency report and the live window the same on every replica. Listeners
        are not called: each replica's Prometheus counters count its own events, and PromQL
        sums them. A no-op (returns 0) for a log that is not shared.

        Raises:
            StoreUnavailable: the shared log cannot be read; call again later.
        """
        if not isinstance(self.log, SharedFeedbackLog):
            return 0
        count = 0
        while events := self.log.read_new():
            for event in events:
                self._count(event)
            count += len(events)
        return count
