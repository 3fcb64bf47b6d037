"""Coverage refinement: a learned per-tool "is this a needed tool" probability that trims and
extends the composed shortlist.

The depth policy reads score shapes and stops at the first good tool; the composition adds
the intents' tools. Neither knows, tool by tool, how likely the next one down the request's
ranking is to be *needed*. :class:`CoverageModel` is a logistic regression over one row per
position ``j`` of the request's ranking (its first :data:`COVERAGE_WINDOW` tools):

    P(tool_j needed) = sigmoid(b + w . (x_j - mean) / scale)

where ``x_j`` (:func:`coverage_features`, :data:`COVERAGE_FEATURE_NAMES`) holds the depth
features of position ``j`` (:func:`registry.serving.features.depth_features`: score, gaps,
z-scores, ``log2 j``), the request's signals (intents, steps, words, joins and the share of
close top scores, :mod:`registry.serving.needs`), whether the composed list already shows
tool ``j``, and that list's length. It is fitted on other sources' requests (each request
weighted ``1 / needed tools``, so the fit targets recall) by ``bench/studies/coverage_loso.py``,
which also picks the two cut-offs on the training sources only and reports each source held
out (leave-one-source-out).

:meth:`CoverageModel.refine` then changes the composed list in two ways:

* **trim**: on a one-intent request, a shown tool after the first whose probability is below
  ``tau_drop`` is removed (named tools and tools outside the window stay);
* **extend**: tools of the window not shown yet whose probability is at least ``tau_add`` are
  appended in rank order, up to the cap and never making the list the whole registry.

Scores are read from the request's own (unfolded) ranking, so the model is embedder-agnostic
in form; its weights are fitted on one embedder's scores and saved with its name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.errors import ArtifactError
from registry.serving.compose import Folded, Pick
from registry.serving.features import FEATURE_NAMES, depth_features
from registry.serving.needs import SIGNAL_NAMES, needs_inputs

__all__ = [
    "COVERAGE_FEATURE_NAMES",
    "COVERAGE_WINDOW",
    "CoverageFile",
    "CoverageModel",
    "cover",
    "coverage_features",
]

COVERAGE_WINDOW = 20  # positions of the request's ranking the model reads and may add from
_DEPTH_COLUMNS = tuple(n for n in FEATURE_NAMES if n not in ("k", "log2_n", "bor_ceiling"))
COVERAGE_FEATURE_NAMES: tuple[str, ...] = (
    *_DEPTH_COLUMNS, *SIGNAL_NAMES, "n_close_top", "shown", "log2_1p_list", "beyond_list",
)
_DEPTH_INDEX = [FEATURE_NAMES.index(n) for n in _DEPTH_COLUMNS]


def coverage_features(
    scores: np.ndarray, n_tools: int, signals: np.ndarray | None, shown: Sequence[bool], list_length: int
) -> np.ndarray:
    """``(D, len(COVERAGE_FEATURE_NAMES))`` float64 rows, one per position of the ranking.

    Args:
        scores: the request's ranking's scores, descending (the first ``COVERAGE_WINDOW`` read).
        n_tools: registry size.
        signals: :func:`registry.serving.needs.request_signals` of the request (``None``: neutral).
        shown: per position, whether the composed list already offers that tool.
        list_length: the composed list's length.

    ``D = min(COVERAGE_WINDOW, len(scores), n_tools, len(shown))``; ``D = 0`` gives ``(0, F)``.
    """
    s = np.asarray(scores, dtype=np.float64)[:COVERAGE_WINDOW]
    d = min(s.size, int(n_tools), len(shown))
    if d == 0:
        return np.zeros((0, len(COVERAGE_FEATURE_NAMES)))
    base = depth_features(s, n_tools, d).astype(np.float64)
    request = needs_inputs(signals, s, base[0])[1:6]  # the four signals and n_close_top
    positions = np.arange(1, d + 1)
    return np.hstack([
        base[:, _DEPTH_INDEX],
        np.broadcast_to(request, (d, request.size)),
        np.asarray(shown[:d], dtype=np.float64)[:, None],
        np.full((d, 1), math.log2(1 + list_length)),
        (positions > list_length).astype(np.float64)[:, None],
    ])


@dataclass(frozen=True)
class CoverageModel:
    """Logistic weights over standardised :func:`coverage_features` and the two cut-offs."""

    coef: tuple[float, ...]  # intercept first
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    tau_add: float
    tau_drop: float

    def __post_init__(self) -> None:
        f = len(COVERAGE_FEATURE_NAMES)
        if len(self.coef) != f + 1 or len(self.mean) != f or len(self.scale) != f:
            raise ValueError(f"a coverage model has {f + 1} coefficients and {f} means and scales")
        values = (*self.coef, *self.mean, *self.scale, self.tau_add, self.tau_drop)
        if not all(math.isfinite(v) for v in values) or min(self.scale) <= 0:
            raise ValueError("coverage model values must be finite, scales positive")

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """P(needed) per row of :func:`coverage_features`."""
        if features.shape[0] == 0:
            return np.zeros(0)
        z = (features - np.asarray(self.mean)) / np.asarray(self.scale)
        logit = self.coef[0] + z @ np.asarray(self.coef[1:])
        return 1.0 / (1.0 + np.exp(-np.clip(logit, -60.0, 60.0)))

    def refine(
        self,
        shown: Sequence[int],
        ranking: Sequence[int],
        probabilities: np.ndarray,
        *,
        keep: set[int],
        offered: set[int],
        trim: bool,
        limit: int,
    ) -> list[int]:
        """The refined list of tool ids (see the module docstring).

        Args:
            shown: the composed list's tool ids, in order.
            ranking: the request's ranking's tool ids (position ``j`` has ``probabilities[j]``).
            probabilities: :meth:`probabilities` of the ranking's first positions.
            keep: tools never trimmed (named ones).
            offered: tools the list already offers, shown or folded in as alternates.
            trim: whether to trim (a one-intent request).
            limit: the longest list allowed.
        """
        p_of = {int(t): float(p) for t, p in zip(ranking, probabilities)}
        out = [
            t for i, t in enumerate(shown)
            if i == 0 or t in keep or not trim or p_of.get(t, 1.0) >= self.tau_drop
        ]
        taken = set(offered) | set(out)
        for t, p in zip(ranking, probabilities):
            if len(out) >= limit:
                break
            if p >= self.tau_add and int(t) not in taken:
                out.append(int(t))
                taken.add(int(t))
        return out

    @classmethod
    def fit(
        cls, rows: np.ndarray, labels: np.ndarray, weights: np.ndarray, tau_add: float, tau_drop: float,
        l2: float = 1.0, steps: int = 25,
    ) -> CoverageModel:
        """Weighted L2-regularised logistic regression (Newton steps; intercept not penalised)."""
        x = np.asarray(rows, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != y.size or y.size != w.size or y.size == 0:
            raise ValueError("fit needs one label and one weight per feature row")
        mean = x.mean(axis=0)
        scale = np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
        z = np.hstack([np.ones((x.shape[0], 1)), (x - mean) / scale])
        penalty = l2 * np.eye(z.shape[1])
        penalty[0, 0] = 0.0
        beta = np.zeros(z.shape[1])
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -60.0, 60.0)))
            grad = z.T @ (w * (p - y)) + penalty @ beta
            hess = (z * (w * p * (1 - p))[:, None]).T @ z + penalty
            beta -= np.linalg.solve(hess, grad)
        return cls(tuple(beta.tolist()), tuple(mean.tolist()), tuple(scale.tolist()), tau_add, tau_drop)

    def with_cutoffs(self, tau_add: float, tau_drop: float) -> CoverageModel:
        return CoverageModel(self.coef, self.mean, self.scale, tau_add, tau_drop)

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(COVERAGE_FEATURE_NAMES), "coef": list(self.coef), "mean": list(self.mean),
            "scale": list(self.scale), "tau_add": self.tau_add, "tau_drop": self.tau_drop,
        }

    def save(self, path: Path | str, **provenance: object) -> None:
        Path(path).write_text(json.dumps({**self.to_json(), **provenance}, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path | str) -> CoverageModel:
        """Read a model written by :meth:`save`.

        Raises:
            ArtifactError: missing, unreadable or malformed file, or features of another schema;
                the message names the file and the command that rebuilds it.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if tuple(raw.get("features", ())) != COVERAGE_FEATURE_NAMES:
                raise ValueError(f"features must be {list(COVERAGE_FEATURE_NAMES)}")
            return cls(
                tuple(float(c) for c in raw["coef"]), tuple(float(c) for c in raw["mean"]),
                tuple(float(c) for c in raw["scale"]), float(raw["tau_add"]), float(raw["tau_drop"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ArtifactError(
                f"cannot read coverage model {path}: {exc}; rebuild it with "
                "'python bench/studies/coverage_loso.py --dump DUMP --export PATH'",
                {"path": str(path)},
            ) from exc


def cover(
    model: CoverageModel, picks: list[Pick], ranking: tuple[np.ndarray, np.ndarray], main: Folded, n_tools: int,
    signals: np.ndarray | None, *, one_intent: bool, cap: int,
) -> list[Pick]:
    """The composed ``picks`` trimmed and extended by ``model`` (the query path's last step).

    Args:
        model: the coverage model.
        picks: the composed list.
        ranking: the request's own ranking ``(ids, scores)``, unfolded.
        main: that ranking folded (an appended tool brings its near-duplicates as alternates).
        n_tools: registry size.
        signals: the request's :func:`registry.serving.needs.request_signals`.
        one_intent: the request was not split into intents (only then is the list trimmed).
        cap: the longest list allowed; the list never becomes the whole registry.
    """
    ids, scores = ranking
    window = [int(t) for t in ids[:COVERAGE_WINDOW]]
    offered = {p.tool for p in picks} | {a for p in picks for a in p.alternates}
    rows = coverage_features(scores, n_tools, signals, [t in offered for t in window], len(picks))
    probabilities = model.probabilities(rows)
    limit = min(cap, n_tools - 1) if n_tools > 1 else cap
    kept = model.refine(
        [p.tool for p in picks], window[: probabilities.size], probabilities,
        keep={p.tool for p in picks if p.named}, offered=offered, trim=one_intent, limit=limit,
    )
    by_tool = {p.tool: p for p in picks}
    score_of = {t: float(s) for t, s in zip(window, scores[:COVERAGE_WINDOW])}
    taken = set(kept) | {a for t in kept if t in by_tool for a in by_tool[t].alternates}
    out = []
    for t in kept:
        if t in by_tool:
            out.append(by_tool[t])
            continue
        alternates = tuple(a for a in main.alternates.get(t, ()) if a not in taken)
        taken.update(alternates)
        out.append(Pick(t, score_of[t], None, False, alternates))
    return out


class CoverageFile:
    """The optional coverage model at ``path``, read by :meth:`load` (a running core's start-up,
    so a corrupt file is a readiness error naming it, not a failure to construct the service).
    Until then, and without a path, :attr:`model` is None and shortlists are not extended."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.model: CoverageModel | None = None

    def load(self) -> CoverageModel | None:
        """Read the file once (raises :class:`ArtifactError` naming it and the command that
        rebuilds it); None when no path is configured."""
        if self.model is None and self.path is not None:
            self.model = CoverageModel.load(self.path)
        return self.model
