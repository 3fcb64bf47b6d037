"""Usage profiles: how a registry's users ask for each tool, learned from feedback, scored
against new requests (issue 22; Tool2Vec-style usage embeddings).

Evidence. Every counted event adds its query's unit embedding ``q`` to the profile of each
tool it reports as used, with the weight ``w`` the evidence rule gives it
(:mod:`registry.learning.evidence`: per-caller rate, decay per caller and tool, soft share).

Profile. Per tool ``t`` with evidence ``n_t = sum w`` and weighted query sum ``S_t``::

    c_t     = S_t / |S_t|                  the usage centroid (unit)
    a_t     = n_t / (n_t + n0)             shrinkage: one event weighs 1 / (1 + n0)
    lift_t  = a_t * (cos(q, c_t) - cos(q, d_t))

with ``d_t`` the tool's description embedding: the lift says how much better the request
matches how users asked for the tool than how the tool describes itself; a tool without
evidence has lift 0. The ranking adds ``weight * lift_t`` to the ``candidates`` best tools'
scores (usage never brings in a tool the request does not match).

Why seen tools passed unseen ones (the first version's -6.3 found@1 on MetaTool's unseen-tool
requests): requests resemble each other more than they resemble tool descriptions (phrasing,
"I want to ..."), so every usage centroid carries that shared style and ``cos(q, c_t) -
cos(q, d_t)`` is positive for *any* profiled tool on almost any request, while a tool nobody
has used has lift 0 and falls behind.

Unseen guard (``unseen_guard``, the default; :func:`capped_lift`). A lift never moves a
candidate above an *untried* candidate the base ranking put above it (no profile, and not
shown :data:`PASSED_OVER` times for requests like this one while the agent used another tool,
:class:`PassedOver`): a tool
nobody has had the chance to use keeps its base rank, so a request for a new tool keeps its
rank-1 answer; tried tools still reorder among themselves. ``center`` (off by default) takes
the cosines about the registry's mean request instead, ``cos(q - mu, m_t - mu) - cos(q - mu,
d_t - mu)``; measured offline it cost unseen tools more than the guard and it cancels the lift
of a registry whose feedback names one tool (``mu = m_t``).

Weight. :func:`fit_weight` fits the registry's fusion weight on its own logged events: the
profiles are built from 70% (split by a hash of the request text, so every held-out request
is a new phrasing, never a repeat a memory would recall), every weight of ``WEIGHT_GRID`` is
replayed on the other 30% (the used tool's reciprocal rank among the candidates, events
weighted by the same evidence rule), and the best weight ships only when the bootstrap lower
bound of its gain over weight 0, resampling held-out *requests* (:func:`request_bound`), is
above ``margin`` and its rank changes for at least ``min_changed`` held-out requests; else the
weight is 0 (no lift). Weights
whose mean reciprocal rank on the held-out events of tools *without a profile* in the fitting
part (unseen tools) is below weight 0's are never chosen: the gain on seen tools must not be
bought with requests for tools nobody has used yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.learning.evidence import EvidenceConfig, EvidenceCounter

__all__ = [
    "PASSED_OVER",
    "WEIGHT_GRID",
    "PassedOver",
    "ProfileConfig",
    "Profiles",
    "build_profiles",
    "capped_lift",
    "event_weights",
    "fit_weight",
    "fused_scores",
    "grid_choice",
    "profile_lift",
    "request_bound",
]

WEIGHT_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
HOLDOUT_SHARE = 0.3
#: a tool shown this many times on shortlists whose agent used another one, for requests within
#: cosine PASSED_SIMILARITY of the request now (their centroid), has been tried *for it*: the
#: unseen guard no longer holds a lifted tool below it
PASSED_OVER = 3
PASSED_SIMILARITY = 0.6


@dataclass
class PassedOver:
    """Per tool: the sum of the request embeddings of shortlists that showed it while the agent
    used another tool, and how many (what the unseen guard reads)."""

    sums: dict[Any, np.ndarray] = field(default_factory=dict)
    mass: dict[Any, float] = field(default_factory=dict)

    def add(self, tool: Any, q: np.ndarray) -> None:
        total = self.sums.get(tool)
        self.sums[tool] = q.astype(np.float32) if total is None else total + q
        self.mass[tool] = self.mass.get(tool, 0.0) + 1.0

    def drop(self, tool: Any) -> None:
        self.sums.pop(tool, None)
        self.mass.pop(tool, None)

    def tried(self, tool: Any, q: np.ndarray) -> bool:
        """Passed over :data:`PASSED_OVER` times for requests like ``q`` (their centroid)."""
        if self.mass.get(tool, 0.0) < PASSED_OVER:
            return False
        total = self.sums[tool]
        norm = float(np.linalg.norm(total))
        return norm > 0 and float(total @ q) / norm >= PASSED_SIMILARITY
BOOTSTRAP = 300


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """Knobs of the usage profiles (``SHORTLIST_LEARNING_*`` settings in the service)."""

    n0: float = 2.0
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    candidates: int = 10
    margin: float = 0.0
    confidence: float = 0.9
    min_fit_events: int = 50
    min_changed: int = 5  # a fitted value ships only when at least this many held-out requests change
    unseen_guard: float = 1.0  # 1: a lift never passes a candidate without a profile ranked above
    center: float = 0.0  # 1: cosines about the registry's mean request (module doc)


def event_weights(
    callers: Sequence[str | None],
    tools_of: Sequence[Sequence[int]],
    cfg: ProfileConfig,
    received: Sequence[float] | None = None,
) -> list[dict[int, float]]:
    """Per event, the weight of each reported tool by the evidence rule
    (:mod:`registry.learning.evidence`), replayed in order; rate-limited events weigh nothing."""
    counter = EvidenceCounter(cfg.evidence)
    out: list[dict[int, float]] = []
    for i, (caller, tools) in enumerate(zip(callers, tools_of, strict=True)):
        at = float(received[i]) if received is not None else float(i)
        if counter.check(caller, at) is not None:
            out.append({})
            continue
        weights = counter.weigh(caller, [str(t) for t in tools], at)
        out.append({int(t): w for t, w in weights.items()})
    return out


@dataclass(frozen=True, slots=True)
class Profiles:
    """Per tool id with evidence: unit centroid, shrinkage and evidence (read-only arrays)."""

    index: dict[int, int]  # tool id -> row
    centroids: np.ndarray  # (n, dim) float32 unit rows
    shrink: np.ndarray  # (n,) a_t
    evidence: np.ndarray  # (n,) n_t
    descriptions: np.ndarray  # (n, dim) d_t of the same rows
    mean: np.ndarray | None = None  # (dim,) the evidence-weighted mean request, mu
    centered: np.ndarray | None = None  # (n, dim) unit(S_t / n_t - mu)
    centered_descriptions: np.ndarray | None = None  # (n, dim) unit(d_t - mu)

    @classmethod
    def empty(cls, dim: int) -> Profiles:
        z = np.empty((0, dim), np.float32)
        return cls({}, z, np.empty(0, np.float32), np.empty(0, np.float32), z)


def build_profiles(
    vecs: np.ndarray,
    tools_of: Sequence[Sequence[int]],
    callers: Sequence[str | None],
    tool_vecs: np.ndarray,
    cfg: ProfileConfig,
    weights: Sequence[dict[int, float]] | None = None,
) -> Profiles:
    """Profiles from events (query vectors ``vecs``, reported tool ids, callers)."""
    weights = event_weights(callers, tools_of, cfg) if weights is None else weights
    sums: dict[int, np.ndarray] = {}
    mass: dict[int, float] = {}
    for q, per_tool in zip(vecs, weights, strict=True):
        for t, w in per_tool.items():
            if w <= 0:
                continue
            if t in sums:
                sums[t] += w * q
            else:
                sums[t] = (w * q).astype(np.float64)
            mass[t] = mass.get(t, 0.0) + w
    return profiles_from_sums(sums, mass, tool_vecs, cfg)


def profiles_from_sums(
    sums: dict[int, np.ndarray], mass: dict[int, float], tool_vecs: np.ndarray, cfg: ProfileConfig
) -> Profiles:
    """Profiles from per-tool weighted query sums and evidence (what the service keeps)."""
    ids = [t for t in sums if mass.get(t, 0.0) > 0 and 0 <= t < len(tool_vecs)]
    if not ids:
        return Profiles.empty(tool_vecs.shape[1])
    s = np.stack([sums[t] for t in ids]).astype(np.float32)
    norms = np.linalg.norm(s, axis=1, keepdims=True)
    centroids = s / np.maximum(norms, 1e-9)
    n = np.array([mass[t] for t in ids], np.float32)
    descriptions = np.asarray(tool_vecs[ids], np.float32)
    mu = (s.sum(axis=0) / max(float(n.sum()), 1e-9)).astype(np.float32)
    return Profiles({t: i for i, t in enumerate(ids)}, centroids, n / (n + cfg.n0), n, descriptions,
                    mu, _unit_rows(s / n[:, None] - mu), _unit_rows(descriptions - mu))


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return (a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-9)).astype(np.float32)


def profile_lift(profiles: Profiles, query: np.ndarray, candidates: np.ndarray, cfg: ProfileConfig) -> np.ndarray:
    """``lift_t`` (module doc) of each of ``candidates`` (tool ids, best first); only the first
    ``cfg.candidates`` can be non-zero."""
    out = np.zeros(len(candidates), np.float32)
    if not profiles.index:
        return out
    rows = [(j, profiles.index.get(int(t))) for j, t in enumerate(candidates[: cfg.candidates])]
    rows = [(j, r) for j, r in rows if r is not None]
    if not rows:
        return out
    cols = np.array([j for j, _ in rows])
    idx = np.array([r for _, r in rows])
    q = np.asarray(query, np.float32)
    if cfg.center and profiles.mean is not None and profiles.centered is not None:
        u = q - profiles.mean
        u = u / max(float(np.linalg.norm(u)), 1e-9)
        usage = profiles.centered[idx] @ u
        described = profiles.centered_descriptions[idx] @ u if cfg.center < 2 else 0.0  # type: ignore[index]
        out[cols] = profiles.shrink[idx] * (usage - described)
        return out
    out[cols] = profiles.shrink[idx] * (profiles.centroids[idx] @ q - profiles.descriptions[idx] @ q)
    return out


def capped_lift(base: np.ndarray, lift: np.ndarray, profiled: np.ndarray) -> np.ndarray:
    """``lift`` cut so that no candidate passes an *untried* one ranked above it (``profiled``
    False: no profile, and not passed over :data:`PASSED_OVER` times; ``base``: the candidates'
    scores, best first). A tool nobody has had the chance to use has no usage evidence to weigh
    against a lifted neighbour's, so usage may reorder tried tools among themselves and push one
    below an untried tool, never lift one over it: a request for a new tool keeps its rank-1
    answer. A tool shown again and again while agents used another one has been tried."""
    out = np.array(lift, np.float32, copy=True)
    ceiling = np.inf
    for j in range(len(out)):
        if not profiled[j]:
            ceiling = min(ceiling, float(base[j]) + float(out[j]))
        elif base[j] + out[j] >= ceiling:
            out[j] = np.float32(ceiling - float(base[j]) - 1e-6)
    return out


def fused_scores(
    profiles: Profiles, query: np.ndarray, candidates: np.ndarray, base: np.ndarray, weight: float,
    cfg: ProfileConfig, passed_over: PassedOver | None = None,
) -> np.ndarray:
    """``base + weight * lift`` of ``candidates`` (best first), the unseen guard applied
    (``passed_over``: by tool id, the requests each was shown for while another was used)."""
    lift = weight * profile_lift(profiles, query, candidates, cfg)
    if cfg.unseen_guard:
        passed = passed_over or PassedOver()
        tried = np.array([int(t) in profiles.index or passed.tried(int(t), query) for t in candidates], bool)
        lift = capped_lift(base, lift, tried)
    return np.asarray(base, np.float32) + lift


def held_out(key: str, share: float = HOLDOUT_SHARE) -> bool:
    """Whether an event (by id) is in the held-out part (stable across refits and replicas)."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
    return h / 2**32 < share


def fit_weight(
    vecs: np.ndarray,
    tools_of: Sequence[Sequence[int]],
    callers: Sequence[str | None],
    tool_vecs: np.ndarray,
    cfg: ProfileConfig,
    *,
    candidates: Sequence[np.ndarray] | None = None,
    base_scores: Sequence[np.ndarray] | None = None,
    keys: Sequence[str] | None = None,
    received: Sequence[float] | None = None,
    shown: Sequence[Sequence[int]] | None = None,
) -> tuple[float, dict[str, Any]]:
    """The fusion weight for this registry and how it was chosen (module doc).

    ``candidates[i]`` / ``base_scores[i]``: event ``i``'s base ranking (tool ids, best first) and
    scores; by default the dense cosine against ``tool_vecs``. ``keys``: what the split hashes,
    the events' request texts (normalised here): every event of one request falls on one side,
    so the held-out part measures *new phrasings*, not repeats a memory would recall.
    """
    n = len(tools_of)
    weights = event_weights(callers, tools_of, cfg, received)
    keys = keys if keys is not None else [f"event-{i}" for i in range(n)]
    held = np.array([held_out(" ".join(k.lower().split())) for k in keys], bool)
    report: dict[str, Any] = {"events": n, "fit_events": int((~held).sum()), "held_out_events": int(held.sum())}
    if int((~held).sum()) < cfg.min_fit_events or int(held.sum()) < cfg.min_fit_events // 3:
        return 0.0, {**report, "reason": f"{n} events; fitting a weight needs {cfg.min_fit_events}"}
    fit_idx = [int(i) for i in np.flatnonzero(~held)]
    profiles = build_profiles(
        vecs[fit_idx], [tools_of[i] for i in fit_idx], [callers[i] for i in fit_idx], tool_vecs, cfg,
        [weights[i] for i in fit_idx],
    )
    passed_over = PassedOver()  # in the fitting part: shown while another tool was used
    for i in fit_idx if shown is not None else ():
        for t in shown[i]:  # type: ignore[index]
            if int(t) not in weights[i]:
                passed_over.add(int(t), vecs[i])
    rows: list[np.ndarray] = []  # per held-out event: reciprocal rank of the used tool per weight
    event_w: list[float] = []
    unseen: list[bool] = []  # its used tools have no profile in the fitting part
    groups: list[str] = []  # its request (the bootstrap resamples requests)
    for i in (int(j) for j in np.flatnonzero(held)):
        used = {t for t, w in weights[i].items() if w > 0}
        if not used:
            continue
        if candidates is None or base_scores is None:
            scores_all = tool_vecs @ vecs[i]
            cand = np.argsort(-scores_all)[: cfg.candidates]
            base = scores_all[cand]
        else:
            cand = np.asarray(candidates[i])[: cfg.candidates]
            base = np.asarray(base_scores[i], np.float32)[: len(cand)]
        hit = np.array([int(t) in used for t in cand])
        if not hit.any():
            continue  # the used tool is past the candidates: no weight changes it
        rr = []
        for w in WEIGHT_GRID:
            order = np.argsort(-fused_scores(profiles, vecs[i], cand, base, w, cfg, passed_over), kind="stable")
            rr.append(1.0 / (1 + int(np.argmax(hit[order]))))
        rows.append(np.array(rr))
        event_w.append(max(weights[i].values()))
        unseen.append(not any(t in profiles.index for t in used))
        groups.append(" ".join(keys[i].lower().split()))
    if len(rows) < cfg.min_fit_events // 3:
        return 0.0, {**report, "reason": f"{len(rows)} held-out events rank a used tool among the candidates"}
    table = np.stack(rows)
    best, lower, changed = grid_choice(table, event_w, unseen, groups, WEIGHT_GRID, "weight", cfg.confidence, report)
    if best == 0 or not lower > cfg.margin:
        return 0.0, {**report, "reason": f"lower bound {lower:+.4f} of the gain is not above {cfg.margin:g}"}
    if changed < cfg.min_changed:
        return 0.0, {**report, "reason": f"the gain rests on {changed} held-out requests; shipping needs {cfg.min_changed}"}
    return float(WEIGHT_GRID[best]), {**report, "reason": "shipped"}


def request_bound(gains: np.ndarray, groups: Sequence[str], confidence: float) -> tuple[float, int]:
    """Bootstrap lower bound (one-sided, ``confidence``) of the mean of per-event ``gains``,
    resampling *requests* (``groups``: each event's request text), not events, and how many
    requests' summed gain is non-zero. A stream repeats its requests (BFCL's each about ten
    times) and the events of one request gain or lose together: resampled as independent
    events, three repeats of one lucky request gave a positive 90% bound (BFCL, 2,000 events:
    the weight shipped and cost found@1 4 points on new requests)."""
    index: dict[str, int] = {}
    g = np.array([index.setdefault(k, len(index)) for k in groups], np.int64)
    sums = np.bincount(g, weights=gains, minlength=len(index))
    counts = np.bincount(g, minlength=len(index)).astype(np.float64)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(index), size=(BOOTSTRAP, len(index)))
    means = sums[idx].sum(axis=1) / np.maximum(counts[idx].sum(axis=1), 1e-12)
    return float(np.quantile(means, 1 - confidence)), int((np.abs(sums) > 1e-9).sum())


def grid_choice(
    table: np.ndarray,
    event_w: Sequence[float],
    unseen: Sequence[bool],
    groups: Sequence[str],
    grid: Sequence[float] | np.ndarray,
    label: str,
    confidence: float,
    report: dict[str, Any],
) -> tuple[int, float, int]:
    """The best column of ``table`` (held-out events x ``grid`` values: the used tool's
    reciprocal rank), never one that lowers the mean over the *unseen* events (tools without
    feedback) below column 0's; returns it, the :func:`request_bound` of its gain over column 0
    and how many requests it changes. Writes the evidence into ``report`` (``*_by_<label>``)."""
    ew = np.asarray(event_w, np.float64)
    means = ew @ table / ew.sum()
    allowed = np.ones(len(grid), bool)
    fresh = np.asarray(unseen, bool)
    if fresh.any():  # never a value that costs held-out requests for tools without feedback
        fresh_means = ew[fresh] @ table[fresh] / ew[fresh].sum()
        allowed = fresh_means >= fresh_means[0] - 1e-9
        report["unseen_scored_events"] = int(fresh.sum())
        report[f"unseen_mrr_by_{label}"] = {str(v): round(float(m), 4) for v, m in zip(grid, fresh_means, strict=True)}
    best = int(np.argmax(np.where(allowed, means, -np.inf)))
    gains = (table[:, best] - table[:, 0]) * ew / ew.mean()
    lower, changed = request_bound(gains, groups, confidence)
    report.update({
        "scored_events": len(table),
        "held_out_requests": len(set(groups)),
        "changed_requests": changed,
        f"mrr_by_{label}": {str(v): round(float(m), 4) for v, m in zip(grid, means, strict=True)},
        f"best_{label}": float(grid[best]),
        "gain": round(float(gains.mean()), 5),
        "gain_lower": round(lower, 5),
    })
    return best, lower, changed
