"""Process-wide service state, built in the app's lifespan and reached through dependencies."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from registry.depth.policies import DepthPolicy, OnnxDepthPolicy
from registry.engine import RegistryChange, ShortlistEngine
from registry.errors import ShortlistError, StoreUnavailable
from registry.feedback import (
    FeedbackLog,
    FeedbackRecorder,
    LiveWindow,
    LocalFeedbackLog,
    RememberedShortlists,
    ShortlistMemory,
    ToolEfficiency,
)
from registry.index.embed import Embedder, load_minilm
from registry.settings import Settings
from registry.store.base import SharedStore, Store
from registry.store.local import LocalStore
from registry.sync import StoreSync
from registry.tools import ToolLimits, parse_tools
from service.feedback_metrics import FeedbackMetrics
from service.metrics import Metrics

log = logging.getLogger(__name__)

DEMO_REGISTRY = "demo"
EmbedderFactory = Callable[[Settings], Embedder]
T = TypeVar("T")


def default_embedder(settings: Settings) -> Embedder:
    return load_minilm(settings.resolved_embedder_cache(), threads=settings.embed_threads)


class ServiceState:
    """What the routes need: the engine once loaded, metrics, and readiness."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder_factory: EmbedderFactory = default_embedder,
        bor_policy: DepthPolicy | None = None,
        store: Store | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.engine: ShortlistEngine | None = None
        self.load_error: str | None = None
        self._embedder_factory = embedder_factory
        # The policy is checked synchronously so that a schema mismatch stops start-up loudly.
        self.bor_policy = bor_policy or OnnxDepthPolicy.from_dir(settings.policy_dir)
        memory: RememberedShortlists
        feedback_log: FeedbackLog
        if store is None and settings.redis_url is not None:
            store, memory, feedback_log = self._redis_backends(settings)
        else:
            memory = ShortlistMemory(
                settings.feedback_retention_seconds, settings.max_remembered_shortlists
            )
            feedback_log = LocalFeedbackLog.in_data_dir(settings.data_dir, archive=settings.feedback_archive)
        self.store: Store = store or LocalStore(settings.data_dir)
        window = LiveWindow(settings.live_window_seconds)
        self.feedback = FeedbackRecorder(
            memory,
            feedback_log,
            window,
            ToolEfficiency(),
            compact_after_events=settings.feedback_compact_events,
            min_compact_interval_seconds=settings.feedback_compact_interval_seconds,
            compact_margin_seconds=settings.feedback_compact_margin_seconds,
        )
        self.feedback_metrics = FeedbackMetrics(self.metrics.registry, window)
        self.feedback.add_listener(self.feedback_metrics.observe)
        self.sync: StoreSync | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def _redis_backends(
        self, settings: Settings
    ) -> tuple[Store, RememberedShortlists, FeedbackLog]:
        """Registries, remembered shortlists and the feedback log in one shared Redis."""
        from registry.store.redis import (
            RedisFeedbackLog,
            RedisShortlistMemory,
            RedisStore,
            StoreHealth,
            connect,
        )

        assert settings.redis_url is not None
        url = settings.redis_url.get_secret_value()
        client = connect(url)
        health = StoreHealth()
        prefix = settings.redis_prefix
        # Every Redis call reports to `health`; the gauge reads it at scrape time.
        self.metrics.store_up.set_function(lambda: 1.0 if health.up else 0.0)
        # /shortlist remembers each shortlist in Redis: a short timeout of its own bounds what
        # a Redis that stops answering can add to a query before the outage is noticed.
        memory = RedisShortlistMemory(
            connect(url, timeout=0.5), settings.feedback_retention_seconds, prefix, health
        )
        return RedisStore(client, prefix, health), memory, RedisFeedbackLog(client, prefix, health)

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def start_loading(self, background: bool = True) -> None:
        """Load the embedder and every registry; in a thread so /healthz answers meanwhile."""
        if background:
            self._thread = threading.Thread(target=self._load, name="shortlist-loader", daemon=True)
            self._thread.start()
        else:
            self._load()

    def wait_ready(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    def close(self) -> None:
        """Stop the sync thread and release store connections (at shutdown)."""
        self._closing.set()
        if self.sync is not None:
            self.sync.stop()
        if isinstance(self.store, SharedStore):
            self.store.close()

    def _until_store_answers(self, step: Callable[[], T]) -> T:
        """Run a start-up step, retrying while the shared store is unreachable (not ready yet)."""
        while True:
            try:
                result = step()
            except StoreUnavailable as exc:
                if self._closing.is_set():
                    raise
                self.load_error = f"{exc.message} (retrying)"
                self._closing.wait(self.settings.sync_interval_seconds)
                continue
            self.load_error = None
            return result

    def _load(self) -> None:
        try:
            embedder = self._embedder_factory(self.settings)
            engine = ShortlistEngine(self.settings, self.store, embedder, self.bor_policy)
            count = self._until_store_answers(engine.load_all)
            log.info("loaded %d registries", count)
            self._until_store_answers(lambda: self._load_demo(engine))
            restored = self._until_store_answers(self.feedback.restore)
            log.info("restored %d feedback events from the log", restored)
            self.feedback.maybe_compact()
            for info in engine.list_registries():
                self.registry_changed(info.registry, info.version, info.tools)
            if isinstance(self.store, SharedStore):
                engine.add_listener(self._registry_synced)
                memory = self.feedback.memory
                self.sync = StoreSync(
                    engine,
                    self.store,
                    interval=self.settings.sync_interval_seconds,
                    feedback=self.feedback,
                    on_tick=getattr(memory, "flush_pending", None),
                )
            self.engine = engine
            self.metrics.ready.set(1)
            if self.sync is not None and not self._closing.is_set():
                self.sync.start()
        except ShortlistError as exc:
            self.load_error = exc.message
            log.error("start-up failed: %s", exc.message)
        except Exception as exc:  # keep serving /healthz and report the failure on /readyz
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("start-up failed")

    def registry_changed(self, registry: str, version: int, tools: int) -> None:
        self.metrics.set_registry(registry, version, tools)
        self.feedback_metrics.touch(registry)

    def registry_deleted(self, registry: str) -> None:
        self.metrics.drop_registry(registry)

    def _registry_synced(self, change: RegistryChange) -> None:
        if change.info is None:
            self.registry_deleted(change.registry)
        else:
            self.registry_changed(change.registry, change.info.version, change.info.tools)

    def _load_demo(self, engine: ShortlistEngine) -> None:
        path: Path | None = self.settings.demo_registry
        if path is None or engine.has_registry(DEMO_REGISTRY):
            return
        import json

        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        parse_tools(payload, ToolLimits())  # fail on a broken demo file before writing anything
        info = engine.create_registry(DEMO_REGISTRY, payload)  # replicas racing: one creates it
        if info is not None:
            log.info("loaded demo registry from %s (%d tools)", path, info.tools)
