"""The depth-policy state features: ONE function shared by training, evaluation and serving.

The policy walks the ranked list one tool at a time. Row ``k-1`` of :func:`depth_features`
is the state after showing the top ``k`` tools. Every feature is computed from the score list
alone (plus ``k`` and the registry size ``N``), so the same code runs in the training loop and
on every request.

Most features are scale-free (gaps divided by the window range or standard deviation,
z-scores), so a policy transfers between scorers whose scores live on different scales
(cosine, hybrid dense+BM25). The raw ``top_score`` / ``cur_score`` / ``gap_top_cur`` /
``window_std`` are kept because on a cosine scale their absolute level is informative.

Distribution statistics (mean, std, range, largest drop) use ``scores[:FEATURE_WINDOW]``.
Callers should therefore pass at least ``FEATURE_WINDOW`` scores whenever the registry has
that many tools, in serving exactly as in training. On a registry of fewer tools the window
is the whole registry (5 scores on a 5-tool registry), and ``log2_n`` / ``bor_ceiling`` are
read as they are: the shipped policy is trained on registries of 5 to 2,479 tools (carved
sub-registries, :mod:`registry.offline.carve`), so these inputs lie inside its training range
and the in-graph clamp (:mod:`registry.offline.train`) is only a safety net for larger
registries or unusual scorers.

Changing a feature, its order or its definition requires bumping
``FEATURE_SCHEMA_VERSION``: a served ONNX policy records the version it was trained on and
refuses to load against another.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FEATURE_NAMES", "FEATURE_SCHEMA_VERSION", "FEATURE_WINDOW", "depth_features"]

FEATURE_SCHEMA_VERSION = "1"
FEATURE_WINDOW = 51  # scores[:FEATURE_WINDOW] are used for distribution statistics
_LOOKAHEAD = 3  # drop_ahead_rel looks this many positions past the current tool

FEATURE_NAMES: tuple[str, ...] = (
    "top_score",  # s_0
    "cur_score",  # s_{k-1}, the last tool shown
    "gap_top_cur",  # s_0 - s_{k-1}
    "window_std",  # std of the window
    "z_top",  # (s_0 - mean) / std
    "z_cur",  # (s_{k-1} - mean) / std
    "z_next",  # (s_k - mean) / std
    "gap_top_cur_rel",  # (s_0 - s_{k-1}) / range
    "gap_next_rel",  # (s_{k-1} - s_k) / range: the drop to the next, unseen tool
    "gap_next_std",  # (s_{k-1} - s_k) / std
    "gap_next_vs_max_drop",  # (s_{k-1} - s_k) / largest consecutive drop in the window
    "max_drop_seen_rel",  # largest drop among s_0..s_{k-1} / range (0 at k = 1)
    "drop_ahead_rel",  # (s_{k-1} - s_{k+2}) / range: is the list still falling just ahead?
    "top_drop_rel",  # (s_0 - s_1) / range
    "k",
    "log2_k",
    "log2_n",  # registry size N
    "bor_ceiling",  # log2(N / k), the BoR ceiling at depth k
)

_EPS = 1e-12


def _safe_inv(x: float) -> float:
    """1/x, or 0 when x is (numerically) zero: a constant list then has all ratios 0."""
    return 1.0 / x if x > _EPS else 0.0


def depth_features(scores: np.ndarray, n_tools: int, max_depth: int) -> np.ndarray:
    """Feature matrix of the depth MDP's states.

    Args:
        scores: scores of the top candidates, descending, ``len >= 1``. Pass at least
            ``FEATURE_WINDOW`` of them when available (see the module docstring). Non-finite
            values are replaced by the smallest finite score.
        n_tools: registry size ``N >= 1`` (may exceed ``len(scores)``).
        max_depth: depth cap ``>= 1``.

    Returns:
        float32 array of shape ``(D, len(FEATURE_NAMES))`` with
        ``D = min(max_depth, n_tools, len(scores))``; row ``k-1`` is the state after showing
        ``k`` tools. Always finite. Past the end of ``scores`` the next score is taken equal
        to the last one (a zero gap).

    Raises:
        ValueError: empty ``scores``, ``n_tools < 1`` or ``max_depth < 1``.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n_scores = s.size
    if n_scores < 1:
        raise ValueError("scores must contain at least one score")
    if n_tools < 1:
        raise ValueError(f"n_tools must be >= 1, got {n_tools}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    finite = np.isfinite(s)
    if not finite.all():
        s = np.where(finite, s, s[finite].min() if finite.any() else 0.0)

    d = min(int(max_depth), int(n_tools), n_scores)

    w = s[:FEATURE_WINDOW]
    top = float(s[0])
    mean = float(w.mean())
    std = float(w.std())
    rng = float(w.max() - w.min())
    inv_std = _safe_inv(std)
    inv_rng = _safe_inv(rng)
    if w.size > 1:
        window_drops = w[:-1] - w[1:]
        inv_max_drop = _safe_inv(float(window_drops.max()))
        top_drop = float(window_drops[0])
    else:
        inv_max_drop = 0.0
        top_drop = 0.0

    # s_0 .. s_{d-1+LOOKAHEAD}, padded with the last score past the end of the list.
    m = min(n_scores, d + _LOOKAHEAD)
    padded = np.empty(d + _LOOKAHEAD, dtype=np.float64)
    padded[:m] = s[:m]
    padded[m:] = s[m - 1]
    cur = padded[:d]
    nxt = padded[1 : d + 1]
    gap_next = cur - nxt
    gap_top = top - cur

    k = np.arange(1, d + 1, dtype=np.float64)
    log2_k = np.log2(k)
    log2_n = math.log2(n_tools)

    out = np.empty((d, len(FEATURE_NAMES)), dtype=np.float32)
    out[:, 0] = top
    out[:, 1] = cur
    out[:, 2] = gap_top
    out[:, 3] = std
    out[:, 4] = (top - mean) * inv_std
    out[:, 5] = (cur - mean) * inv_std
    out[:, 6] = (nxt - mean) * inv_std
    out[:, 7] = gap_top * inv_rng
    out[:, 8] = gap_next * inv_rng
    out[:, 9] = gap_next * inv_std
    out[:, 10] = gap_next * inv_max_drop
    out[0, 11] = 0.0
    if d > 1:
        out[1:, 11] = np.maximum.accumulate(gap_next[:-1]) * inv_rng
    out[:, 12] = (cur - padded[_LOOKAHEAD : d + _LOOKAHEAD]) * inv_rng
    out[:, 13] = top_drop * inv_rng
    out[:, 14] = k
    out[:, 15] = log2_k
    out[:, 16] = log2_n
    out[:, 17] = log2_n - log2_k
    if not np.isfinite(out).all():  # only absurd magnitudes (|score| > 3e38) get here
        np.nan_to_num(out, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    return out
