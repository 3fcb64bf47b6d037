"""Per-registry depth refit: fit a stop rule on a registry's logged feedback, evaluate it off
policy on held-out feedback, and ship it only when it is measurably better.

Data. Every feedback event on a shortlist the learned policy served carries the policy's
margins and feature-window scores for the request's own ranking, and the ranking itself past
the shown list (:class:`registry.feedback.FeedbackEvent`). The used tool's logged rank ``r``
is known when it was shown or ranked within the logged tail (censored beyond it: then no depth
a policy may choose finds it). So any rule's depth ``d`` can be replayed on every event, and it
*finds* the tool iff ``r < d``: the censored found-at-K curve. No propensity weighting is
needed for that (the rank is logged whatever was shown); exploration adds events whose used
tool sat just past the cut, which a shallower policy never gets reported. In the service the
logged requests are ranked again as the registry serves them now (usage memory and the profile
weight the same refit just fitted; :mod:`registry.learning.refit_data`), so the rule is fitted
on the ranking it will run on; an event is found when every tool it used is shown.

Reward. A rule beats the current one when it sits above plain top-K's trade-off at the
current operating point: per event ``gain = (found_cand - found_cur) - slope * (k_cand - k_cur)``
where ``slope`` is the found rate one more fixed-depth tool buys at the current mean K (read on
the same events' fixed found-at-K curve). Its mean is a paired statistic (both rules replayed on
the same events), far less noisy than a difference of efficiencies ``K_eq / mean K`` (reported
too).

Candidates. Bias rules (``bias_offset`` on a grid) and a calibrated rule: a logistic model of
``P(r >= k)`` (stopping at ``k`` misses) on the policy's features and margin at each depth,
stopping at the first ``k`` with that probability at most ``threshold`` (grid). The one with
the largest mean gain on the fitting part, among those whose found rate is not below the
current policy's there, is the candidate.

Guard. Every event is weighted by the evidence rule the usage memory applies
(:mod:`registry.learning.evidence`: rate-limited events out, a caller's repeated claims decay),
in the fit and in the held-out estimate alike. On the held-out part (30%, split by request
text, resampling requests) the bootstrap lower bound of the weighted mean gain at ``confidence`` must be above
``margin``, the candidate's found rate must not be below the current one's, and a candidate
whose mean K grows past ``max_mean_k`` times the current one must find more than fixed top-K
does at its own mean K (extra depth must pay for itself on the fixed-K curve). Otherwise the
refit is refused. A passing candidate that changes mean K by more than ``review_factor`` (either
way) is stored but not activated (``candidate``): an admin activates it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from registry.bor import k_equivalent
from registry.feedback import FeedbackEvent
from registry.learning.evidence import EvidenceConfig
from registry.learning.refit_data import HOLDOUT_SHARE, LoggedEvents, Replay, rule_depths
from registry.serving.stop_rules import StopRule

__all__ = [
    "HOLDOUT_SHARE", "Estimate", "LoggedEvents", "RefitOutcome", "evaluate_rule", "fixed_found_at", "refit",
]

BIAS_GRID = tuple(np.round(np.arange(-3.0, 3.01, 0.25), 2))
THRESHOLD_GRID = (0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
BOOTSTRAP = 400


@dataclass(frozen=True, slots=True)
class Estimate:
    """Off-policy metrics of one rule on logged events (censored found-at-K curve)."""

    events: int
    found: float
    mean_k: float
    efficiency: float
    found_at_1: float

    def to_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "found": round(self.found, 4),
            "mean_k": round(self.mean_k, 3),
            "efficiency": round(self.efficiency, 4) if math.isfinite(self.efficiency) else None,
            "found_at_1": round(self.found_at_1, 4),
        }


def _curve(ranks: np.ndarray, weights: np.ndarray, kmax: int) -> np.ndarray:
    ks = np.arange(kmax + 1)
    hit = ranks[:, None] < ks[None, :]
    return np.asarray(weights @ hit / weights.sum())


def _metrics(depths: np.ndarray, ranks: np.ndarray, weights: np.ndarray) -> tuple[float, float, float]:
    total = weights.sum()
    found = float(weights @ (ranks < depths) / total)
    mean_k = float(weights @ depths / total)
    curve = _curve(ranks, weights, int(max(depths.max(initial=1), 1)) + 1)
    eff = k_equivalent(curve, found) / mean_k if mean_k > 0 else math.nan
    return found, mean_k, eff


def evaluate_rule(rule: StopRule, data: LoggedEvents) -> Estimate:
    """Weighted (evidence rule) off-policy metrics of ``rule`` on ``data``."""
    depths = rule_depths(rule, data)
    ranks = np.array([e.rank for e in data.events])
    w = data.weights()
    found, mean_k, eff = _metrics(depths, ranks, w)
    at1 = float(w @ (ranks < 1) / w.sum()) if len(ranks) else 0.0
    return Estimate(len(data), found, mean_k, eff, at1)


def fixed_found_at(ranks: np.ndarray, weights: np.ndarray, k: float) -> float:
    """Found rate of fixed top-K at (fractional, interpolated) depth ``k`` on these events."""
    lo = math.floor(k)
    f_lo = float(weights @ (ranks < lo) / weights.sum())
    f_hi = float(weights @ (ranks < lo + 1) / weights.sum())
    return f_lo + (k - lo) * (f_hi - f_lo)


def _fit_logistic(data: LoggedEvents, l2: float = 1.0, steps: int = 25) -> StopRule | None:
    """A calibrated rule (threshold unset): ``P(rank >= k)`` from the features and margin at
    depth ``k``, fitted by Newton's method with an L2 penalty. Events whose tool no depth finds
    are left out (they say nothing about where to stop)."""
    rows, labels = [], []
    for e in data.events:
        d = e.margins.shape[0]
        if e.rank >= d:
            continue
        rows.append(np.column_stack([e.features, e.margins]))
        labels.append(e.rank >= np.arange(1, d + 1))
    if len(rows) < 20:
        return None
    x = np.vstack(rows)
    y = np.concatenate(labels).astype(np.float64)
    if y.min() == y.max():
        return None
    center = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = np.column_stack([np.ones(len(x)), (x - center) / scale])
    w = np.zeros(z.shape[1])
    penalty = l2 * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
        grad = z.T @ (p - y) + penalty @ w
        hess = (z * (p * (1 - p))[:, None]).T @ z + penalty + 1e-6 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-6:
            break
    return StopRule(
        weights=tuple(float(v) for v in w),
        center=tuple(float(v) for v in center),
        scale=tuple(float(v) for v in scale),
    )


def candidates(fit: LoggedEvents, current: StopRule) -> list[StopRule]:
    """Every rule the refit weighs (bias rules on a grid, calibrated rules per threshold)."""
    rules = [replace(current, bias_offset=float(b), weights=()) for b in BIAS_GRID]
    calibrated = _fit_logistic(fit)
    if calibrated is not None:
        rules += [replace(calibrated, threshold=t, max_depth=current.max_depth) for t in THRESHOLD_GRID]
    return rules


@dataclass(frozen=True, slots=True)
class RefitOutcome:
    """What a refit concluded: ``state`` is ``done`` (candidate better: ``rule`` to ship),
    ``candidate`` (better, but changing mean K so much an admin must activate it) or
    ``refused`` (``reason`` says why; ``rule`` may still show the best candidate)."""

    state: str
    reason: str
    rule: StopRule | None
    estimate: dict[str, Any] = field(default_factory=dict)


def tradeoff_slope(ranks: np.ndarray, mean_k: float) -> float:
    """Found rate one more tool of fixed top-K buys around depth ``mean_k`` (at least 1e-3)."""
    lo = max(math.floor(mean_k), 0)
    return max(float(np.mean(ranks == lo)), 1e-3)  # F(lo + 1) - F(lo)


def event_gains(cand: np.ndarray, cur: np.ndarray, ranks: np.ndarray, slope: float) -> np.ndarray:
    """Per event: found difference minus ``slope`` times the depth difference."""
    return (ranks < cand).astype(np.float64) - (ranks < cur) - slope * (cand - cur)


def _bootstrap_mean(
    values: np.ndarray, confidence: float, weights: np.ndarray | None = None, seed: int = 0,
    groups: list[str] | None = None,
) -> tuple[float, float]:
    """Bootstrap ``(lower, upper)`` bounds of the (weighted) mean at ``confidence`` (one-sided
    each), resampling ``groups`` (the events' requests: repeats of one request rise and fall
    together) or, without them, events."""
    rng = np.random.default_rng(seed)
    w = np.ones(len(values)) if weights is None else weights
    index: dict[str, int] = {}
    g = np.arange(len(values)) if groups is None else np.array([index.setdefault(k, len(index)) for k in groups])
    n = int(g.max()) + 1 if len(g) else 0
    sums = np.bincount(g, weights=values * w, minlength=n)
    mass = np.bincount(g, weights=w, minlength=n)
    idx = rng.integers(0, n, size=(BOOTSTRAP, n))
    means = sums[idx].sum(axis=1) / np.maximum(mass[idx].sum(axis=1), 1e-12)
    return float(np.quantile(means, 1 - confidence)), float(np.quantile(means, confidence))


def refit(
    events: Iterable[FeedbackEvent],
    registry: str,
    current: StopRule,
    *,
    min_events: int = 200,
    margin: float = 0.0,
    confidence: float = 0.95,
    evidence: EvidenceConfig | None = None,
    max_mean_k: float = 2.0,
    review_factor: float = 1.5,
    replay: Replay | None = None,
) -> RefitOutcome:
    """Fit, evaluate and decide (see the module docstring). ``evidence``: the rule weighting
    events (the usage memory's). ``max_mean_k``: a candidate deeper than the current mean K
    times this must beat fixed top-K at its own depth; ``review_factor``: a candidate changing
    mean K by more than this factor is kept as ``candidate`` (not activated). ``replay``: rank
    each logged request again as the registry serves it now and fit on that
    (:mod:`registry.learning.refit_data`); None: the logged margins and scores. Never raises on
    thin data."""
    started = time.perf_counter()
    events = list(events)
    data = LoggedEvents.of(events, registry, evidence, replay)
    if replay is not None and len(data) < min_events:  # too few replayable: the logged scores
        replayed = data.stats
        data = LoggedEvents.of(events, registry, evidence)
        data.stats.update(replay_fallback=f"{replayed['events']} events could be replayed")
    if len(data) < min_events:
        return RefitOutcome(
            "refused", f"{len(data)} usable feedback events; a refit needs {min_events}", None,
            {"events": len(data), "data": data.stats},
        )
    schema = str(data.stats.get("feature_schema", "1"))
    if not current.reads(schema):  # fitted under another policy's schema: serving ignores it
        current = replace(current, weights=(), center=(), scale=(), bias_offset=0.0)
    fit, held = data.split()
    fit_ranks = np.array([e.rank for e in fit.events])
    fit_w = fit.weights()
    fit_cur = rule_depths(current, fit)
    fit_slope = tradeoff_slope(fit_ranks, float(fit_cur.mean()))
    best: tuple[float, StopRule] | None = None
    for rule in candidates(fit, current):
        depths = rule_depths(rule, fit)
        if fit_w @ (fit_ranks < depths) + 1e-9 < fit_w @ (fit_ranks < fit_cur):
            continue
        gain = float(fit_w @ event_gains(depths, fit_cur, fit_ranks, fit_slope) / fit_w.sum())
        if best is None or gain > best[0] + 1e-12:
            best = (gain, rule)
    if best is None:
        return RefitOutcome(
            "refused", "no candidate keeps the found rate", None, {"events": len(data), "data": data.stats}
        )
    rule = best[1]
    ranks = np.array([e.rank for e in held.events])
    cand_d, cur_d = rule_depths(rule, held), rule_depths(current, held)
    cand, cur = evaluate_rule(rule, held), evaluate_rule(current, held)
    slope = tradeoff_slope(ranks, cur.mean_k)
    held_w = held.weights()
    gains = event_gains(cand_d, cur_d, ranks, slope)
    point = float(held_w @ gains / held_w.sum())
    lower, upper = _bootstrap_mean(gains, confidence, held_w, groups=[e.group for e in held.events])
    fixed = fixed_found_at(ranks, held_w, cand.mean_k)
    estimate = {
        "events": len(data),
        "fit_events": len(fit),
        "held_out_events": len(held),
        "candidate": cand.to_json(),
        "current": cur.to_json(),
        "slope": round(slope, 4),
        "gain": round(point, 5),
        "gain_ci": [round(lower, 5), round(upper, 5)],
        "confidence": confidence,
        "margin": margin,
        "fixed_found_at_candidate_k": round(fixed, 4),
        "kind": rule.kind,
        "data": data.stats,
        "seconds": round(time.perf_counter() - started, 3),
    }
    rule = replace(rule, parent=current.version, estimate=estimate, feature_schema=schema)
    if cand.found + 1e-12 < cur.found:
        reason = f"held-out found rate {cand.found:.4f} is below the current {cur.found:.4f}"
        return RefitOutcome("refused", reason, rule, estimate)
    if not lower > margin:
        reason = (
            f"gain {point:+.4f} (found per query above the fixed-K trade-off), lower bound "
            f"{lower:+.4f} at {confidence:.0%} is not above the margin {margin:g}"
        )
        return RefitOutcome("refused", reason, rule, estimate)
    if cand.mean_k > max_mean_k * max(cur.mean_k, 1.0) and not cand.found > fixed + 1e-9:
        reason = (
            f"held-out mean K {cur.mean_k:.2f} -> {cand.mean_k:.2f} grows past {max_mean_k:g}x while "
            f"its found rate {cand.found:.4f} does not beat fixed top-K at that depth ({fixed:.4f})"
        )
        return RefitOutcome("refused", reason, rule, estimate)
    ratio = cand.mean_k / cur.mean_k if cur.mean_k > 0 else math.inf
    if not 1 / review_factor <= ratio <= review_factor:
        reason = (
            f"mean K {cur.mean_k:.2f} -> {cand.mean_k:.2f} changes by more than {review_factor:g}x: "
            f"kept as a candidate for an admin to activate (gain {point:+.4f}, lower bound {lower:+.4f})"
        )
        return RefitOutcome("candidate", reason, rule, estimate)
    reason = (
        f"gain {point:+.4f} (lower bound {lower:+.4f}); found {cur.found:.3f} -> {cand.found:.3f}, "
        f"mean K {cur.mean_k:.2f} -> {cand.mean_k:.2f}, efficiency {cur.efficiency:.3f} -> "
        f"{cand.efficiency:.3f}"
    )
    return RefitOutcome("done", reason, rule, estimate)
