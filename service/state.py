"""Process-wide service state, built in the app's lifespan and reached through dependencies."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from registry.depth.policies import DepthPolicy, OnnxDepthPolicy
from registry.engine import ShortlistEngine
from registry.errors import ShortlistError
from registry.feedback import (
    FeedbackRecorder,
    LiveWindow,
    LocalFeedbackLog,
    ShortlistMemory,
    ToolEfficiency,
)
from registry.index.embed import Embedder, load_minilm
from registry.settings import Settings
from registry.store.base import Store
from registry.store.local import LocalStore
from registry.tools import ToolLimits, parse_tools
from service.feedback_metrics import FeedbackMetrics
from service.metrics import Metrics

log = logging.getLogger(__name__)

DEMO_REGISTRY = "demo"
EmbedderFactory = Callable[[Settings], Embedder]


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
        self.store = store or LocalStore(settings.data_dir)
        window = LiveWindow(settings.live_window_seconds)
        self.feedback = FeedbackRecorder(
            ShortlistMemory(settings.feedback_retention_seconds, settings.max_remembered_shortlists),
            LocalFeedbackLog.in_data_dir(settings.data_dir),
            window,
            ToolEfficiency(),
        )
        self.feedback_metrics = FeedbackMetrics(self.metrics.registry, window)
        self.feedback.add_listener(self.feedback_metrics.observe)
        self._thread: threading.Thread | None = None

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

    def _load(self) -> None:
        try:
            embedder = self._embedder_factory(self.settings)
            engine = ShortlistEngine(self.settings, self.store, embedder, self.bor_policy)
            count = engine.load_all()
            log.info("loaded %d registries", count)
            self._load_demo(engine)
            restored = self.feedback.restore()
            log.info("restored %d feedback events from the log", restored)
            for info in engine.list_registries():
                self.registry_changed(info.registry, info.version, info.tools)
            self.engine = engine
            self.metrics.ready.set(1)
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

    def _load_demo(self, engine: ShortlistEngine) -> None:
        path: Path | None = self.settings.demo_registry
        if path is None or engine.has_registry(DEMO_REGISTRY):
            return
        import json

        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        parse_tools(payload, ToolLimits())  # fail on a broken demo file before writing anything
        info = engine.put_registry(DEMO_REGISTRY, payload)
        log.info("loaded demo registry from %s (%d tools)", path, info.tools)
