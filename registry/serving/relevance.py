""""Does any tool fit?": a calibrated confidence for ``allow_empty`` shortlists.

An agent may ask something no tool of its registry does ("what's 2 + 2" to a GitHub server).
With ``allow_empty: true`` the shortlist may then be empty (``k: 0``) instead of showing the
least bad tools. The decision reads the head of the hybrid ranking:

    confidence = sigmoid(w_top * s_0 + w_lead * (s_0 - mean(s[:W])) + b)

``s_0`` is the best score (cosine plus the query's matched BM25 share: an absolute level),
``s_0 - mean`` how far it stands out of the top-``W`` window. The weights are fitted by
logistic regression on the dev sets: each set's queries against its own registry are
positives, queries of the other sets against it are negatives
(``python scripts/calibrate_relevance.py``, which writes one model per embedder family,
``models/relevance.json`` for the tuned default and ``models/relevance-minilm.json``, and prints
the held-out accuracy). The list is empty when ``confidence < threshold``; the response
carries the confidence either way.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from registry.errors import ArtifactError, NotReady

__all__ = ["RELEVANCE_WINDOW", "Relevance", "RelevanceFile", "RelevanceModel", "relevance_features"]

RELEVANCE_WINDOW = 20


def relevance_features(scores: np.ndarray) -> tuple[float, float]:
    """``(s_0, s_0 - mean(s[:RELEVANCE_WINDOW]))`` of a descending score list (zeros if empty)."""
    s = np.asarray(scores, dtype=np.float64)[:RELEVANCE_WINDOW]
    s = s[np.isfinite(s)]
    if s.size == 0:
        return 0.0, 0.0
    return float(s[0]), float(s[0] - s.mean())


@dataclass(frozen=True, slots=True)
class RelevanceModel:
    """Logistic weights over :func:`relevance_features`, and the cut-off."""

    w_top: float
    w_lead: float
    bias: float
    threshold: float = 0.5

    def confidence(self, scores: np.ndarray) -> float:
        """P(some tool of the registry fits the request), from its ranked scores."""
        top, lead = relevance_features(scores)
        z = self.w_top * top + self.w_lead * lead + self.bias
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    @classmethod
    def load(cls, path: Path | str) -> RelevanceModel:
        """Read a model written by :meth:`save`.

        Raises:
            ArtifactError: missing, unreadable or malformed file.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                w_top=float(raw["w_top"]),
                w_lead=float(raw["w_lead"]),
                bias=float(raw["bias"]),
                threshold=float(raw.get("threshold", 0.5)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            command = f"python scripts/calibrate_relevance.py --out {path}"
            raise ArtifactError(
                f"cannot read relevance model {path}: {exc}; rebuild it with `{command}` (--embedder "
                "for its embedder family, --fold-embedders for held-out scores), or set "
                "SHORTLIST_RELEVANCE_MODEL",
                {"path": str(path), "command": command},
            ) from exc

    def save(self, path: Path | str, **provenance: object) -> None:
        Path(path).write_text(
            json.dumps({**asdict(self), **provenance}, indent=2, sort_keys=True) + "\n",
            encoding="utf-8",
        )


class Relevance(Protocol):
    """What the query path asks of a relevance model (:class:`RelevanceModel` or a
    :class:`RelevanceFile` start-up has loaded)."""

    @property
    def threshold(self) -> float: ...

    def confidence(self, scores: np.ndarray) -> float: ...


class RelevanceFile:
    """The relevance model at ``path``, read by :meth:`load` (a running core's start-up, so a
    missing file is a readiness error naming it, not a failure to construct the service).

    Raises:
        NotReady: asked before :meth:`load`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._model: RelevanceModel | None = None

    def load(self) -> RelevanceModel:
        """Read the file (raises :class:`ArtifactError` naming it and the command that rebuilds it)."""
        if self._model is None:
            self._model = RelevanceModel.load(self.path)
        return self._model

    def _loaded(self) -> RelevanceModel:
        if self._model is None:
            raise NotReady("service not ready: the relevance model is not loaded yet")
        return self._model

    @property
    def threshold(self) -> float:
        return self._loaded().threshold

    def confidence(self, scores: np.ndarray) -> float:
        return self._loaded().confidence(scores)
