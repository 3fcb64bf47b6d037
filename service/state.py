"""The HTTP face's state: the core (:class:`registry.core.Shortlister`) plus Prometheus metrics."""

from __future__ import annotations

from registry.core import DEMO_REGISTRY, EmbedderFactory, Shortlister
from registry.feedback import FeedbackRecorder
from registry.serving.depth_policies import TunableDepthPolicy
from registry.snapshots import RegistryChange
from service.feedback_metrics import FeedbackMetrics
from service.metrics import Metrics, QueryCacheCollector
from service.settings import ServiceSettings

__all__ = ["DEMO_REGISTRY", "EmbedderFactory", "ServiceState"]


class ServiceState:
    """What the routes need: the core, its metrics export, and readiness."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        embedder_factory: EmbedderFactory | None = None,
        bor_policy: TunableDepthPolicy | None = None,
    ) -> None:
        self._settings = settings  # the core keeps the domain's part; the faces read the rest
        self.core = Shortlister.from_settings(
            settings, embedder_factory=embedder_factory, bor_policy=bor_policy
        )
        self.metrics = Metrics(settings.metrics_max_registries)
        self.feedback_metrics = FeedbackMetrics(
            self.metrics.registry, self.core.window, self.metrics.registry_labels
        )
        self.metrics.ready.set_function(lambda: 1.0 if self.core.ready else 0.0)
        health = self.core.store_health
        if health is not None:  # read at scrape time
            self.metrics.store_up.set_function(lambda: 1.0 if health.up else 0.0)
        self.metrics.damaged_versions.set_function(lambda: float(len(self.core.store_warnings())))
        self.core.add_registry_listener(self._registry_changed)
        self.core.add_shortlist_listener(self.metrics.observe_shortlist)
        self.core.add_feedback_listener(self.feedback_metrics.observe)
        self.metrics.registry.register(
            QueryCacheCollector(lambda: self.core.query_cache.stats() if self.core.query_cache else None)
        )

    def _registry_changed(self, change: RegistryChange) -> None:
        if change.info is None:
            self.feedback_metrics.drop(change.registry)
            self.metrics.drop_registry(change.registry)  # last: it forgets the registry's label
        else:
            self.metrics.set_registry(change.registry, change.info.version, change.info.tools)
            self.feedback_metrics.touch(change.registry)

    # The core's state, under the names the routes and tests use.

    @property
    def settings(self) -> ServiceSettings:
        return self._settings

    @property
    def feedback(self) -> FeedbackRecorder:
        return self.core.feedback_recorder

    @property
    def load_error(self) -> str | None:
        return self.core.load_error

    @property
    def ready(self) -> bool:
        return self.core.ready

    def start_loading(self, background: bool = True) -> None:
        self.core.start(background)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.core.wait_ready(timeout)

    def close(self) -> None:
        self.core.close()
