"""The usage memory's neighbourhood, fitted per registry on its own logged feedback (issue 22).

The memory lifts a tool for a request within cosine ``tau`` of past requests whose agents used
it (:mod:`registry.learning.usage`). Whether a neighbour's tool is this request's tool depends on
the registry: MiniLM neighbours at cosine >= 0.8 name the same tool 85% of the time on MetaTool
and 26% on BFCL (docs/results/neighbourhood.md), so one fixed ``tau`` lifts the right tool on one
registry and a wrong one on the other. A refit therefore fits ``tau`` per registry.

Fit. The logged events are split 70/30 by a hash of the request text (as the profile weight's
fit, :func:`registry.learning.profiles.held_out`): every held-out request is a *new phrasing*,
never a repeat the memory would recall anyway. The fitting part stands in for the memory (each
event's query embedding with the evidence-rule weight of each tool it used); each held-out
event's base ranking (the base scorer, no usage) is lifted as the memory lifts it::

    k_j(tau) = clip((cos(q, v_j) - tau) / (1 - tau), 0, 1)      fitting event j
    e_t      = sum over fitting events j that used t of w_jt * k_j
    lift_t   = beta * e_t / (sum over candidates of e + n0)

for every ``tau`` of :data:`SIMILARITY_GRID`, and scored by the used tool's reciprocal rank
among the candidates (events weighted by the evidence rule). The reference is :data:`REPEATS`:
only a repeat of a logged request (cosine 0.99 and up: the same text, give or take a word's
case or spacing) is recalled, nothing reaches a new phrasing. Even the memory's dedupe cosine
(0.95) is a candidate that must earn its place: on BFCL near-identical requests name different
tools (two tools that compute the same thing).

Guard. A ``tau`` whose mean reciprocal rank on held-out events of *unseen* tools (no evidence
in the fitting part) is below the reference's is never chosen: a neighbour's tool can only push
such a request's tool down. The best remaining ``tau`` ships when the bootstrap lower bound
(``confidence``, resampling held-out requests:
:func:`registry.learning.profiles.request_bound`) of its gain over the reference is above
``margin`` and the rank changes for at least ``min_changed`` held-out requests; otherwise the
ships: the memory then recalls repeats and leaves new phrasings to the usage profiles. With too
few events nothing is fitted (the registry keeps its neighbourhood).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from registry.feedback import FeedbackEvent
from registry.index.snapshot import Snapshot
from registry.learning.profiles import ProfileConfig, event_weights, grid_choice, held_out

__all__ = ["REPEATS", "SIMILARITY_GRID", "Ranked", "event_rankings", "fit_similarity", "memory_lift"]

Ranked = Callable[[str], tuple[Sequence[str], np.ndarray]]  # request text -> (names, scores)

#: the reference neighbourhood: a logged request's repeats only
REPEATS = 0.99
#: neighbourhoods a fit weighs against it, widest last
SIMILARITY_GRID = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)


def memory_lift(
    sims: Sequence[np.ndarray], weights: Sequence[np.ndarray], taus: np.ndarray, beta: float, n0: float
) -> np.ndarray:
    """``lift_t`` (module doc) per ``tau`` (rows) and candidate (columns); ``sims[c]`` /
    ``weights[c]``: the cosines of candidate ``c``'s evidence to the request and their weights."""
    taus = np.asarray(taus, np.float64)
    e = np.zeros((len(taus), len(sims)))
    for c, (s, w) in enumerate(zip(sims, weights, strict=True)):
        if len(s):
            k = np.clip((np.asarray(s, np.float64)[None, :] - taus[:, None]) / (1.0 - taus[:, None]), 0.0, 1.0)
            e[:, c] = k @ np.asarray(w, np.float64)
    return beta * e / (e.sum(axis=1, keepdims=True) + n0)


def fit_similarity(
    vecs: np.ndarray,
    tools_of: Sequence[Sequence[int]],
    callers: Sequence[str | None],
    cfg: ProfileConfig,
    *,
    candidates: Sequence[np.ndarray],
    base_scores: Sequence[np.ndarray],
    keys: Sequence[str],
    received: Sequence[float] | None = None,
    beta: float = 0.3,
    n0: float = 2.0,
) -> tuple[float | None, dict[str, Any]]:
    """The registry's neighbourhood ``tau`` and how it was chosen (module doc); ``None``: too
    few events to fit (keep the current one).

    Args:
        vecs: the events' unit query embeddings (rows).
        tools_of: per event, the tool ids it reports as used.
        callers: per event, its caller (the evidence rule).
        cfg: candidates, margin, confidence, min_fit_events and the evidence rule.
        candidates: per event, its base ranking's tool ids (best first, no usage lift).
        base_scores: per event, the scores of ``candidates``.
        keys: per event, its request text (what the split hashes).
        received: per event, when it was received (the evidence rule's clock).
        beta, n0: the memory's knobs (:class:`registry.learning.usage_events.UsageConfig`).
    """
    n = len(tools_of)
    weights = event_weights(callers, tools_of, cfg, received)
    held = np.array([held_out(" ".join(k.lower().split())) for k in keys], bool)
    taus = np.array([REPEATS, *SIMILARITY_GRID])
    report: dict[str, Any] = {"events": n, "fit_events": int((~held).sum()), "held_out_events": int(held.sum()),
                              "reference": REPEATS}
    if int((~held).sum()) < cfg.min_fit_events or int(held.sum()) < cfg.min_fit_events // 3:
        return None, {**report, "reason": f"{n} events; fitting a neighbourhood needs {cfg.min_fit_events}"}
    evidence: dict[int, tuple[list[int], list[float]]] = {}  # tool -> (fitting events, weights)
    for i in (int(j) for j in np.flatnonzero(~held)):
        for t, w in weights[i].items():
            if w > 0:
                rows, ws = evidence.setdefault(int(t), ([], []))
                rows.append(i)
                ws.append(w)
    by_tool = {t: (vecs[rows], np.array(ws)) for t, (rows, ws) in evidence.items()}
    table: list[np.ndarray] = []
    event_w: list[float] = []
    unseen: list[bool] = []
    groups: list[str] = []
    for i in (int(j) for j in np.flatnonzero(held)):
        used = {t for t, w in weights[i].items() if w > 0}
        cand = np.asarray(candidates[i])[: cfg.candidates]
        hit = np.array([int(t) in used for t in cand], bool)
        if not used or not hit.any():
            continue  # the used tool is past the candidates: no neighbourhood changes it
        sims: list[np.ndarray] = []
        masses: list[np.ndarray] = []
        for t in cand:
            vt, wt = by_tool.get(int(t), (None, np.empty(0)))
            sims.append(np.empty(0) if vt is None else vt @ vecs[i])
            masses.append(wt)
        lifted = np.asarray(base_scores[i], np.float64)[None, : len(cand)] + memory_lift(sims, masses, taus, beta, n0)
        rr = [1.0 / (1 + int(np.argmax(hit[np.argsort(-row, kind="stable")]))) for row in lifted]
        table.append(np.array(rr))
        event_w.append(max(weights[i].values()))
        unseen.append(not any(t in by_tool for t in used))
        groups.append(" ".join(keys[i].lower().split()))
    if len(table) < cfg.min_fit_events // 3:
        return None, {**report, "reason": f"{len(table)} held-out events rank a used tool among the candidates"}
    scores = np.stack(table)
    best, lower, changed = grid_choice(scores, event_w, unseen, groups, taus, "similarity", cfg.confidence, report)
    if best == 0 or not lower > cfg.margin:
        return REPEATS, {**report, "reason": f"repeats only: lower bound {lower:+.4f} of the gain of "
                               f"cosine {taus[best]:g} is not above {cfg.margin:g}"}
    if changed < cfg.min_changed:
        return REPEATS, {**report, "reason": f"repeats only: the gain of cosine {taus[best]:g} rests on "
                               f"{changed} held-out requests; shipping needs {cfg.min_changed}"}
    return float(taus[best]), {**report, "reason": "shipped"}


def event_rankings(
    snap: Snapshot, rows: list[FeedbackEvent], vecs: np.ndarray, limit: int, ranked: Ranked | None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per event, its candidates (tool ids, best first) and their scores: ``ranked`` of the
    request text, else the logged ranking and scores (dense cosines when none were logged)."""
    ids = snap.by_name
    cands: list[np.ndarray] = []
    base: list[np.ndarray] = []
    for e in rows:
        got = ranked(e.query) if ranked is not None else None
        order = got[0] if got is not None else (e.ranking or e.shown)
        names = [n for n in order if n in ids][:limit]
        cands.append(np.array([ids[n] for n in names], np.int64))
        scores = np.asarray(got[1] if got is not None else e.scores, np.float32)[: len(names)]
        if len(scores) < len(names):  # no logged scores: dense cosines stand in
            scores = snap.dense.scores_for(vecs[len(base)], cands[-1])
        base.append(scores)
    return cands, base
