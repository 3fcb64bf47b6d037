"""Metrics over ranked episodes: found-at-K curves (any / all), K_eq, depth efficiency, BoR.

One copy of each, imported by evaluation (:mod:`registry.offline.evaluate`), training
(:mod:`registry.offline.train`) and the benches.
An :class:`~registry.offline.episodes.Episode` holds every gold rank of its query (ranks may lie
beyond the kept scores), so a list of depth ``K`` (a prefix of the ranking) shows

* at least one gold tool ("any") iff the best gold rank is ``< K``;
* every gold tool ("all") iff the worst gold rank is ``< K``.

Depth efficiency of a policy with found rate ``F`` at mean depth ``K_p`` is ``K_eq / K_p``,
``K_eq`` the fixed depth with found rate ``F`` on the fixed-K curve (linear in between).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from registry.bor import k_equivalent, log_p_rand_all, p_rand
from registry.offline.env import DEFAULT_MAX_DEPTH
from registry.offline.episodes import Episode
from registry.serving.depth_policies import FixedPolicy
from registry.settings import Settings

__all__ = [
    "DEFAULT_CAP",
    "DEFAULT_SCORER",
    "NEEDS",
    "PolicyFn",
    "compare_with_fixed",
    "depth_efficiency",
    "evaluate_policy",
    "fixed_curve",
    "fixed_found_at",
    "fixed_k_baselines",
    "found_at",
    "found_bits",
    "found_bits_all",
    "found_rate",
    "k_equivalent",
    "needed_ranks",
    "policy_depths",
]

NEEDS: tuple[str, ...] = ("any", "all")
DEFAULT_CAP: int = Settings.model_fields["default_max_k"].default  # the service's max_k
DEFAULT_SCORER: str = Settings.model_fields["default_scorer"].default
PolicyFn = Callable[[np.ndarray, int, int], int]


def needed_ranks(episodes: Sequence[Episode], need: str = "any") -> np.ndarray:
    """Per episode, the 0-based rank a list must reach to count as found.

    ``need="any"``: the best gold rank (at least one gold tool shown); ``"all"``: the worst
    (every gold tool shown). ``n_tools`` (never reached) for an episode without gold.
    A list of depth ``K`` (a prefix of the ranking) is found iff this rank is ``< K``.
    """
    if need not in NEEDS:
        raise ValueError(f"need must be one of {NEEDS}, got {need!r}")
    pick = np.min if need == "any" else np.max
    return np.array(
        [int(pick(e.gold_ranks)) if e.gold_ranks.size else e.n_tools for e in episodes], dtype=np.int64
    )


def fixed_curve(episodes: Sequence[Episode], cap: int, *, need: str = "any") -> np.ndarray:
    """Found rate of fixed depth ``K = 0..cap`` (index ``K``; ``found(0) = 0``).

    Depth is capped per episode at ``min(len(scores), n_tools)``, as a policy's would be.
    ``need="all"``: the rate at which every gold tool is shown (see :func:`needed_ranks`).
    """
    if not episodes:
        return np.zeros(cap + 1)
    needed = needed_ranks(episodes, need)
    caps = np.array([min(e.scores.size, e.n_tools) for e in episodes])
    ks = np.arange(0, cap + 1)
    eff = np.minimum(ks[None, :], caps[:, None])
    return (needed[:, None] < eff).mean(axis=0)


def found_at(episodes: Sequence[Episode], k: int, *, need: str = "any") -> float:
    """Fraction of episodes with a gold tool (``need="all"``: every gold tool) in the top ``k``.

    Gold ranks beyond the kept scores count; :func:`fixed_curve` is the
    same figure with depth capped at the kept list, as a policy's would be.
    """
    if not episodes:
        return 0.0
    return float(np.mean(needed_ranks(episodes, need) < k))


def found_rate(episodes: Sequence[Episode], ks: np.ndarray, *, need: str = "any") -> float:
    """Share of episodes found by per-episode depths ``ks`` (see :func:`needed_ranks`)."""
    if not episodes:
        return 0.0
    return float(np.mean(needed_ranks(episodes, need) < np.asarray(ks)))


def fixed_found_at(curve: np.ndarray, mean_k: float) -> float:
    """Found rate of a fixed depth at a fractional ``mean_k``, linear on ``curve[K], K = 0..``."""
    c = np.asarray(curve, dtype=np.float64)
    return float(np.interp(mean_k, np.arange(c.size), c))


def depth_efficiency(curve: np.ndarray, found: float, mean_k: float) -> float:
    """``K_eq / K_p``: how many times more tools fixed top-K needs for the same found rate."""
    if mean_k <= 0:
        return math.nan
    return k_equivalent(curve, found) / mean_k


def policy_depths(policy_fn: PolicyFn, episodes: Sequence[Episode], cap: int) -> np.ndarray:
    """Depth chosen for each episode: ``policy_fn(scores, n_tools, cap)``, clipped to the cap."""
    return np.array(
        [min(int(policy_fn(e.scores, e.n_tools, cap)), cap, e.scores.size, e.n_tools) for e in episodes],
        dtype=np.int64,
    )


def found_bits_all(episodes: Sequence[Episode], ks: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Every-gold-shown flags, mean ``P_rand_all`` and ``BoR_all`` bits (mean taken in log space)."""
    found = needed_ranks(episodes, "all") < ks
    logs = np.array(
        [log_p_rand_all(e.n_tools, min(max(e.n_gold, 1), e.n_tools), int(k))
         for e, k in zip(episodes, ks)]
    )
    rate = float(found.mean()) if found.size else 0.0
    if not logs.size or np.all(np.isneginf(logs)):
        return found, 0.0, -math.inf
    top = float(logs.max())
    log_mean = top + math.log(float(np.exp(logs - top).mean()))
    bits = (math.log(rate) - log_mean) / math.log(2) if rate > 0 else -math.inf
    return found, math.exp(log_mean), bits


def found_bits(episodes: Sequence[Episode], ks: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Found (any gold shown) flags, mean ``P_rand`` and ``BoR`` bits ``log2(found / mean P_rand)``."""
    found = np.array([e.first_gold_rank < k for e, k in zip(episodes, ks)], dtype=bool)
    pr = np.array(
        [p_rand(e.n_tools, min(max(e.n_gold, 1), e.n_tools), int(k)) if k > 0 else 0.0 for e, k in zip(episodes, ks)]
    )
    rate = float(found.mean()) if found.size else 0.0
    mean_pr = float(pr.mean()) if pr.size else 0.0
    bits = math.log2(rate / mean_pr) if rate > 0 and mean_pr > 0 else -math.inf
    return found, mean_pr, bits


def evaluate_policy(
    policy_fn: PolicyFn, episodes: Sequence[Episode], max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, float]:
    """Found rate, depth and BoR of a depth policy over episodes (:func:`found_bits`).

    For each episode the policy picks ``k_q = policy_fn(scores, n_tools, max_depth)``.
    Keys: ``n``, ``found`` (Success@k), ``mean_k``, ``k_std``, ``mean_p_rand`` (mean
    ``P_rand(N_q, R_q, k_q)``, ``R_q >= 1``) and ``bor_bits`` (``-inf`` when nothing is found).
    """
    if not episodes:
        raise ValueError("no episodes")
    ks = np.array([int(policy_fn(e.scores, e.n_tools, max_depth)) for e in episodes], dtype=np.int64)
    found, mean_pr, bits = found_bits(episodes, ks)
    return {
        "n": len(episodes),
        "found": float(found.mean()),
        "mean_k": float(ks.mean()),
        "k_std": float(ks.std()),
        "mean_p_rand": mean_pr,
        "bor_bits": bits,
    }


def fixed_k_baselines(
    episodes: Sequence[Episode],
    ks: Sequence[int] = (1, 3, 5, 10),
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[int, dict[str, float]]:
    """:func:`evaluate_policy` of ``FixedPolicy(k)`` for each ``k``."""
    return {k: evaluate_policy(FixedPolicy(k).choose_depth, episodes, max_depth) for k in ks}


def compare_with_fixed(
    policy_fn: PolicyFn,
    episodes: Sequence[Episode],
    max_depth: int = DEFAULT_MAX_DEPTH,
    ks: Sequence[int] = (1, 3, 5, 10),
) -> dict[str, Any]:
    """Policy metrics, fixed-K baselines and the fixed-depth found rate at the policy's mean K.

    ``beats_fixed``: the policy finds at least as often as the (interpolated) fixed depth with
    the same mean K; ``k_eq`` / ``efficiency`` as in :func:`depth_efficiency`.
    """
    pol = evaluate_policy(policy_fn, episodes, max_depth)
    curve = fixed_curve(episodes, max_depth)
    fixed_at = fixed_found_at(curve, pol["mean_k"])
    return {
        "policy": pol,
        "fixed": {str(k): v for k, v in fixed_k_baselines(episodes, ks, max_depth).items()},
        "fixed_found_at_mean_k": fixed_at,
        "found_margin": pol["found"] - fixed_at,
        "beats_fixed": bool(pol["found"] >= fixed_at - 1e-12),
        "k_eq": k_equivalent(curve, pol["found"]),
        "efficiency": depth_efficiency(curve, pol["found"], pol["mean_k"]),
    }
