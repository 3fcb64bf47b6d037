"""Needs-aware depth inputs (feature schema ``2``): how many tools a request seems to need.

Schema ``1`` (:mod:`registry.serving.features`) reads the score list alone, so a request that
needs three tools and one that needs one look alike whenever their scores do, and the policy
trained for "any needed tool shown" stops both at the first good tool. Schema ``2`` appends
what the request itself says, computed the same way in training and serving:

* ``n_intents``, ``n_steps``: the request's intents and how many of them are steps
  (:func:`registry.serving.intents.split_request`; 1 and 0 for a one-intent request);
* ``log2_words``, ``n_joins``: ``log2(1 + words)`` and ``log2(1 + joins)`` ("and", "then",
  commas...): long, enumerating requests need more tools;
* ``n_close_top``: the share of the top 10 scores within a quarter of the window's range of
  the top score (several tools about as good as the best: several needs, or near-duplicates);
* ``needs_estimate``: a learned estimate of ``log2`` of the number of needed tools
  (:class:`NeedsModel`, least squares on the training requests' gold counts, stored in the
  policy's manifest), so the Q-network gets a supervised summary rather than learning the
  count from the sparse reward alone.

Callers that do not know the request text (refits of stop rules, offline benches) pass
``signals=None``: the neutral signals of a one-intent request (:data:`NEUTRAL_SIGNALS`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.serving.features import FEATURE_NAMES, depth_features
from registry.serving.intents import split_request

__all__ = [
    "NEEDS_FEATURE_NAMES",
    "NEEDS_SCHEMA_VERSION",
    "NEUTRAL_SIGNALS",
    "REQUEST_FEATURE_NAMES",
    "SIGNAL_NAMES",
    "NeedsModel",
    "needs_features",
    "needs_inputs",
    "request_signals",
]

NEEDS_SCHEMA_VERSION = "2"
SIGNAL_NAMES: tuple[str, ...] = ("n_intents", "n_steps", "log2_words", "n_joins")
REQUEST_FEATURE_NAMES: tuple[str, ...] = (*SIGNAL_NAMES, "n_close_top", "needs_estimate")
NEEDS_FEATURE_NAMES: tuple[str, ...] = FEATURE_NAMES + REQUEST_FEATURE_NAMES
NEEDS_INPUT_NAMES: tuple[str, ...] = ("bias", *SIGNAL_NAMES, "n_close_top", "z_top")

_CLOSE_WINDOW = 10
_CLOSE_SHARE = 0.25  # of the window range below the top score
_JOINS = re.compile(r"\b(?:and|then|also|after|before|plus|finally)\b|[,;]", re.IGNORECASE)
_Z_TOP = FEATURE_NAMES.index("z_top")
_MAX_LOG2_NEEDS = 4.0  # 16 tools: beyond any request of the training corpus


def request_signals(text: str) -> np.ndarray:
    """``SIGNAL_NAMES`` of a request text, float32 ``(4,)``."""
    intents = split_request(text) if text.strip() else ()
    n_intents = max(1, len(intents))
    n_steps = sum(1 for i in intents if i.step) if n_intents > 1 else 0
    words = len(text.split())
    joins = len(_JOINS.findall(text))
    return np.array([n_intents, n_steps, math.log2(1 + words), math.log2(1 + joins)], dtype=np.float32)


NEUTRAL_SIGNALS = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)


def _close_top(scores: np.ndarray, window_range: float) -> float:
    top = scores[:_CLOSE_WINDOW]
    if window_range <= 1e-12 or top.size == 0:
        return 1.0
    return float(np.count_nonzero(top >= top[0] - _CLOSE_SHARE * window_range)) / _CLOSE_WINDOW


def needs_inputs(signals: np.ndarray | None, scores: np.ndarray, base_row: np.ndarray) -> np.ndarray:
    """The :class:`NeedsModel` inputs (``NEEDS_INPUT_NAMES``) of one request, float64."""
    sig = NEUTRAL_SIGNALS if signals is None else np.asarray(signals, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    w = s[:51]
    close = _close_top(s, float(w.max() - w.min()) if w.size else 0.0)
    return np.array([1.0, *sig.tolist(), close, float(base_row[_Z_TOP])], dtype=np.float64)


@dataclass(frozen=True)
class NeedsModel:
    """``log2(needed tools) ~ coef . needs_inputs``, clipped to ``[0, 4]``."""

    coef: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.coef) != len(NEEDS_INPUT_NAMES) or not all(math.isfinite(c) for c in self.coef):
            raise ValueError(f"a needs model has {len(NEEDS_INPUT_NAMES)} finite coefficients, got {self.coef!r}")

    def estimate(self, inputs: np.ndarray) -> float:
        return float(np.clip(float(np.dot(self.coef, inputs)), 0.0, _MAX_LOG2_NEEDS))

    @classmethod
    def fit(cls, inputs: Sequence[np.ndarray], n_needed: Sequence[int], ridge: float = 1.0) -> NeedsModel:
        """Ridge least squares of ``log2(n_needed)`` on ``inputs`` (the bias is not penalised)."""
        x = np.asarray(inputs, dtype=np.float64)
        y = np.log2(np.maximum(np.asarray(n_needed, dtype=np.float64), 1.0))
        if x.ndim != 2 or x.shape[0] != y.size or x.shape[0] == 0:
            raise ValueError("fit needs one inputs row per request")
        penalty = ridge * np.eye(x.shape[1])
        penalty[0, 0] = 0.0
        coef = np.linalg.solve(x.T @ x + penalty, x.T @ y)
        return cls(tuple(float(c) for c in coef))

    def to_json(self) -> dict[str, Any]:
        return {"inputs": list(NEEDS_INPUT_NAMES), "coef": list(self.coef), "target": "log2 needed tools"}

    @classmethod
    def from_json(cls, payload: Any) -> NeedsModel:
        """Raises ``ValueError`` when ``payload`` is not a needs model of this schema."""
        if not isinstance(payload, dict) or tuple(payload.get("inputs", ())) != NEEDS_INPUT_NAMES:
            raise ValueError(f"needs_model must list inputs {list(NEEDS_INPUT_NAMES)}")
        return cls(tuple(float(c) for c in payload.get("coef", ())))


def needs_features(
    scores: np.ndarray,
    n_tools: int,
    max_depth: int,
    signals: np.ndarray | None,
    model: NeedsModel,
) -> np.ndarray:
    """Schema-2 feature matrix ``(D, len(NEEDS_FEATURE_NAMES))``: :func:`depth_features` plus the
    request's columns (the same on every row). Arguments and errors as :func:`depth_features`."""
    base = depth_features(scores, n_tools, max_depth)
    inputs = needs_inputs(signals, np.asarray(scores), base[0])
    extra = np.array([*inputs[1:6].tolist(), model.estimate(inputs)], dtype=np.float32)
    return np.hstack([base, np.broadcast_to(extra, (base.shape[0], extra.size))]).astype(np.float32)
