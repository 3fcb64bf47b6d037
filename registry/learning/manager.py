"""Refit jobs and policy versions of every registry: what the admin routes and the CLI call.

A refit reads the feedback log, fits and evaluates a rule (:func:`registry.learning.refit.refit`)
and, when it passes the guard, stores it as the registry's new active version. It runs on the
caller's thread (synchronous) or on a background thread (a *job*, polled by id), never on the
query path. Job states: ``running``, then ``done`` (a new version is active), ``candidate`` (a new version is stored but
not active: it changes mean K so much that an admin activates it), ``refused`` (the
guard said no; nothing changed) or ``failed`` (an error; nothing changed).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from registry.errors import NotFound
from registry.feedback import FeedbackEvent
from registry.learning.evidence import evidence_config
from registry.learning.refit import refit
from registry.serving.stop_rules import (
    LocalPolicyStore,
    PolicyBook,
    PolicyStore,
    RedisPolicyStore,
)
from registry.settings import Settings

__all__ = ["JOB_STATES", "PolicyManager", "RefitJob", "refit_from_settings"]

log = logging.getLogger(__name__)

JOB_STATES = ("running", "done", "candidate", "refused", "failed")
JOB_TTL_SECONDS = 86_400


@dataclass(frozen=True, slots=True)
class RefitJob:
    job: str
    registry: str
    state: str = "running"
    reason: str = ""
    version: str | None = None  # the version activated (done) or None
    active: str | None = None  # the registry's active version when the job ended
    estimate: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    finished: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "registry": self.registry,
            "state": self.state,
            "reason": self.reason,
            "version": self.version,
            "active": self.active,
            "estimate": self.estimate,
            "created": self.created,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RefitJob:
        fields: dict[str, Any] = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**fields)


class _Jobs:
    """Job records: in memory, or in Redis (``<prefix>policy-job:<id>``, a day's TTL) so any
    replica answers a poll."""

    def __init__(self, client: Any = None, prefix: str = "") -> None:
        self._client = client
        self._key = f"{prefix}policy-job:"
        self._local: dict[str, RefitJob] = {}
        self._lock = threading.Lock()

    def put(self, job: RefitJob) -> None:
        with self._lock:
            self._local[job.job] = job
            while len(self._local) > 1000:
                self._local.pop(next(iter(self._local)))
        if self._client is not None:
            self._client.set(self._key + job.job, json.dumps(job.to_json()), ex=JOB_TTL_SECONDS)

    def get(self, job_id: str) -> RefitJob | None:
        if self._client is not None:
            raw = self._client.get(self._key + job_id)
            if raw is not None:
                return RefitJob.from_json(json.loads(raw))
        return self._local.get(job_id)


class PolicyManager:
    """Versions, activation and refits of the per-registry depth policies.

    Args:
        book: the active rules this replica serves.
        events: the feedback log's events (read once per refit).
        settings: refit knobs (``refit_min_events``, ``refit_margin``, ``refit_confidence``).
    """

    def __init__(
        self,
        book: PolicyBook,
        events: Callable[[], Iterable[FeedbackEvent]],
        settings: Settings,
        jobs: _Jobs | None = None,
    ) -> None:
        self.book = book
        self.events = events
        self.settings = settings
        self._jobs = jobs or _Jobs()
        self._running: dict[str, RefitJob] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._poller: threading.Thread | None = None
        #: a refit's first step, the usage profiles' weight (set by the core; None: none)
        self.fit_profiles: Callable[[str, list[FeedbackEvent]], dict[str, Any] | None] | None = None

    @classmethod
    def for_settings(
        cls,
        settings: Settings,
        events: Callable[[], Iterable[FeedbackEvent]],
        *,
        shared: bool,
        client: Any = None,
    ) -> PolicyManager:
        """Redis-backed when the settings name a Redis and the registry store is shared; on
        ``client`` when given (the connection :func:`registry.backends.build_backends` shares)."""
        store: PolicyStore
        jobs = None
        if shared and settings.redis_url is not None:
            from registry.store.redis import connect

            client = client or connect(settings.redis_url.get_secret_value())
            store = RedisPolicyStore(client, settings.redis_prefix)
            jobs = _Jobs(client, settings.redis_prefix)
        else:
            store = LocalPolicyStore(settings.data_dir)
        return cls(PolicyBook(store), events, settings, jobs)

    # -- serving ----------------------------------------------------------------------------------

    def start(self, poll_seconds: float | None) -> None:
        """Load the active rules; with ``poll_seconds``, re-read them whenever the store's epoch
        moves (other replicas' refits and rollbacks), on a daemon thread."""
        try:
            self.book.refresh(force=True)
        except Exception as exc:  # the shared store is down: the poll loads them later
            log.warning("depth policies not loaded yet: %s", exc)
        if poll_seconds is None or self._poller is not None:
            return

        def poll() -> None:
            while not self._closing.wait(poll_seconds):
                try:
                    if self.book.refresh():
                        log.info("depth policies reloaded from the shared store")
                except Exception as exc:  # the store is down: keep serving the rules held
                    log.debug("policy poll failed: %s", exc)

        self._poller = threading.Thread(target=poll, name="policy-poll", daemon=True)
        self._poller.start()

    def close(self) -> None:
        self._closing.set()

    # -- admin ------------------------------------------------------------------------------------

    def listing(self, registry: str) -> dict[str, Any]:
        """Every version of ``registry``'s policy, the active one and the one this replica serves."""
        history = self.book.history(registry)
        versions = [{"version": "default", "kind": "bias", "bias_offset": 0.0, "created": None}]
        versions += [v.to_json() for v in history.versions]
        for v in versions:
            v["active"] = v["version"] == history.active
        return {
            "registry": registry,
            "active": history.active,
            "serving": self.book.active(registry).version,
            "versions": versions,
        }

    def activate(self, registry: str, version: str) -> dict[str, Any]:
        """Make ``version`` active (a rollback, or back to ``default``). Raises NotFound."""
        self.book.activate(registry, version)
        return self.listing(registry)

    def forget(self, registry: str) -> None:
        self.book.forget(registry)

    # -- refits -----------------------------------------------------------------------------------

    def refit(self, registry: str, *, background: bool = False) -> RefitJob:
        """Run a refit of ``registry`` (on a thread with ``background``); one at a time per
        registry (a second request returns the running job)."""
        with self._lock:
            running = self._running.get(registry)
            if running is not None:
                return running
            job = RefitJob(uuid.uuid4().hex[:16], registry, created=time.time())
            self._running[registry] = job
        self._jobs.put(job)
        if not background:
            return self._run(job)
        threading.Thread(target=self._run, args=(job,), name=f"refit-{registry}", daemon=True).start()
        return job

    def job(self, registry: str, job_id: str) -> RefitJob:
        job = self._jobs.get(job_id)
        if job is None or job.registry != registry:
            raise NotFound(
                f"no refit job {job_id!r} for registry {registry!r}",
                {"registry": registry, "job": job_id},
            )
        return job

    def _run(self, job: RefitJob) -> RefitJob:
        registry = job.registry
        try:
            current = self.book.history(registry).active_rule
            events = [e for e in self.events() if e.registry == registry]
            profile = self.fit_profiles(registry, events) if self.fit_profiles is not None else None
            outcome = refit(
                events,
                registry,
                current,
                min_events=self.settings.refit_min_events,
                margin=self.settings.refit_margin,
                confidence=self.settings.refit_confidence,
                evidence=evidence_config(self.settings),
                max_mean_k=self.settings.refit_max_mean_k,
                review_factor=self.settings.refit_review_factor,
            )
            version = None
            if outcome.state in ("done", "candidate") and outcome.rule is not None:
                history = self.book.add(outcome.rule, registry, activate=outcome.state == "done")
                version = history.versions[-1].version
            log.info("refit of %r: %s (%s)", registry, outcome.state, outcome.reason)
            finished = replace(
                job,
                state=outcome.state,
                reason=outcome.reason,
                version=version,
                active=self.book.history(registry).active,
                estimate={**outcome.estimate, "profile": profile} if profile else outcome.estimate,
            )
        except Exception as exc:
            log.exception("refit of %r failed", registry)
            finished = replace(job, state="failed", reason=f"{type(exc).__name__}: {exc}")
        finished = replace(finished, finished=time.time())
        self._jobs.put(finished)
        with self._lock:
            self._running.pop(registry, None)
        return finished


def refit_from_settings(settings: Settings, registry: str) -> RefitJob:
    """``shortlist refit``: refit one registry from the configured store's feedback log (local
    directory or Redis), outside any server; running replicas pick the result up (Redis: on
    their next policy poll; local: at restart)."""
    from registry.feedback import FeedbackLog, LocalFeedbackLog

    feedback_log: FeedbackLog
    shared = settings.redis_url is not None
    if settings.redis_url is not None:
        from registry.store.redis import RedisFeedbackLog, StoreHealth, connect

        client = connect(settings.redis_url.get_secret_value())
        feedback_log = RedisFeedbackLog(client, settings.redis_prefix, StoreHealth())
    else:
        feedback_log = LocalFeedbackLog.in_data_dir(settings.data_dir, archive=settings.feedback_archive)
    manager = PolicyManager.for_settings(settings, feedback_log.replay, shared=shared)
    return manager.refit(registry)
