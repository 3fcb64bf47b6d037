"""Every store a core keeps its state in, from one backend: :class:`Stores`.

A backend is one function ``(store args, feedback args) -> Stores`` that builds all of them: the local one
(:func:`registry.store.local_stores.local_stores`, files under the data directory) or the Redis
one (:func:`registry.store.redis_stores.redis_stores`, one connection shared by replicas). The
assembly (:mod:`registry.assembly`) picks one by name; nothing else knows which it got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from registry.feedback import FeedbackLog, RememberedShortlists, SharedFeedbackLog
from registry.settings import FeedbackArgs, StoreArgs
from registry.store.base import SharedStore, Store
from registry.store.job_records import JobRecords
from registry.store.learning import LearningStore
from registry.store.policies import PolicyStore

__all__ = ["StoreBackend", "Stores"]


@dataclass(frozen=True, slots=True)
class Stores:
    """What one backend built.

    Attributes:
        registries: the registry versions and the embedding cache.
        shortlists: the served shortlists awaiting feedback.
        feedback_log: the durable feedback log.
        learning: the usage memories and learning switches.
        policies: the per-registry depth-policy histories.
        job_records: durable background jobs (202 uploads, refits).
        caller_key: keys the caller hashes (:mod:`registry.store.caller_key`).
        health: the backend's up/down flag (``StoreHealth`` in Redis; None locally).
        log_reader: a reader of its own on a shared feedback log, which the usage learner
            tails (None: the log is this process's own, replayed once at start).
    """

    registries: Store
    shortlists: RememberedShortlists
    feedback_log: FeedbackLog
    learning: LearningStore
    policies: PolicyStore
    job_records: JobRecords
    caller_key: Callable[[], bytes]
    health: Any = None
    log_reader: Callable[[], SharedFeedbackLog] | None = None

    @property
    def shared(self) -> bool:
        """Several replicas share the registries (the store is a :class:`SharedStore`)."""
        return isinstance(self.registries, SharedStore)


class StoreBackend(Protocol):
    """Builds every store of one kind from the store group and the feedback group (how long
    remembered shortlists are kept, whether the local log archives what it compacts)."""

    def __call__(self, store: StoreArgs, feedback: FeedbackArgs) -> Stores: ...
