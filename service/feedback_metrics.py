"""Prometheus view of the feedback loop: counters per event, live gauges read at scrape time."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from registry.feedback import FeedbackEvent, LiveWindow
from service.metrics import RegistryLabels, remove_registry_series

MATCHES = ("exact", "equivalent")


class FeedbackMetrics(Collector):
    """``shortlist_feedback_total``, ``shortlist_presented_total``, ``shortlist_feedback_p_rand_sum``
    and the windowed gauges ``shortlist_presentation_rate`` / ``shortlist_live_bor_bits``.

    The counters let PromQL compute rates and BoR across replicas; the gauges are this process's
    sliding window, computed when Prometheus scrapes. A folded registry (see
    :class:`service.metrics.RegistryLabels`) counts under ``~other``; its window gauges are not
    exported (a window's rate does not sum; the fleet-wide recordings cover ``~other``).
    """

    def __init__(self, registry: CollectorRegistry, window: LiveWindow, labels: RegistryLabels) -> None:
        self.window = window
        self.labels = labels
        self.feedback = Counter(
            "shortlist_feedback", "Feedback events accepted (resends not counted).",
            ["registry"], registry=registry,
        )
        self.presented = Counter(
            "shortlist_presented",
            "Feedback events whose shortlist held a used tool (exact) or an equivalent of one.",
            ["registry", "match"], registry=registry,
        )
        # Keeps the exact name `shortlist_feedback_p_rand_sum` (a Counter would add `_total`).
        self._p_rand_sum: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def touch(self, registry: str) -> None:
        """Create a registry's series at zero, so the first event after a restart is a rate."""
        label = self.labels.label(registry)
        self.feedback.labels(label)
        with self._lock:
            for match in MATCHES:
                self.presented.labels(label, match)
                self._p_rand_sum.setdefault((label, match), 0.0)

    def drop(self, registry: str) -> None:
        """Stop exporting ``registry``'s series (it was deleted) and forget its live window."""
        remove_registry_series(self.feedback, registry)
        remove_registry_series(self.presented, registry)
        with self._lock:
            for match in MATCHES:
                self._p_rand_sum.pop((registry, match), None)
        self.window.forget(registry)

    def observe(self, event: FeedbackEvent) -> None:
        self.touch(event.registry)
        label = self.labels.label(event.registry)
        self.feedback.labels(label).inc()
        with self._lock:
            for match in MATCHES:
                if event.presented(match):
                    self.presented.labels(label, match).inc()
                self._p_rand_sum[(label, match)] += event.p_rand(match)

    def collect(self) -> Iterator[Metric]:
        p_rand = UnknownMetricFamily(
            "shortlist_feedback_p_rand_sum",
            "Sum over feedback events of the shortlist's P_rand (monotonic, like a counter).",
            labels=["registry", "match"],
        )
        with self._lock:
            sums = sorted(self._p_rand_sum.items())
        for (registry, match), value in sums:
            p_rand.add_metric([registry, match], value)
        yield p_rand
        rate = GaugeMetricFamily(
            "shortlist_presentation_rate",
            "Presented / feedback events over the live window (this process).",
            labels=["registry", "match"],
        )
        bits = GaugeMetricFamily(
            "shortlist_live_bor_bits",
            "log2(presentation rate / mean P_rand) over the live window (this process).",
            labels=["registry", "match"],
        )
        for registry, match in self.window.keys():  # noqa: SIM118 (LiveWindow, not a dict)
            if not self.labels.owns(registry):
                continue
            stats = self.window.stats(registry, match)
            if stats.events == 0:
                continue
            rate.add_metric([registry, match], stats.presentation_rate)
            if not math.isnan(stats.bor_bits):
                bits.add_metric([registry, match], stats.bor_bits)
        yield rate
        yield bits
