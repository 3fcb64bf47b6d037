"""Bringing a :class:`registry.core.Shortlister` up: the start-up sequence, in order.

:func:`load` runs on the core's loader thread (or inline) and, step by step:

1. builds the embedder (behind the query cache when it is on) and the engine;
2. arms the wipe recovery: from here on a shared store that lost its data is refilled from
   this replica, not mirrored (:func:`registry.writes.sync.republish_from`);
3. loads every stored registry, then the demo registry when configured;
4. restores what feedback needs: the shortlists a graceful shutdown saved (local mode) and the
   feedback log, compacting it when due;
5. starts the usage memory (registry.learning) on the loaded engine;
6. tells the registry listeners, starts the replica sync (shared store) and the policy poll,
   marks the core ready, and resumes unfinished background jobs.

While the shared store is unreachable each step is retried (the core is not ready and says
why); any other failure leaves the core answering health checks with ``load_error`` set. This
module is the core's own start-up, kept beside it: it reads and sets the core's private state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from registry.backends import HoldsBackWrites, start_learner
from registry.errors import ShortlistError, StoreUnavailable
from registry.index.query_cache import CachedEmbedder
from registry.store.base import SharedStore
from registry.tools import ToolLimits, parse_tools
from registry.writes.engine import ShortlistEngine
from registry.writes.sync import StoreSync, republish_from

if TYPE_CHECKING:
    from registry.core import Shortlister

log = logging.getLogger(__name__)

__all__ = ["DEMO_REGISTRY", "load", "pending_path"]

DEMO_REGISTRY = "demo"
T = TypeVar("T")


def pending_path(core: Shortlister) -> Path:
    """Where a graceful shutdown saves the shortlists still awaiting feedback (local mode)."""
    return Path(core.settings.data_dir) / "feedback" / "pending-shortlists.jsonl"


def until_store_answers(core: Shortlister, step: Callable[[], T]) -> T:
    """Run a start-up step, retrying while the shared store is unreachable (not ready yet)."""
    while True:
        try:
            result = step()
        except StoreUnavailable as exc:
            if core._closing.is_set():
                raise
            core.load_error = f"{exc.message} (retrying)"
            core._closing.wait(core.settings.sync_interval_seconds)
            continue
        core.load_error = None
        return result


def load(core: Shortlister) -> None:
    """The start-up sequence (module docstring); sets ``core.engine`` or ``core.load_error``."""
    try:
        _load(core)
    except ShortlistError as exc:
        core.load_error = exc.message
        log.error("start-up failed: %s", exc.message)
    except Exception as exc:  # keep answering health checks; readiness reports the failure
        core.load_error = f"{type(exc).__name__}: {exc}"
        log.exception("start-up failed")


def _load(core: Shortlister) -> None:
    settings, recorder = core.settings, core.feedback_recorder
    embedder = core._embedder_factory(settings)
    if settings.query_cache_size > 0:
        embedder = core.query_cache = CachedEmbedder(embedder, settings.query_cache_size)
    engine = ShortlistEngine(
        settings, core.store, embedder, core.bor_policy, usage=core.learning, policy_book=core.policies.book
    )
    # before the first store call: a store wiped from here on is refilled, not mirrored
    republish_from(engine, core.store, recorder, core._write_back_after_wipe)
    count = until_store_answers(core, engine.load_all)
    log.info("loaded %d registries", count)
    until_store_answers(core, lambda: _load_demo(core, engine))
    _restore_pending(core, engine)
    restored = until_store_answers(core, recorder.restore)
    log.info("restored %d feedback events from the log", restored)
    recorder.maybe_compact()
    core._loading = engine
    until_store_answers(core, lambda: start_learner(core.learning, engine, embedder, recorder.log, core.store))
    for info in engine.list_registries():
        core._changed(info)
    store = core.store
    shared = isinstance(store, SharedStore)
    if isinstance(store, SharedStore):
        engine.add_listener(core._notify)
        memory = recorder.memory
        core.sync = StoreSync(
            engine,
            store,
            interval=settings.sync_interval_seconds,
            feedback=recorder,
            on_tick=memory.flush_pending if isinstance(memory, HoldsBackWrites) else None,
            learned=core._write_back_after_wipe,
        )
    core.policies.start(settings.sync_interval_seconds if shared else None)
    core.engine = engine
    resumed = until_store_answers(core, lambda: core.write_jobs.resume(engine, core._notifying))
    resumed += until_store_answers(core, core.policies.resume)
    if resumed:
        log.warning("%d unfinished background jobs resumed after a restart", resumed)
    if core.sync is not None and not core._closing.is_set():
        core.sync.start()


def _restore_pending(core: Shortlister, engine: ShortlistEngine) -> None:
    """Local mode: take back the shortlists a graceful shutdown saved; after any other stop,
    feedback for one served before this start gets 410 saying why."""
    if not core.feedback_recorder.restore_pending(pending_path(core)) and engine.list_registries():
        core._losses.append(
            (core._started, "the service restarted without a graceful shutdown (pending "
             "shortlists are kept across a graceful one only)")
        )


def _load_demo(core: Shortlister, engine: ShortlistEngine) -> None:
    path: Path | None = core.settings.demo_registry
    if path is None or engine.has_registry(DEMO_REGISTRY):
        return
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    parse_tools(payload, ToolLimits())  # fail on a broken demo file before writing anything
    info = engine.create_registry(DEMO_REGISTRY, payload)  # replicas racing: one creates it
    if info is not None:
        log.info("loaded demo registry from %s (%d tools)", path, info.tools)
