"""Refit jobs and policy versions of every registry: what the admin routes and the CLI call.

A refit reads the feedback log, fits and evaluates a rule (:func:`registry.learning.refit.refit`)
and, when it passes the guard, stores it as the registry's new active version. Every refit is
a durable *job* (:mod:`registry.job_queue`) run by one worker thread per process, never on the query
path: one refit at a time, at most ``refit_queue_max`` queued (then 429), and a job a restart
interrupted runs again at the next start. It reads only the log lines appended since the
previous refit (:class:`registry.learning.refit_events.RefitEvents`). Job states: ``queued``,
``running``, then ``done`` (a new version is active), ``candidate`` (a new version is stored
but not active: it changes mean K so much that an admin activates it), ``refused`` (the guard
said no; nothing changed) or ``failed`` (an error; nothing changed).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from registry.errors import NotFound
from registry.feedback import FeedbackEvent, FeedbackLog
from registry.job_queue import OPEN_STATES, JobQueue, JobRecords, Task
from registry.learning.evidence import EvidenceConfig
from registry.learning.refit import refit
from registry.learning.refit_data import Replay
from registry.learning.refit_events import RefitEvents
from registry.serving.stop_rules import PolicyBook
from registry.settings import RefitArgs

__all__ = ["JOB_STATES", "PolicyManager", "RefitHooks", "RefitJob"]

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "done", "candidate", "refused", "failed")
WAIT_SECONDS = 3600.0  # a synchronous refit (CLI, in-process) waits at most this long


REPLAY_EVENTS = 5000  # a replaying refit ranks at most this many of the newest events again


@dataclass(frozen=True, slots=True)
class RefitHooks:
    """What the core lends each refit.

    Attributes:
        fit_profiles: the refit's first step, ``(registry, events) -> report`` fitting and
            shipping the registry's usage-profile weight (None: learning is off).
        replay: ``registry -> Replay``: its logged requests ranked again as served now
            (:mod:`registry.learning.refit_data`); None, or a None replay: the logged scores.
    """

    fit_profiles: Callable[[str, list[FeedbackEvent]], dict[str, Any] | None] | None = None
    replay: Callable[[str], Replay | None] | None = None


@dataclass(frozen=True, slots=True)
class RefitJob:
    job: str
    registry: str
    state: str = "queued"
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
        fields.setdefault("job", d.get("id"))
        return cls(**fields)


class PolicyManager:
    """Versions, activation and refits of the per-registry depth policies.

    Args:
        book: the active rules this replica serves.
        feedback_log: the log refits read (incrementally).
        refit: the refit group (``SHORTLIST_REFIT_*``).
        records: where refit jobs are kept (beside the registries).
        hooks: the core's profile fit and replay (:class:`RefitHooks`; default: neither).
        evidence: the evidence rule a refit counts events by (the learning group's).
        lease_seconds: how long a dead replica's refit stays claimed (``SHORTLIST_JOB_LEASE_SECONDS``).
    """

    def __init__(
        self,
        book: PolicyBook,
        feedback_log: FeedbackLog,
        refit: RefitArgs,
        records: JobRecords,
        hooks: RefitHooks | None = None,
        *,
        evidence: EvidenceConfig | None = None,
        lease_seconds: float = 30.0,
    ) -> None:
        self.book = book
        self.events = RefitEvents(feedback_log)
        self.args = refit
        self.evidence = evidence or EvidenceConfig()
        self.queue = JobQueue("refit", records, limit=refit.refit_queue_max, what="refits", lease_seconds=lease_seconds)
        self._open: dict[str, str] = {}  # registry -> its unfinished job here
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._poller: threading.Thread | None = None
        self.hooks = hooks or RefitHooks()

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
        self.queue.close()

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
        """Queue a refit of ``registry`` and, unless ``background``, wait for its outcome. A
        registry with a refit queued or running here gets that job back.

        Raises:
            QueueFull: ``refit_queue_max`` refits are unfinished here (nothing was queued).
        """
        with self._lock:
            job_id = self._open.get(registry)
            record = self.queue.get(job_id) if job_id is not None else None
            if record is None or record.get("state") not in OPEN_STATES:
                job_id = uuid.uuid4().hex[:16]
                record = self.queue.submit(
                    {"id": job_id, "job": job_id, "registry": registry}, self._task(registry)
                )
                self._open[registry] = job_id
        if background:
            return RefitJob.from_json(record)
        return RefitJob.from_json(self.queue.wait(record["id"], WAIT_SECONDS) or record)

    def job(self, registry: str, job_id: str) -> RefitJob:
        record = self.queue.get(job_id)
        if record is None or record.get("registry") != registry:
            raise NotFound(
                f"no refit job {job_id!r} for registry {registry!r} (finished jobs are kept a day)",
                {"registry": registry, "job": job_id},
            )
        return RefitJob.from_json(record)

    def resume(self) -> int:
        """Queue again the refits a stopped process left unfinished (at start)."""

        def make_task(record: dict[str, Any], _: bytes | None) -> Task:
            with self._lock:
                self._open[record["registry"]] = record["id"]
            return self._task(record["registry"])

        return self.queue.resume(make_task)

    def _task(self, registry: str) -> Task:
        def run() -> dict[str, Any]:
            try:
                return self._run(registry)
            finally:
                with self._lock:
                    self._open.pop(registry, None)

        return run

    def _run(self, registry: str) -> dict[str, Any]:
        try:
            current = self.book.history(registry).active_rule
            events = self.events.of(registry)
            hooks = self.hooks
            profile = hooks.fit_profiles(registry, events) if hooks.fit_profiles is not None else None
            replay = hooks.replay(registry) if hooks.replay is not None else None  # after the fit:
            outcome = refit(  # the new profile weight is in the ranking it replays
                events if replay is None else events[-REPLAY_EVENTS:],
                registry,
                current,
                min_events=self.args.refit_min_events,
                margin=self.args.refit_margin,
                confidence=self.args.refit_confidence,
                evidence=self.evidence,
                max_mean_k=self.args.refit_max_mean_k,
                review_factor=self.args.refit_review_factor,
                replay=replay,
            )
            version = None
            if outcome.state in ("done", "candidate") and outcome.rule is not None:
                history = self.book.add(outcome.rule, registry, activate=outcome.state == "done")
                version = history.versions[-1].version
            log.info("refit of %r: %s (%s)", registry, outcome.state, outcome.reason)
            return {
                "state": outcome.state,
                "reason": outcome.reason,
                "version": version,
                "active": self.book.history(registry).active,
                "estimate": {**outcome.estimate, "profile": profile} if profile else outcome.estimate,
            }
        except Exception as exc:
            log.exception("refit of %r failed", registry)
            return {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"}
