"""Usage memory: past queries and the tools agents used for them lift those tools for new,
similar queries (Tool2Vec/COLT-style usage-augmented ranking).

Every accepted feedback event adds evidence "this query text means these tools". Per registry
the memory keeps, for each tool, at most ``per_tool`` query embeddings with a count each
(near-identical queries, cosine >= ``dedupe``, share one entry and add to its count), and at
most ``per_registry`` entries in all (the least used, then the oldest, go first). Evidence per
tool of an event::

    a call of the tool was useful, or no call of it was reported and success is not False   +1
    every reported call of it was useless                                 -1 (only on an entry
                                                                          it already has)
    success False and no useful call                                      nothing

At query time only the ``candidates`` best tools of the base ranking can be lifted (usage alone
never brings in a tool the query does not match), by::

    k_i     = clip((cos(q, v_i) - tau) / (1 - tau), 0, 1)                 per memory entry i
    e_t     = sum over t's entries of max(count_i, 0) * k_i               local evidence
    lift_t  = beta * e_t / (sum over candidates of e + n0)                a share, damped by n0

so a tool gains at most ``beta`` and only as far as past queries close to this one used it
rather than the other candidates; one stray event weighs ``1 / (1 + n0)`` of that. ``tau`` is
the registry's neighbourhood: ``similarity`` until a refit fits one on the registry's own
feedback (:mod:`registry.learning.neighbourhood`; 0.99 when neighbours name other tools: then
only repeats are recalled).

Each event's evidence is weighted by the one evidence rule (:mod:`registry.learning.evidence`:
a per-caller rate per minute, decay per caller and tool, a soft share across callers), and the
positive part also feeds the tool's usage profile (:mod:`registry.learning.profiles`), scored
with the registry's fitted weight (:meth:`profile_lift`; 0 until a refit ships one).

Safety: with ``require_caller`` (query tokens set) an event without a caller does not count;
:meth:`wipe` forgets a registry; events are deduplicated by ``shortlist_id`` (restarts, replicas
replaying the log) and ignored when received before a wipe. Thread-safe; :meth:`boost` reads
immutable per-tool arrays without locking."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from registry.learning import usage_state as state
from registry.learning.companions import CompanionCounts, event_sequence
from registry.learning.evidence import EvidenceCounter, principal
from registry.learning.profiles import capped_lift
from registry.learning.usage_events import UsageConfig, UsageEvent, tool_evidence
from registry.learning.usage_state import RegistryMemory, ToolMemory, decode_state, encode_state

__all__ = ["UsageConfig", "UsageEvent", "UsageMemory", "tool_evidence"]

#: Events received up to this long before the newest one folded may still arrive (other
#: replicas, clock skew); older ones are taken as folded already when the memory is restored.
REPLAY_HORIZON_SECONDS = 600.0
_MAX_SEEN_IDS = 100_000
REPORT_TOOLS = 1000  # the report lists the tools with most evidence, at most this many


class UsageMemory:
    """Per-registry usage memory (see the module docstring).

    Args:
        embed: text -> unit query vector (the engine's, query-cached, embedder).
        config: the knobs.
    """

    def __init__(self, embed: Callable[[str], np.ndarray], config: UsageConfig | None = None) -> None:
        self.embed = embed
        self.config = config or UsageConfig()
        self._registries: dict[str, RegistryMemory] = {}
        self._weights: dict[str, float] = {}
        self._similarity: dict[str, float] = {}  # fitted neighbourhoods (else config.similarity)
        self._lock = threading.RLock()

    # -- writes ---------------------------------------------------------------------------------

    def observe(
        self,
        event: UsageEvent,
        *,
        known_tools: Collection[str] | None = None,
        vector: np.ndarray | None = None,
    ) -> str:
        """Fold one feedback event in.

        Args:
            event: the event (its ``query`` and ``caller`` say who asked what).
            known_tools: the registry's current tools (others are skipped); None: all.
            vector: the query's embedding when at hand (else ``embed(event.query)``).

        Returns:
            ``"counted"``, or why not: ``"duplicate"``, ``"stale"`` (before a wipe or far
            before a restored state), ``"no_query"``, ``"untrusted"`` (no caller while callers
            are required), ``"rate_limited"`` (the caller's events this minute), ``"no_evidence"``.
        """
        query, caller = event.query, event.caller
        cfg = self.config
        with self._lock:
            reg = self._registries.setdefault(event.registry, self._new_registry())
            reason = self._admit(reg, event, query, caller)
            if reason is None:
                evidence = tool_evidence(event)
                if known_tools is not None:
                    evidence = {t: s for t, s in evidence.items() if t in known_tools}
                if not any(s > 0 for s in evidence.values()) and not any(
                    t in reg.tools for t in evidence
                ):
                    reason = "no_evidence"
            if reason is not None:
                if reason != "duplicate":
                    reg.skipped[reason] = reg.skipped.get(reason, 0) + 1
                if reason in ("no_evidence", "no_query"):  # final for this event: a replay of
                    self._remember_id(reg, event)  # the log after a restore is a duplicate
                return reason
            self._remember_id(reg, event)
        q = state.unit_vector(vector if vector is not None else self.embed(query))
        with self._lock:
            reg = self._registries.setdefault(event.registry, self._new_registry())
            reg.seq += 1
            weights = reg.counter.weigh(caller, evidence, event.received)
            for tool, sign in evidence.items():
                self._add(reg, tool, q, float(sign) * weights[tool])
                if sign > 0:
                    reg.add_profile(tool, q, weights[tool])
            sequence = event_sequence(event, known_tools, evidence)
            if sequence:  # which tools go together, in which order (companions)
                reg.companions.add(sequence, weights, principal(caller))
            for tool in event.shown:  # shown, and the agent used another
                if tool not in evidence and (known_tools is None or tool in known_tools):
                    reg.passed_over.add(tool, q)
            while reg.entries > cfg.per_registry:
                self._evict_one(reg)
            reg.counted += 1
            key = principal(caller)  # shares are per token, as the limits
            reg.callers[key] = reg.callers.get(key, 0) + 1
            reg.bound_callers()
        return "counted"

    def _new_registry(self) -> RegistryMemory:
        return RegistryMemory(counter=EvidenceCounter(self.config.evidence))

    def _admit(self, reg: RegistryMemory, event: UsageEvent, query: str, caller: str | None) -> str | None:
        cfg = self.config
        if event.shortlist_id in reg.seen_ids:
            return "duplicate"
        if event.received < reg.wiped_at or event.received < reg.watermark - REPLAY_HORIZON_SECONDS:
            return "stale"
        if not query.strip():
            return "no_query"
        if caller is None and cfg.require_caller:
            return "untrusted"
        return reg.counter.check(caller, event.received)

    @staticmethod
    def _remember_id(reg: RegistryMemory, event: UsageEvent) -> None:
        reg.seen_ids[event.shortlist_id] = event.received
        reg.watermark = max(reg.watermark, event.received)
        horizon = reg.watermark - REPLAY_HORIZON_SECONDS
        ids = reg.seen_ids
        while ids and (len(ids) > _MAX_SEEN_IDS or next(iter(ids.values())) < horizon):
            ids.popitem(last=False)

    def _add(self, reg: RegistryMemory, tool: str, q: np.ndarray, sign: float) -> None:
        cfg = self.config
        mem = reg.tools.get(tool)
        if mem is not None and len(mem.counts):
            sims = mem.vectors @ q
            best = int(np.argmax(sims))
            if sims[best] >= cfg.dedupe:
                counts, seen = mem.counts.copy(), mem.seen.copy()
                counts[best] += sign
                seen[best] = reg.seq
                reg.tools[tool] = ToolMemory(mem.vectors, counts, seen)
                return
        if sign <= 0:
            return  # negative evidence only tempers an entry the tool already has
        if mem is None:
            mem = ToolMemory(np.empty((0, q.shape[0]), np.float32), np.empty(0, np.float32), np.empty(0, np.int64))
        vectors = np.vstack([mem.vectors, q[None, :]])
        counts = np.append(mem.counts, np.float32(sign)).astype(np.float32)
        seen = np.append(mem.seen, reg.seq).astype(np.int64)
        reg.entries += 1
        if len(counts) > cfg.per_tool:
            keep = np.ones(len(counts), bool)
            keep[state.weakest_entry(counts, seen)] = False
            vectors, counts, seen = vectors[keep], counts[keep], seen[keep]
            reg.entries -= 1
        vectors.setflags(write=False)
        reg.tools[tool] = ToolMemory(vectors, counts, seen)

    def _evict_one(self, reg: RegistryMemory) -> None:
        """Drop the weakest entry of the tool holding the most entries."""
        tool = max(reg.tools, key=lambda t: len(reg.tools[t].counts))
        mem = reg.tools[tool]
        keep = np.ones(len(mem.counts), bool)
        keep[state.weakest_entry(mem.counts, mem.seen)] = False
        reg.entries -= 1
        if keep.any():
            reg.tools[tool] = ToolMemory(mem.vectors[keep], mem.counts[keep], mem.seen[keep])
        else:
            del reg.tools[tool]

    def drop_tools(self, registry: str, keep: Collection[str]) -> int:
        """Forget the tools of ``registry`` not in ``keep`` (deleted tools); returns how many."""
        with self._lock:
            reg = self._registries.get(registry)
            if reg is None:
                return 0
            gone = [t for t in reg.tools if t not in keep]
            for tool in gone:
                reg.entries -= len(reg.tools.pop(tool).counts)
            profiles = [t for t in reg.profile_sums if t not in keep]
            for tool in profiles:
                reg.drop_profile(tool)
            for tool in [t for t in reg.passed_over.sums if t not in keep]:
                reg.passed_over.drop(tool)
            return len({*gone, *profiles, *reg.companions.drop(keep)})

    def wipe(self, registry: str, at: float) -> None:
        """Forget everything learned for ``registry``; events received before ``at`` never count."""
        with self._lock:
            self._registries[registry] = RegistryMemory(wiped_at=float(at), counter=EvidenceCounter(self.config.evidence))
            self._weights.pop(registry, None)
            self._similarity.pop(registry, None)

    def forget(self, registry: str) -> None:
        """Drop ``registry`` from memory entirely (it was deleted)."""
        with self._lock:
            self._registries.pop(registry, None)
            self._weights.pop(registry, None)
            self._similarity.pop(registry, None)

    def registries(self) -> list[str]:
        with self._lock:
            return sorted(self._registries)

    def has_memory(self, registry: str) -> bool:
        """Whether ``registry`` has any entry (the query path's fast exit)."""
        reg = self._registries.get(registry)
        return reg is not None and (bool(reg.tools) or bool(reg.profile_sums))

    # -- reads ----------------------------------------------------------------------------------

    def boost(
        self, registry: str, query: np.ndarray, names: Sequence[str], scores: np.ndarray,
        exclude_repeats: bool = False,
    ) -> np.ndarray:
        """``scores`` (of the tools ``names``, best first) plus their usage lifts; only the first
        ``candidates`` can be lifted. Returns a new float32 array, same order."""
        out = np.array(scores, dtype=np.float32, copy=True)
        reg = self._registries.get(registry)
        if reg is None or not reg.tools or not len(out):
            return out
        evidence = self.evidence(reg, query, names[: self.config.candidates], exclude_repeats,
                                 self.similarity(registry))
        total = float(evidence.sum())
        if total > 0:
            cfg = self.config
            out[: len(evidence)] += (cfg.beta * evidence / (total + cfg.n0)).astype(np.float32)
        return out

    def evidence(
        self, reg: RegistryMemory, query: np.ndarray, names: Sequence[str], exclude_repeats: bool,
        similarity: float,
    ) -> np.ndarray:
        """Local evidence ``e_t`` of each of ``names`` for ``query`` (``exclude_repeats``: entries
        at or above the dedupe cosine, the query's own repeats, count nothing; ``similarity``:
        the registry's neighbourhood ``tau``, :meth:`similarity`).

        ``sum_i c_i * max(s_i - tau, 0) / (1 - tau)`` is computed as
        ``(c . max(s, tau) - tau * sum(c)) / (1 - tau)``: three numpy calls per tool.
        """
        tau = similarity
        tools = reg.tools
        out = np.zeros(len(names), dtype=np.float32)
        for i, name in enumerate(names):
            mem = tools.get(name)
            if mem is None:
                continue
            sims = mem.vectors @ query
            if exclude_repeats:
                sims[sims >= self.config.dedupe] = tau
            np.maximum(sims, tau, out=sims)
            out[i] = float(mem.positive @ sims) - tau * mem.positive_sum
        out /= max(1e-6, 1.0 - tau)
        np.maximum(out, 0.0, out=out)  # rounding
        return out

    def profile_lift(
        self, registry: str, query: np.ndarray, names: Sequence[str], descriptions: np.ndarray
    ) -> np.ndarray:
        """``weight * lift_t`` of the usage profiles (:mod:`registry.learning.profiles`) for
        ``names`` (the candidates), given their description embeddings ``d_t`` (rows, unit);
        zeros while the registry's fitted weight is 0. With ``profile_center`` the cosines are
        taken about the registry's mean request."""
        out = np.zeros(len(names), np.float32)
        reg = self._registries.get(registry)
        weight = self._weights.get(registry, 0.0)
        if reg is None or weight <= 0 or not reg.profile_sums:
            return out
        n0 = self.config.profile_n0
        q = np.asarray(query, np.float32)
        mu = reg.profile_mean() if self.config.profile_center else None
        if mu is not None:
            q = q - mu
            q = q / max(float(np.linalg.norm(q)), 1e-9)
        for j, name in enumerate(names):
            total = reg.profile_sums.get(name)
            if total is None:
                continue
            mass = reg.profile_mass[name]
            usage, described = total / mass, np.asarray(descriptions[j], np.float32)
            if mu is not None:
                usage, described = usage - mu, described - mu
            norm, d_norm = float(np.linalg.norm(usage)), float(np.linalg.norm(described))
            if norm > 0 and d_norm > 0:
                cos = float(usage @ q) / norm - float(described @ q) / d_norm
                out[j] = weight * mass / (mass + n0) * cos
        return out

    def set_weight(self, registry: str, weight: float) -> None:
        """The registry's fitted fusion weight of the usage profiles (0: no profile lift)."""
        with self._lock:
            self._weights[registry] = float(weight)

    def weight(self, registry: str) -> float:
        return self._weights.get(registry, 0.0)

    def set_similarity(self, registry: str, similarity: float | None) -> None:
        """The registry's fitted neighbourhood ``tau`` (:mod:`registry.learning.neighbourhood`;
        None: the configured one)."""
        with self._lock:
            if similarity is None:
                self._similarity.pop(registry, None)
            else:
                self._similarity[registry] = float(similarity)

    def similarity(self, registry: str) -> float:
        """The neighbourhood ``tau`` the registry's memory lifts from."""
        return self._similarity.get(registry, self.config.similarity)

    def rerank(
        self,
        registry: str,
        query: np.ndarray,
        names: Sequence[str],
        ids: np.ndarray,
        scores: np.ndarray,
        extra: np.ndarray | None = None,
        exclude_repeats: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """A ranking ``(ids, scores)`` (``names[j]`` is tool ``ids[j]``'s name) lifted (plus
        ``extra`` on the first ``len(extra)``, the profile lift) and re-sorted, best first
        (stable: ties keep the base order)."""
        lifted = self.boost(registry, query, names, scores, exclude_repeats)
        m = min(len(extra), len(lifted)) if extra is not None else 0
        if extra is not None and m:
            reg = self._registries.get(registry)
            if self.config.profile_unseen_guard and reg is not None:  # never over an untried tool
                tried = [n in reg.profile_sums or reg.passed_over.tried(n, query) for n in names[:m]]
                extra = capped_lift(lifted[:m], extra[:m], np.array(tried, bool))
            lifted[:m] += extra[:m]
        order = np.argsort(-lifted, kind="stable")
        return np.asarray(ids)[order], lifted[order]

    def report(self, registry: str, top_callers: int = 10) -> dict[str, Any]:
        """Events counted and skipped, tools with memory, entries, the callers' shares."""
        with self._lock:
            reg = self._registries.get(registry) or RegistryMemory()
            counted = reg.counted
            callers = sorted(reg.callers.items(), key=lambda kv: (-kv[1], kv[0]))[:top_callers]
            ranked = sorted(reg.profile_mass.items(), key=lambda kv: (-kv[1], kv[0]))
            return {
                "profile_weight": self._weights.get(registry, 0.0),
                "similarity": self.similarity(registry),
                "similarity_fitted": registry in self._similarity,
                "profiles": [
                    {"tool": t, "evidence": round(m, 3), "shrink": round(m / (m + self.config.profile_n0), 3)}
                    for t, m in ranked[:REPORT_TOOLS]
                ],
                "tools_with_profile": len(ranked),
                "events": counted,
                "skipped": dict(sorted(reg.skipped.items())),
                "tools_with_memory": len(reg.tools),
                "companion_pairs": len(reg.companions.pairs),
                "entries": reg.entries,
                "wiped_at": reg.wiped_at or None,
                "caller_shares": [
                    {"caller": c or None, "events": n, "share": n / counted if counted else 0.0}
                    for c, n in callers
                ],
            }

    def entries(self, registry: str, tool: str | None = None) -> int:
        """Entries held for ``registry`` (one tool's with ``tool``)."""
        with self._lock:
            reg = self._registries.get(registry)
            if reg is None:
                return 0
            if tool is None:
                return reg.entries
            mem = reg.tools.get(tool)
            return 0 if mem is None else len(mem.counts)

    def companion_counts(self, registry: str) -> CompanionCounts:
        """A copy of the registry's pair and order counts (:mod:`registry.learning.companions`)."""
        with self._lock:
            reg = self._registries.get(registry)
            return CompanionCounts() if reg is None else reg.companions.copy()

    # -- persistence ----------------------------------------------------------------------------

    def state_bytes(self, registry: str) -> bytes | None:
        """The registry's memory as one ``.npz`` blob (vectors as float16), or None if unknown."""
        with self._lock:
            reg = self._registries.get(registry)
            return None if reg is None else encode_state(reg)

    def load_state(self, registry: str, raw: bytes) -> None:
        """Replace the registry's memory with a :meth:`state_bytes` blob.

        Raises:
            ValueError: the blob is unreadable or of another format.
        """
        try:
            reg = decode_state(raw, self.config.evidence)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise ValueError(f"usage memory state of {registry!r} is unreadable: {exc}") from exc
        with self._lock:
            self._registries[registry] = reg

