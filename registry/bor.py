"""Bits-over-Random (BoR): chance-corrected selectivity of a shortlist, exact and in log space.

For a registry of ``N`` tools of which ``R`` are relevant to a query, a shortlist of ``K``
tools drawn uniformly at random contains at least one relevant tool with probability
(hypergeometric, zero successes excluded)::

    P_rand(N, R, K) = 1 - C(N-R, K) / C(N, K)

and a system that succeeds on a fraction ``P_obs`` of queries scores::

    BoR = log2(P_obs / P_rand)        bits; 0 = chance level, each bit doubles selectivity

With perfect success the most a depth-``K`` shortlist can score is ``BoR_max = -log2 P_rand``;
assuming ``R = 1`` the ceiling is ``log2(N / K)``.

Numerics. Write ``q = log(C(N-R, K) / C(N, K))``, so ``P_rand = -expm1(q)``. The ratio is the
hypergeometric probability of zero successes, which is symmetric in ``R`` and ``K``::

    C(N-R, K) / C(N, K) = prod_{i<K} (1 - R/(N-i)) = prod_{j<R} (1 - K/(N-j))

so ``q`` is a sum of ``min(R, K)`` same-sign ``log1p`` terms, accurate to a few ulps even
when ``P_rand`` is ~1e-7 (N = 10^7, R = K = 1), where a difference of ``lgamma`` values
(~1.5e8 each) would lose every significant digit. Beyond 10^5 terms
``|q| >= min(R,K)^2 / N`` is large (>= 1000 for N <= 10^7, where ``P_rand`` rounds to 1), so
the cheaper ``lgamma`` form is used: its small absolute error on ``q`` barely moves
``P_rand``. ``log P_rand = log(-expm1(q))`` goes through the usual two-branch ``log1mexp``,
so tiny and near-one probabilities both keep full precision.

**Every needed tool ("all").** A multi-tool task needs all ``R`` relevant tools; a random
shortlist of ``K`` tools holds every one of them with probability (hypergeometric, all ``R``
successes drawn)::

    P_rand_all(N, R, K) = C(N-R, K-R) / C(N, K) = C(K, R) / C(N, R)      (0 when K < R)

and ``BoR_all = log2(P_obs_all / P_rand_all)``. The ratio is ``prod_{j<R} (K-j)/(N-j)`` and,
since ``C(N-R, K-R) = C(N-R, N-K)``, also ``prod_{i<N-K} (N-R-i)/(N-i)``: ``log P_rand_all``
is a sum of ``min(R, N-K)`` same-sign logs (``log1p`` for factors near 1, so no term loses
precision), or the ``lgamma`` form beyond 10^5 terms. For ``R = 1`` it equals ``P_rand``.

**Needs reward (depth training for multi-tool requests).** A shortlist of depth ``K`` holding
``h`` of the ``R`` needed tools is paid, in bits::

    needs_bits = 1/2 * (h / R) * -log2 P_rand(N, 1, K)                 recall, chance-corrected
               + 1/2 * [h == R] * -log2 P_rand_all(N, R, K) / R         every needed tool

The first term is recall priced at the bits of beating a random list: a random ``K``-list's
expected recall is ``E[hits] / R = K / N = P_rand(N, 1, K)`` (hypergeometric mean ``K R / N``).
The second is ``BoR_all`` per needed tool (``log2 C(N,R) / R`` at ``K = R``, about
``log2(N / K)`` for ``K >> R``), so both terms live on one scale. For ``R = 1`` both equal
``-log2 P_rand(N, 1, K)``: single-tool requests get exactly the any-found BoR reward, and
stop as early as before.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "bor_all_bits",
    "bor_all_max_bits",
    "bor_bits",
    "bor_ceiling_bits",
    "bor_max_bits",
    "k_equivalent",
    "log_p_rand",
    "log_p_rand_all",
    "log_p_rand_all_curve",
    "log_p_rand_curve",
    "needs_bits_curve",
    "p_rand",
    "p_rand_all",
]

# Above this many product terms the lgamma form is used (see module docstring).
_PRODUCT_TERMS_MAX = 100_000
_LN2 = math.log(2.0)


def _validate(n: int, r: int, k: int) -> tuple[int, int, int]:
    for name, value in (("n", n), ("r", r), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    n, r, k = int(n), int(r), int(k)
    if n < 1:
        raise ValueError(f"n (registry size) must be >= 1, got {n}")
    if r < 1:
        raise ValueError(f"r (relevant tools) must be >= 1, got {r}")
    if r > n:
        raise ValueError(f"r (relevant tools) must be <= n, got r={r} > n={n}")
    if k < 0:
        raise ValueError(f"k (shortlist length) must be >= 0, got {k}")
    return n, r, min(k, n)


def _log_ratio_none(n: int, r: int, k: int) -> float:
    """``log(C(n-r, k) / C(n, k))`` for ``1 <= k <= n - r`` (the ratio is then > 0)."""
    m = min(r, k)
    other = max(r, k)
    if m <= _PRODUCT_TERMS_MAX:
        denom = n - np.arange(m, dtype=np.float64)
        return float(np.sum(np.log1p(-other / denom)))
    return (
        math.lgamma(n - r + 1)
        - math.lgamma(n - r - k + 1)
        - math.lgamma(n + 1)
        + math.lgamma(n - k + 1)
    )


def _log1mexp(q: float) -> float:
    """``log(1 - exp(q))`` for ``q < 0``, accurate on both sides of ``-log 2``."""
    if q > -_LN2:
        return math.log(-math.expm1(q))
    return math.log1p(-math.exp(q))


def log_p_rand(n: int, r: int, k: int) -> float:
    """Natural log of ``P_rand = 1 - C(n-r, k) / C(n, k)``.

    Args:
        n: registry size ``N >= 1``.
        r: number of relevant tools, ``1 <= r <= n``.
        k: shortlist length ``k >= 0``; values above ``n`` are clamped to ``n``.

    Returns:
        ``log P_rand``: ``-inf`` for ``k == 0``, ``0.0`` once ``k >= n - r + 1`` (a random
        shortlist that long cannot miss every relevant tool).

    Raises:
        ValueError: ``n < 1``, ``r < 1``, ``r > n``, ``k < 0`` or a non-integer argument.
    """
    n, r, k = _validate(n, r, k)
    if k == 0:
        return -math.inf
    if k >= n - r + 1:
        return 0.0
    q = _log_ratio_none(n, r, k)
    if q >= 0.0:  # cannot happen for k >= 1, r >= 1; guards against rounding
        return -math.inf
    return _log1mexp(q)


def log_p_rand_curve(n: int, r: int, k_max: int) -> np.ndarray:
    """``log P_rand(n, r, k)`` for ``k = 0 .. k_max`` at once (float64, length ``k_max + 1``).

    Same definition and validation as :func:`log_p_rand`; vectorised by accumulating the
    ``prod_{i<k} (1 - r/(n-i))`` form, which is exact term by term. Meant for reward tables.
    """
    n, r, k_max_c = _validate(n, r, k_max)
    out = np.zeros(k_max + 1, dtype=np.float64)
    out[0] = -np.inf
    if k_max_c == 0:
        return out
    kk = min(k_max_c, n - r)  # ratio > 0 for k <= n - r
    if kk >= 1:
        i = np.arange(kk, dtype=np.float64)
        q = np.cumsum(np.log1p(-r / (n - i)))
        with np.errstate(divide="ignore"):
            small = q <= -_LN2
            vals = np.where(
                small,
                np.log1p(-np.exp(np.minimum(q, 0.0))),
                np.log(-np.expm1(np.minimum(q, -1e-300))),
            )
        out[1 : kk + 1] = vals
    # k >= n - r + 1 (and every k clamped to n): P_rand = 1
    out[kk + 1 :] = 0.0
    return out


def p_rand(n: int, r: int, k: int) -> float:
    """``P_rand = 1 - C(n-r, k) / C(n, k)``: chance that ``k`` random tools include a relevant one.

    See :func:`log_p_rand` for arguments and errors.
    """
    return math.exp(log_p_rand(n, r, k))


def bor_bits(p_obs: float, p_rand: float) -> float:
    """``BoR = log2(p_obs / p_rand)`` in bits.

    Args:
        p_obs: observed success rate in ``[0, 1]``; ``0`` gives ``-inf``.
        p_rand: chance success rate in ``(0, 1]``.

    Raises:
        ValueError: an argument is outside its range or not finite.
    """
    p_obs = float(p_obs)
    p_rand_f = float(p_rand)
    if not (0.0 <= p_obs <= 1.0):
        raise ValueError(f"p_obs must be in [0, 1], got {p_obs}")
    if not (0.0 < p_rand_f <= 1.0):
        raise ValueError(f"p_rand must be in (0, 1], got {p_rand_f}")
    if p_obs == 0.0:
        return -math.inf
    return math.log2(p_obs) - math.log2(p_rand_f)


def bor_max_bits(n: int, r: int, k: int) -> float:
    """``BoR_max(K) = -log2 P_rand(n, r, k)``: BoR of a system that always succeeds at depth ``k``.

    ``+inf`` for ``k == 0``; ``0.0`` once ``k >= n - r + 1``. Errors as :func:`log_p_rand`.
    """
    return -log_p_rand(n, r, k) / _LN2 + 0.0  # + 0.0 turns -0.0 into 0.0


def bor_ceiling_bits(n: int, k: int) -> float:
    """Optimistic ceiling ``log2(n / k)`` (the ``R = 1`` case of :func:`bor_max_bits`).

    Args:
        n: registry size ``>= 1``.
        k: shortlist length ``>= 1``; clamped to ``n``.

    Raises:
        ValueError: ``n < 1`` or ``k < 1``.
    """
    n, _, k = _validate(n, 1, k)
    if k < 1:
        raise ValueError(f"k must be >= 1 for the ceiling, got {k}")
    return math.log2(n) - math.log2(k)


# ----------------------------------------------------------------------------- every needed tool


def _log_falling_ratio(n: int, a: int, m: int) -> float:
    """``sum_{j<m} log((a-j)/(n-j))`` for ``m <= a < n``, every term to a few ulps.

    A factor near 1 goes through ``log1p(-(n-a)/(n-j))``, a small one through ``log`` of the
    ratio itself: ``log1p(-x)`` with ``x`` close to 1 would turn the rounding of ``x`` into a
    large relative error of ``1 - x``.
    """
    j = np.arange(m, dtype=np.float64)
    den = n - j
    ratio = (a - j) / den
    terms = np.where(ratio > 0.5, np.log1p(-(n - a) / den), np.log(np.maximum(ratio, 1e-300)))
    return float(np.sum(terms))


def _log_ratio_all(n: int, r: int, k: int) -> float:
    """``log(C(n-r, k-r) / C(n, k))`` for ``r <= k < n``.

    The ratio is ``prod_{j<r} (k-j)/(n-j)`` and, by ``C(n-r, k-r) = C(n-r, n-k)``, also
    ``prod_{i<n-k} (n-r-i)/(n-i)``; the shorter product is used (``lgamma`` beyond 10^5 terms,
    where the log is below -1000 and the probability underflows anyway).
    """
    if r <= n - k:
        m, a = r, k
    else:
        m, a = n - k, n - r
    if m <= _PRODUCT_TERMS_MAX:
        return _log_falling_ratio(n, a, m)
    return math.lgamma(k + 1) - math.lgamma(k - r + 1) - math.lgamma(n + 1) + math.lgamma(n - r + 1)


def log_p_rand_all(n: int, r: int, k: int) -> float:
    """Natural log of ``P_rand_all = C(n-r, k-r) / C(n, k)``: ``k`` random tools hold all ``r``.

    Args:
        n: registry size ``N >= 1``.
        r: number of needed tools, ``1 <= r <= n``.
        k: shortlist length ``k >= 0``; values above ``n`` are clamped to ``n``.

    Returns:
        ``log P_rand_all``: ``-inf`` for ``k < r`` (a list shorter than the task cannot hold
        it), ``0.0`` for ``k == n``.

    Raises:
        ValueError: as :func:`log_p_rand`.
    """
    n, r, k = _validate(n, r, k)
    if k < r:
        return -math.inf
    if k == n:
        return 0.0
    return min(_log_ratio_all(n, r, k), 0.0)


def log_p_rand_all_curve(n: int, r: int, k_max: int) -> np.ndarray:
    """``log P_rand_all(n, r, k)`` for ``k = 0 .. k_max`` at once (float64, length ``k_max + 1``).

    ``-inf`` below ``k = r``; from there ``P_all(k+1) / P_all(k) = (k+1) / (k+1-r)`` is
    accumulated in log space from the exact scalar value at ``k = r``. Meant for reward tables.
    """
    n, r, k_max_c = _validate(n, r, k_max)
    out = np.full(k_max + 1, -np.inf, dtype=np.float64)
    if k_max_c < r:
        return out
    ks = np.arange(r + 1, k_max_c + 1, dtype=np.float64)
    steps = np.log1p(r / (ks - r))
    out[r : k_max_c + 1] = log_p_rand_all(n, r, r) + np.concatenate([[0.0], np.cumsum(steps)])
    out[k_max_c : k_max + 1] = log_p_rand_all(n, r, k_max_c)  # exact at the clamp (0 at k = n)
    return np.minimum(out, 0.0)


def p_rand_all(n: int, r: int, k: int) -> float:
    """``P_rand_all = C(n-r, k-r) / C(n, k)``: chance that ``k`` random tools include all ``r``.

    Underflows to ``0.0`` for astronomically unlikely cases (use :func:`log_p_rand_all`
    there). See :func:`log_p_rand_all` for arguments and errors.
    """
    return math.exp(log_p_rand_all(n, r, k))


def bor_all_bits(p_obs_all: float, n: int, r: int, k: int) -> float:
    """``BoR_all = log2(P_obs_all / P_rand_all(n, r, k))`` in bits, computed in log space.

    Works where ``P_rand_all`` underflows a float (``r`` large, ``n`` huge).

    Args:
        p_obs_all: observed rate of shortlists holding every needed tool, in ``[0, 1]``;
            ``0`` gives ``-inf``.
        n, r, k: as :func:`log_p_rand_all`; ``k >= r`` (shorter lists cannot succeed).

    Raises:
        ValueError: ``p_obs_all`` outside ``[0, 1]``, ``k < r``, or invalid ``n, r, k``.
    """
    p = float(p_obs_all)
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"p_obs_all must be in [0, 1], got {p}")
    log_pr = log_p_rand_all(n, r, k)
    if log_pr == -math.inf:
        raise ValueError(f"P_rand_all is 0 for k={k} < r={r}: no list that short holds every tool")
    if p == 0.0:
        return -math.inf
    return math.log2(p) - log_pr / _LN2


def bor_all_max_bits(n: int, r: int, k: int) -> float:
    """``-log2 P_rand_all(n, r, k)``: BoR_all of a system that always shows every needed tool.

    The ceiling is highest at ``k = r`` (``log2 C(n, r)``: an exact answer) and falls to 0 at
    ``k = n``; ``+inf`` for ``k < r`` (no system succeeds there). For ``r = 1`` it equals
    :func:`bor_max_bits` and :func:`bor_ceiling_bits`. Errors as :func:`log_p_rand_all`.
    """
    return -log_p_rand_all(n, r, k) / _LN2 + 0.0


# Used by the offline metrics and by the per-registry refits (learning), hence here, at the bottom.
def k_equivalent(curve: np.ndarray, found: float) -> float:
    """Fixed depth with found rate ``found``, linear between integer depths (``inf``: none).

    ``curve[K]`` is the found rate at fixed depth ``K`` (``curve[0] = 0``), non-decreasing.
    On a flat stretch the smallest depth reaching ``found`` is used.
    """
    c = np.asarray(curve, dtype=np.float64)
    if found <= 0.0:
        return 0.0
    if found > c[-1] + 1e-12:
        return math.inf
    i = int(np.argmax(c >= found - 1e-12))
    if i == 0:
        return 0.0
    lo, hi = c[i - 1], c[i]
    return float(i - 1 + (found - lo) / (hi - lo)) if hi > lo else float(i)


def needs_bits_curve(n: int, r: int, hits: np.ndarray) -> np.ndarray:
    """The needs reward (module docstring) at ``K = 1 .. len(hits)``; ``hits[K-1]`` = needed tools
    among the top ``K`` (non-decreasing, ``<= r``). float64, length ``len(hits)``.

    Raises:
        ValueError: invalid ``n, r`` (as :func:`log_p_rand`) or ``hits`` outside ``[0, r]``.
    """
    h = np.asarray(hits, dtype=np.float64).reshape(-1)
    if h.size and (h.min() < 0 or h.max() > r):
        raise ValueError(f"hits must lie in [0, r={r}]")
    k_max = int(h.size)
    if k_max == 0:
        _validate(n, r, 0)
        return np.zeros(0, dtype=np.float64)
    any_bits = -log_p_rand_curve(n, 1, k_max)[1:] / _LN2
    all_log = log_p_rand_all_curve(n, r, k_max)[1:]
    complete = h >= r
    all_bits = np.where(complete, -np.where(complete, all_log, 0.0) / _LN2 / r, 0.0)
    return 0.5 * (h / r) * any_bits + 0.5 * all_bits + 0.0
