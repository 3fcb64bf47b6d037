"""The usage memory inside a running service: fed by feedback, read by the query path, kept.

:class:`UsageLearner` owns a :class:`~registry.learning.usage.UsageMemory` and

* folds every feedback event this process accepts (a feedback listener), and in shared mode
  every event other replicas append to the shared log (its own reader, on its own thread), so
  replicas agree; events are deduplicated by shortlist id, so overlaps are harmless;
* lifts the query path's ranking (:meth:`rerank`, called by ``registry.serving.shortlist.QueryRunner``)
  unless learning is off for the registry;
* saves each changed registry's memory every ``save_interval`` seconds and at close, restores
  it at start and then folds the logged events received after it;
* forgets a deleted tool's memory, wipes a deleted registry's, and applies switches and
  wipes made on other replicas (their control records, read every tick);
* ships the registry's learned companions at a refit (:meth:`fit_companions`, in the control
  record every replica reads) and hands them to the query path by position (:meth:`companions`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from registry.errors import ShortlistError
from registry.feedback import FeedbackEvent
from registry.index.snapshot import Snapshot
from registry.learning.companions import CompanionConfig, fit_companions
from registry.learning.configs import profile_config, usage_config
from registry.learning.neighbourhood import Ranked, event_rankings, fit_similarity
from registry.learning.profiles import ProfileConfig, fit_weight
from registry.learning.usage import UsageEvent, UsageMemory
from registry.serving.chains import Companions, LearnedEdge
from registry.settings import LearningArgs
from registry.store.learning import Control, LearningStore

__all__ = ["UsageLearner"]

log = logging.getLogger(__name__)

FIT_EVENTS = 5000  # a profile-weight fit reads at most this many of the newest events
KnownTools = Callable[[str], Collection[str] | None]
EventSource = Callable[[], Iterable[UsageEvent]]


class UsageLearner:
    """Usage-augmented ranking for a service (see the module docstring).

    Args:
        learning: the learning group (``SHORTLIST_LEARNING*``).
        store: where states and control records live.
        known_tools: registry -> its current tool names (None: no such registry).
        clock: wall clock (wipe times).
        refit_margin: the gain a fitted profile weight must show (``SHORTLIST_REFIT_MARGIN``).
        poll_seconds: longest wait between two looks at a shared log (the replicas' sync interval).
        require_caller: count only events that name their caller (query tokens identify them).
    """

    def __init__(
        self,
        learning: LearningArgs,
        store: LearningStore,
        known_tools: KnownTools,
        clock: Callable[[], float] = time.time,
        *,
        refit_margin: float = 0.0,
        poll_seconds: float = 1.0,
        require_caller: bool = False,
    ) -> None:
        self.args = learning
        self.store = store
        self.known_tools = known_tools
        self.memory = UsageMemory(self._not_attached, usage_config(learning, require_caller=require_caller))
        self.save_interval = float(learning.learning_save_interval_seconds)
        self.poll_seconds = poll_seconds
        self.refit_margin = refit_margin
        self._clock = clock
        self._controls: dict[str, Control] = {}
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        self._source: EventSource | None = None
        self._source_lock = threading.Lock()  # the learner thread and a compaction both read it
        self._backlog: Iterable[UsageEvent] = ()
        self._backlog_folded = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_save = time.monotonic()
        self._companions: dict[str, tuple[tuple[int, int, int], Companions]] = {}  # per snapshot
        self.companion_config = CompanionConfig()
        self.attached = False

    @staticmethod
    def _not_attached(text: str) -> np.ndarray:
        raise RuntimeError("the usage learner has no embedder yet")

    # -- start and stop -------------------------------------------------------------------------

    def attach(
        self,
        embed: Callable[[str], np.ndarray],
        registries: Iterable[str],
        *,
        backlog: Iterable[UsageEvent] = (),
        source: EventSource | None = None,
        background: bool = True,
    ) -> None:
        """Start learning: restore the saved states of ``registries``, then fold ``backlog``
        (the logged events; those already in a state are skipped) and, each tick, ``source``
        (new events of a shared log) on a background thread.
        """
        self.memory.embed = embed
        self._controls = self._read_controls()
        for registry in registries:
            self._restore(registry)
        self._backlog, self._source = backlog, source
        self.attached = True
        if background:
            self._thread = threading.Thread(target=self._run, name="usage-learner", daemon=True)
            self._thread.start()
        else:
            self._fold(self._backlog)
            self._backlog_folded.set()

    def restore_saved(self, registries: Iterable[str]) -> None:
        """Take the saved memories of ``registries`` (after falling behind a compaction of the
        shared log: the compacting replica saved them, cut events included, just before); the
        rest of the log is then folded on top, events already in a state skipped."""
        for registry in registries:
            self._restore(registry)

    def _restore(self, registry: str) -> None:
        try:
            raw = self.store.load_state(registry)
            if raw is not None:
                self.memory.load_state(registry, raw)
        except (ValueError, ShortlistError) as exc:
            log.error("usage memory of %r not restored (it relearns from feedback): %s", registry, exc)
        control = self._controls.get(registry)
        if control is not None and control.wiped_at > 0:
            self._apply_wipe(registry, control.wiped_at)
        if control is not None:
            self.memory.set_weight(registry, control.profile_weight)
            self.memory.set_similarity(registry, control.similarity)

    def close(self) -> None:
        """Stop the thread and save what changed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self.attached:
            self.save(everything=True)  # a checkpoint of every memory at a graceful shutdown

    def _run(self) -> None:
        self._fold(self._backlog)
        self._backlog = ()
        self._backlog_folded.set()
        interval = min(self.poll_seconds, self.save_interval)
        while not self._stop.wait(interval):
            try:
                self.tick()
            except ShortlistError as exc:  # the shared store is down: try again next tick
                log.warning("usage learner tick failed: %s", exc.message)
            except Exception:
                log.exception("usage learner tick failed")

    def tick(self) -> None:
        """Apply other replicas' switches and wipes, fold new shared events, save when due."""
        if self._source is not None:
            # merged, never replaced: a record is only ever rewritten (a wipe or a deletion
            # writes one), so one missing here was lost with the store's data, and this
            # replica's copy is what write_back puts back
            self._controls = {**self._controls, **self._read_controls()}
            self._apply_controls()
            self._fold_source()
        if time.monotonic() - self._last_save >= self.save_interval:
            self.save()

    def _fold_source(self) -> None:
        if self._source is not None:
            with self._source_lock:
                self._fold(self._source())

    def checkpoint(self, timeout: float = 30.0) -> bool:
        """Fold every event logged so far and save what changed: called before a feedback
        compaction cuts events out of the log, so no learned evidence exists only in memory.
        False (the compaction waits) while the logged backlog is still being folded or a save
        failed; True when learning is off or every change is saved."""
        if not self.args.learning:
            return True
        if not self.attached or not self._backlog_folded.wait(timeout):
            return False
        self._fold_source()
        self.save()
        with self._dirty_lock:
            return not self._dirty

    def _fold(self, events: Iterable[UsageEvent]) -> None:
        for event in events:
            if self._stop.is_set():
                return
            self.observe(event)

    # -- feedback in ----------------------------------------------------------------------------

    def enabled(self, registry: str) -> bool:
        """Learning is on globally (``SHORTLIST_LEARNING``) and for ``registry``."""
        control = self._controls.get(registry)
        return bool(self.args.learning) and (control is None or control.enabled)

    def observe(self, event: UsageEvent) -> str:
        """Fold one event (the feedback listener); returns what the memory said, or
        ``"disabled"`` / ``"unknown_registry"``."""
        if not self.attached:
            return "not_attached"
        if not self.enabled(event.registry):
            return "disabled"
        known = self.known_tools(event.registry)
        if known is None:
            return "unknown_registry"
        outcome = self.memory.observe(event, known_tools=known)
        if outcome == "counted":
            with self._dirty_lock:
                self._dirty.add(event.registry)
        return outcome

    # -- the query path -------------------------------------------------------------------------

    def rerank(
        self, snap: Snapshot, query: np.ndarray, ids: np.ndarray, scores: np.ndarray,
        *, exclude_repeats: bool = False, with_profiles: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, scores)`` of ``snap`` lifted by usage and re-sorted (unchanged when the
        registry has no memory or learning is off for it; ``exclude_repeats``: a refit's replay,
        the memory's recall of the query's own repeats left out)."""
        if not self.memory.has_memory(snap.registry) or not self.enabled(snap.registry):
            return ids, scores
        top = ids[: self.memory.config.candidates]
        names = [snap.tools[int(i)].name for i in top]
        extra = None
        if with_profiles and self.memory.weight(snap.registry) > 0:
            extra = self.memory.profile_lift(snap.registry, query, names, snap.dense.embeddings[top])
        return self.memory.rerank(snap.registry, query, names, ids, scores, extra, exclude_repeats)

    # -- registry changes, switches, wipes ------------------------------------------------------

    def registry_changed(self, registry: str, tools: Collection[str] | None) -> None:
        """A registry got a new version with ``tools`` (forget deleted tools' memory), or was
        deleted (``tools`` None: wipe it)."""
        if tools is None:
            self.wipe(registry, reset=True)
        elif self.memory.drop_tools(registry, tools):
            with self._dirty_lock:
                self._dirty.add(registry)

    def set_enabled(self, registry: str, enabled: bool) -> dict[str, Any]:
        """Switch learning on or off for ``registry`` (memory is kept; off: no lift, no folding)."""
        control = replace(self._control(registry), enabled=enabled)
        self._ship(registry, control)
        return self.report(registry)

    def wipe(self, registry: str, *, reset: bool = False) -> dict[str, Any]:
        """Forget everything learned for ``registry``, on every replica; earlier events never count.

        ``reset`` (the registry was deleted): the switch goes back to on as well, so a registry
        re-created under the name starts as any new one does, not with the old one's switch."""
        at = self._clock()
        control = Control(enabled=reset or self._control(registry).enabled, wiped_at=at)
        self._ship(registry, control)
        self._apply_wipe(registry, at)
        if reset:
            self.memory.set_weight(registry, control.profile_weight)
            self.memory.set_similarity(registry, control.similarity)
        self.store.delete_state(registry)
        return self.report(registry)

    def set_profile_weight(self, registry: str, weight: float, fit: dict[str, Any]) -> None:
        """Ship a fitted profile weight for ``registry`` (a refit), on every replica."""
        control = replace(self._control(registry), profile_weight=float(weight), profile_fit=fit)
        self._ship(registry, control)
        self.memory.set_weight(registry, weight)

    def set_similarity(self, registry: str, similarity: float | None, fit: dict[str, Any]) -> None:
        """Ship a fitted memory neighbourhood for ``registry`` (a refit), on every replica."""
        control = replace(self._control(registry), similarity=similarity, similarity_fit=fit)
        self._ship(registry, control)
        self.memory.set_similarity(registry, similarity)

    def fit_profile_weight(
        self, snap: Snapshot, events: Iterable[FeedbackEvent],
        base_ranking: Ranked | None = None, *, plain_ranking: Ranked | None = None,
    ) -> dict[str, Any]:
        """Fit ``snap``'s registry's memory neighbourhood (with ``plain_ranking``: each request's
        ranking by the base scorer alone; :mod:`registry.learning.neighbourhood`), then its
        profile fusion weight, on its logged events (the most recent :data:`FIT_EVENTS`), and
        ship each on every replica when its guard passes; the fit report (the neighbourhood's
        under ``"neighbourhood"``). ``base_ranking``: each request's ranking before the
        profiles, as a new phrasing meets it (:func:`registry.serving.replay.base_ranking`, read
        after the neighbourhood shipped); None: the logged ranking and scores."""
        registry = snap.registry
        rows = [e for e in events if e.registry == registry and e.query and e.used][-FIT_EVENTS:]
        ids = snap.by_name
        rows = [e for e in rows if any(u in ids for u in e.used)]
        cfg = profile_config(self.args, self.refit_margin)
        if not self.attached or len(rows) < cfg.min_fit_events:
            fit = {"events": len(rows), "reason": f"{len(rows)} events; fitting a weight needs {cfg.min_fit_events}"}
            weight = 0.0
            hood: dict[str, Any] | None = None
        else:
            vecs = np.stack([np.asarray(self.memory.embed(e.query), np.float32) for e in rows])
            used = [[ids[u] for u in e.used if u in ids] for e in rows]
            common: dict[str, Any] = {"keys": [e.query for e in rows], "received": [e.received for e in rows]}
            hood = None if plain_ranking is None else self._fit_similarity(
                snap, rows, vecs, used, cfg, plain_ranking, common)
            cands, base = event_rankings(snap, rows, vecs, cfg.candidates, base_ranking)
            weight, fit = fit_weight(
                vecs, used, [e.caller for e in rows], snap.dense.embeddings, cfg, candidates=cands,
                base_scores=base, shown=[[ids[n] for n in e.shown if n in ids] for e in rows], **common,
            )
        if weight != self.memory.weight(registry) or fit.get("reason") == "shipped":
            self.set_profile_weight(registry, weight, fit)
        out = {**fit, "weight": weight}
        return out if hood is None else {**out, "neighbourhood": hood}

    def _fit_similarity(
        self, snap: Snapshot, rows: list[FeedbackEvent], vecs: np.ndarray, used: list[list[int]],
        cfg: ProfileConfig, plain: Ranked, common: dict[str, Any],
    ) -> dict[str, Any]:
        mem = self.memory.config
        cands, base = event_rankings(snap, rows, vecs, cfg.candidates, plain)
        tau, fit = fit_similarity(vecs, used, [e.caller for e in rows], cfg, candidates=cands, base_scores=base,
                                  beta=mem.beta, n0=mem.n0, **common)
        if tau is not None:
            self.set_similarity(snap.registry, tau, fit)
        return {**fit, "similarity": self.memory.similarity(snap.registry)}

    def fit_companions(self, snap: Snapshot, events: Iterable[FeedbackEvent]) -> dict[str, Any]:
        """Fit ``snap``'s registry's learned companions on its counts and logged events
        (:func:`registry.learning.companions.fit_companions`) and ship them on every replica;
        the fit report."""
        registry = snap.registry
        rows = [e for e in events if e.registry == registry]
        counts = self.memory.companion_counts(registry)
        edges, fit = fit_companions(counts, rows, self.companion_config, snap.by_name)
        self.set_companions(registry, edges, fit)
        return fit

    def set_companions(self, registry: str, edges: list[dict[str, Any]], fit: dict[str, Any]) -> None:
        """Ship learned companion edges for ``registry`` (a refit), on every replica."""
        control = replace(self._control(registry), companions=tuple(edges), companions_fit=fit)
        self._ship(registry, control)

    def companions(self, snap: Snapshot) -> Companions | None:
        """The registry's shipped companions by ``snap``'s positions (None: none, or learning is
        off for it); an edge of a deleted tool, or one an admin removed from the graph, is left
        out. Built once per snapshot and shipped set."""
        control = self._controls.get(snap.registry)
        if control is None or not control.companions or not self.enabled(snap.registry):
            return None
        key = (id(snap), snap.version, id(control.companions))
        cached = self._companions.get(snap.registry)
        if cached is not None and cached[0] == key:
            return cached[1]
        at = snap.by_name
        built = Companions.of(
            LearnedEdge(at[e["first"]], at[e["then"]], float(e["uses"]), int(e["callers"]),
                        float(e["share"]), float(e["back"]))
            for e in self.learned_edges(snap)
            if e["active"]
        )
        self._companions = {**self._companions, snap.registry: (key, built)}
        return built

    def learned_edges(self, snap: Snapshot) -> list[dict[str, Any]]:
        """The shipped companion edges of ``snap``'s registry with their evidence (the graph
        route): ``active`` is false for an edge an admin removed or while learning is off."""
        control = self._controls.get(snap.registry)
        if control is None:
            return []
        removed = set(snap.graph.edits.removed)
        on = self.enabled(snap.registry)
        return [
            {**e, "active": on and (e["first"], e["then"]) not in removed}
            for e in control.companions
            if e.get("first") in snap.by_name and e.get("then") in snap.by_name
        ]

    def _apply_controls(self) -> None:
        for registry, control in self._controls.items():
            if control.wiped_at > self._wiped_at(registry):
                self._apply_wipe(registry, control.wiped_at)
            if self.memory.weight(registry) != control.profile_weight:
                self.memory.set_weight(registry, control.profile_weight)
            self.memory.set_similarity(registry, control.similarity)

    def _apply_wipe(self, registry: str, at: float) -> None:
        if at > self._wiped_at(registry):
            self.memory.wipe(registry, at)
        with self._dirty_lock:
            self._dirty.discard(registry)

    def _wiped_at(self, registry: str) -> float:
        wiped = self.memory.report(registry).get("wiped_at")
        return float(wiped or 0.0)

    def _ship(self, registry: str, control: Control) -> None:
        """Make ``control`` the registry's record: stored for every replica, in force here now."""
        self.store.set_control(registry, control)
        self._controls = {**self._controls, registry: control}

    def _control(self, registry: str) -> Control:
        return self._controls.get(registry) or Control()

    def _read_controls(self) -> dict[str, Control]:
        try:
            return self.store.controls()
        except (ValueError, OSError) as exc:
            log.error("learning control records unreadable (defaults apply): %s", exc)
            return {}

    # -- reads and saving -----------------------------------------------------------------------

    def report(self, registry: str) -> dict[str, Any]:
        """The registry report's ``learning`` section."""
        control = self._control(registry)
        return {
            "profile_fit": control.profile_fit,
            "similarity_fit": control.similarity_fit,
            "companions": len(control.companions),
            "companions_fit": control.companions_fit,
            "enabled": self.enabled(registry),
            "global_enabled": bool(self.args.learning),
            "registry_enabled": control.enabled,
            **self.memory.report(registry),
        }

    def write_back(self) -> int:
        """After the shared store lost its data: write every memory and switch this replica
        holds back to it (a replica started later, or one that restarts, finds them). Returns
        how many memories were saved."""
        for registry, control in sorted(self._controls.items()):
            try:
                self.store.set_control(registry, control)
            except (OSError, ShortlistError) as exc:
                log.warning("learning switch of %r not written back: %s", registry, exc)
        return self.save(everything=True)

    def save(self, *, everything: bool = False) -> int:
        """Save every registry whose memory changed since the last save (``everything``: every
        registry it holds); returns how many."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            if everything:
                dirty |= set(self.memory.registries())
        self._last_save = time.monotonic()
        saved = 0
        for registry in sorted(dirty):
            if self.known_tools(registry) is None:
                continue  # deleted meanwhile: never resurrect its state
            raw = self.memory.state_bytes(registry)
            if raw is None:
                continue
            try:
                self.store.save_state(registry, raw)
                saved += 1
            except (OSError, ShortlistError) as exc:
                log.warning("usage memory of %r not saved (retried later): %s", registry, exc)
                with self._dirty_lock:
                    self._dirty.add(registry)
        return saved
