"""The counts feedback feeds: the live presentation-rate window and per-tool efficiency."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from registry.bor import bor_bits
from registry.feedback.events import MATCHES, FeedbackEvent

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
    __slots__ = ("events", "index", "presented", "sum_p")

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

    def clear(self) -> None:
        """Drop every event (keys stay listed, with empty statistics)."""
        with self._lock:
            self._series = {key: _Series() for key in self._series}


# -- tool efficiency ------------------------------------------------------------------------------


class _ToolCounts:
    __slots__ = ("shown", "used", "useful", "useless")

    def __init__(self) -> None:
        self.shown = 0
        self.used = 0
        self.useful = 0
        self.useless = 0


class _RegistryCounts:
    __slots__ = ("events", "tools", "trajectories", "trajectory_sum")

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

    def to_state(self) -> dict[str, Any]:
        """Every count as plain JSON (a compaction checkpoint); :meth:`from_state` reverses it."""
        with self._lock:
            return {
                registry: {
                    "events": reg.events,
                    "trajectory_sum": reg.trajectory_sum,
                    "trajectories": reg.trajectories,
                    "tools": {
                        name: [c.shown, c.used, c.useful, c.useless] for name, c in reg.tools.items()
                    },
                }
                for registry, reg in self._registries.items()
            }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ToolEfficiency:
        """Counts from :meth:`to_state` output.

        Raises:
            ValueError: ``state`` is not such a document.
        """
        out = cls()
        try:
            for registry, doc in state.items():
                reg = _RegistryCounts()
                reg.events = int(doc["events"])
                reg.trajectory_sum = float(doc["trajectory_sum"])
                reg.trajectories = int(doc["trajectories"])
                for name, (shown, used, useful, useless) in doc["tools"].items():
                    counts = _ToolCounts()
                    counts.shown, counts.used = int(shown), int(used)
                    counts.useful, counts.useless = int(useful), int(useless)
                    reg.tools[str(name)] = counts
                out._registries[str(registry)] = reg
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a tool-efficiency state: {exc}") from exc
        return out

    def replace_with(self, other: ToolEfficiency) -> None:
        """Take over ``other``'s counts (a resynchronisation from a checkpoint)."""
        with other._lock:
            registries = other._registries
            other._registries = {}
        with self._lock:
            self._registries = registries

    def forget(self, registry: str) -> None:
        """Drop every count of ``registry`` (it was deleted)."""
        with self._lock:
            self._registries.pop(registry, None)


