"""Prometheus metrics. Labels are bounded: registry names are admin-controlled, never queries,
and past ``SHORTLIST_METRICS_MAX_REGISTRIES`` registries the rest share one label value."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from registry.index.query_cache import QueryCacheStats
from registry.serving.result import Shortlist

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.01, 0.0125, 0.015,
    0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
)
K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100, 1000)
STAGES = ("embed", "search", "policy", "total")
#: The ``registry`` label of the registries past the bound. ``~`` is outside the registry-name
#: alphabet (so no registry can be called this) and is no regex metacharacter (Grafana's
#: ``registry=~"$registry"`` selects it as written).
OTHER_REGISTRIES = "~other"


class RegistryLabels:
    """Which registries get series of their own: the first ``limit`` this process loads (in the
    store's name order at start-up) or sees afterwards; every later one is *folded*, its series
    summed under :data:`OTHER_REGISTRIES`. A registry keeps its label until it is deleted, so a
    counter never moves between series; deleting an own registry frees its place for the next new
    one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._own: set[str] = set()
        self._folded: set[str] = set()
        self._lock = threading.Lock()

    def label(self, registry: str) -> str:
        with self._lock:
            if registry in self._own:
                return registry
            if registry not in self._folded and len(self._own) < self.limit:
                self._own.add(registry)
                return registry
            self._folded.add(registry)
            return OTHER_REGISTRIES

    def owns(self, registry: str) -> bool:
        """Whether ``registry`` has series of its own (never assigns a place)."""
        with self._lock:
            return registry in self._own

    def forget(self, registry: str) -> None:
        with self._lock:
            self._own.discard(registry)
            self._folded.discard(registry)

    @property
    def folded(self) -> int:
        with self._lock:
            return len(self._folded)


class Metrics:
    """All service metrics, in a registry of their own so that apps in one process don't clash."""

    def __init__(self, max_registries: int) -> None:
        self.registry = CollectorRegistry()
        self.registry_labels = RegistryLabels(max_registries)
        self._folded_tools: dict[str, int] = {}  # folded registry -> its tools (summed)
        self._folded_total = 0
        self._folded_lock = threading.Lock()
        self.stage_seconds = Histogram(
            "shortlist_request_duration_seconds",
            "Time spent answering POST /shortlist, per stage.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "shortlist_requests",
            "Shortlists served.",
            ["registry", "policy"],
            registry=self.registry,
        )
        self.k = Histogram(
            "shortlist_k",
            "Length of the shortlists served.",
            ["registry"],
            buckets=K_BUCKETS,
            registry=self.registry,
        )
        self.registry_tools = Gauge(
            "shortlist_registry_tools",
            "Tools in each registry's current version.",
            ["registry"],
            registry=self.registry,
        )
        self.registry_version = Gauge(
            "shortlist_registry_version",
            "Current version of each registry.",
            ["registry"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            "shortlist_http_requests",
            "HTTP requests by route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.ready = Gauge(
            "shortlist_ready", "1 once models, policy and registries are loaded.",
            registry=self.registry,
        )
        self.store_up = Gauge(
            "shortlist_store_up",
            "1 while the registry store answers; 0 during an outage (queries are still served "
            "from memory, writes get 503).",
            registry=self.registry,
        )
        self.damaged_versions = Gauge(
            "shortlist_registry_damaged_versions",
            "Registries whose newest version file is unreadable (an older version is served; "
            "/readyz names them).",
            registry=self.registry,
        )
        self.policy_requests = Counter(
            "shortlist_policy_requests",
            "Shortlists served, by registry and the depth policy version that served them "
            "('default', a registry's refit 'refit-3', or the policy name: fixed, gap, threshold).",
            ["registry", "policy_version"],
            registry=self.registry,
        )
        self.folded_registries = Gauge(
            "shortlist_metrics_folded_registries",
            "Registries whose series are summed under registry=\"~other\" because more than "
            "SHORTLIST_METRICS_MAX_REGISTRIES registries are loaded (this process).",
            registry=self.registry,
        )
        self.folded_registries.set_function(lambda: float(self.registry_labels.folded))
        self.store_up.set(1)
        for stage in STAGES:  # export every series from the start, at zero
            self.stage_seconds.labels(stage)

    def observe_shortlist(self, result: Shortlist) -> None:
        for stage in STAGES:
            if stage in result.timings:
                self.stage_seconds.labels(stage).observe(result.timings[stage])
        label = self.registry_labels.label(result.registry)
        self.requests.labels(label, result.policy).inc()
        self.k.labels(label).observe(result.k)
        self.policy_requests.labels(label, result.policy_version or result.policy).inc()

    def set_registry(self, registry: str, version: int, tools: int) -> None:
        """A registry's size and version; a folded one adds its tools to ``~other``'s size (a
        version has no sum, so ``~other`` has none)."""
        if self.registry_labels.label(registry) == registry:
            self.registry_tools.labels(registry).set(tools)
            self.registry_version.labels(registry).set(version)
            return
        with self._folded_lock:
            self._folded_total += tools - self._folded_tools.get(registry, 0)
            self._folded_tools[registry] = tools
            self.registry_tools.labels(OTHER_REGISTRIES).set(self._folded_total)

    def drop_registry(self, registry: str) -> None:
        """Stop exporting every series labelled with ``registry`` (it was deleted); a folded
        registry's tools leave ``~other``'s size (its past counts stay in ``~other``'s counters)."""
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase):
                remove_registry_series(metric, registry)
        with self._folded_lock:
            if registry in self._folded_tools:
                self._folded_total -= self._folded_tools.pop(registry)
                self.registry_tools.labels(OTHER_REGISTRIES).set(self._folded_total)
        self.registry_labels.forget(registry)


def remove_registry_series(metric: MetricWrapperBase, registry: str) -> None:
    """Remove ``metric``'s children whose ``registry`` label is ``registry`` (whatever their
    other labels); a metric without a ``registry`` label is left alone."""
    # prometheus_client keeps a metric's label names private; remove() takes them in this order
    labelnames: tuple[str, ...] = tuple(getattr(metric, "_labelnames", ()))
    if "registry" not in labelnames:
        return
    children = {
        tuple(sample.labels[name] for name in labelnames)
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get("registry") == registry
    }
    for values in children:
        with contextlib.suppress(KeyError):
            metric.remove(*values)


class QueryCacheCollector(Collector):
    """Exports the query-embedding cache's lookups and size (nothing while it is off or loading)."""

    def __init__(self, stats: Callable[[], QueryCacheStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        lookups = CounterMetricFamily(
            "shortlist_query_embedding_cache_lookups",
            "Query embeddings looked up in the LRU cache, by result.",
            labels=["result"],
        )
        lookups.add_metric(["hit"], stats.hits)
        lookups.add_metric(["miss"], stats.misses)
        yield lookups
        yield GaugeMetricFamily(
            "shortlist_query_embedding_cache_entries",
            "Query embeddings held in the cache (at most SHORTLIST_QUERY_CACHE_SIZE).",
            value=stats.entries,
        )
