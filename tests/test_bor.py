"""Golden tests of the Bits-over-Random maths against scipy.stats.hypergeom and exact rationals."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest
from scipy.stats import hypergeom

from registry.bor import (
    bor_all_bits,
    bor_all_max_bits,
    bor_bits,
    bor_ceiling_bits,
    bor_max_bits,
    log_p_rand,
    log_p_rand_all,
    log_p_rand_all_curve,
    log_p_rand_curve,
    p_rand,
    p_rand_all,
)


def _grid() -> list[tuple[int, int, int]]:
    cases = set()
    for n in (1, 2, 3, 7, 20, 50, 100, 370, 2479, 10_000, 100_000, 10_000_000):
        for r in {1, 2, 3, 5, 17, n // 3, n // 2, n - 1, n}:
            if not 1 <= r <= n:
                continue
            for k in {1, 2, 3, 5, 10, 50, 1000, 5000, n // 2, n - r, n - r + 1, n}:
                if 1 <= k <= n:
                    cases.add((n, r, k))
    return sorted(cases)


GRID = _grid()


def _scipy_p_rand(n: int, r: int, k: int) -> float:
    """``1 - hypergeom(N, R, K).pmf(0)``, computed as ``sf(0)``.

    Same quantity; the survival function keeps ~1e-9 relative accuracy at N = 1e7 where
    ``1 - pmf(0)`` cancels (up to 2e-3 relative error for P ~ 1e-6).
    """
    return float(hypergeom(n, r, k).sf(0))


@pytest.mark.parametrize(("n", "r", "k"), GRID)
def test_p_rand_matches_scipy_hypergeom(n: int, r: int, k: int) -> None:
    want = _scipy_p_rand(n, r, k)
    assert p_rand(n, r, k) == pytest.approx(want, rel=1e-6, abs=1e-300)
    assert log_p_rand(n, r, k) == pytest.approx(math.log(want), rel=1e-6, abs=1e-9)
    # the textbook form, where it does not cancel
    if n <= 10_000:
        assert p_rand(n, r, k) == pytest.approx(1 - hypergeom(n, r, k).pmf(0), rel=1e-6, abs=1e-12)


def _exact_p_rand(n: int, r: int, k: int) -> Fraction:
    """``1 - C(n-r,k)/C(n,k)`` as a Fraction via the shorter of the two symmetric products."""
    m, other = min(r, k), max(r, k)
    none = Fraction(1)
    for i in range(m):
        none *= Fraction(n - i - other, n - i)
    return 1 - none


@pytest.mark.parametrize(
    ("n", "r", "k"),
    [(n, r, k) for (n, r, k) in GRID if min(r, k) <= 20]
    + [(10_000_000, 2, 50), (10_000_000, 1, 100), (10_000_000, 17, 1000), (10_000_000, 5, 5000)],
)
def test_p_rand_matches_exact_rationals(n: int, r: int, k: int) -> None:
    exact = _exact_p_rand(n, r, k)
    assert p_rand(n, r, k) == pytest.approx(float(exact), rel=1e-12, abs=0)


@pytest.mark.parametrize(
    ("n", "r", "k"),
    [(5, 1, 1), (10, 3, 4), (12, 5, 6), (40, 7, 9), (60, 30, 25), (100, 2, 98), (370, 1, 5)],
)
def test_p_rand_exact_rational(n: int, r: int, k: int) -> None:
    exact = 1 - Fraction(math.comb(n - r, k), math.comb(n, k))
    assert p_rand(n, r, k) == pytest.approx(float(exact), rel=1e-13)


def test_large_registry_tiny_probabilities_keep_precision() -> None:
    n = 10_000_000
    # R = 1: P_rand = K / N exactly
    for k in (1, 2, 10, 12345, n // 2):
        assert p_rand(n, 1, k) == pytest.approx(k / n, rel=1e-12)
    # R = 3, K = 7: 1 - prod (1 - 3/(N-i)) ~ 2.1e-6
    exact = 1 - Fraction(math.comb(n - 3, 7), math.comb(n, 7))
    assert p_rand(n, 3, 7) == pytest.approx(float(exact), rel=1e-12)
    assert bor_max_bits(n, 1, 1) == pytest.approx(math.log2(n), rel=1e-12)


def test_single_relevant_tool_is_k_over_n() -> None:
    for n in (1, 2, 370, 2479):
        for k in range(0, min(n, 60) + 1):
            assert p_rand(n, 1, k) == pytest.approx(k / n, rel=1e-12, abs=0)


def test_edge_cases() -> None:
    assert p_rand(370, 1, 0) == 0.0
    assert log_p_rand(370, 4, 0) == -math.inf
    assert bor_max_bits(370, 1, 0) == math.inf
    # every k >= N - R + 1 must hit a relevant tool
    assert p_rand(10, 3, 8) == 1.0
    assert log_p_rand(10, 3, 8) == 0.0
    assert bor_max_bits(10, 3, 8) == 0.0
    assert p_rand(10, 10, 1) == 1.0
    assert p_rand(1, 1, 1) == 1.0
    # k > n is clamped to n
    assert p_rand(10, 2, 50) == 1.0
    assert log_p_rand(370, 1, 10**9) == 0.0
    assert bor_ceiling_bits(370, 1000) == 0.0


@pytest.mark.parametrize(
    ("n", "r", "k"),
    [(0, 1, 1), (-5, 1, 1), (10, 0, 1), (10, -1, 1), (10, 11, 1), (10, 1, -1), (10.0, 1, 1), (10, 1, 2.5), (10, True, 1)],
)
def test_invalid_arguments(n: int, r: int, k: int) -> None:
    with pytest.raises(ValueError):
        log_p_rand(n, r, k)
    with pytest.raises(ValueError):
        p_rand(n, r, k)


def test_numpy_integers_are_accepted() -> None:
    # p_rand is typed int; numpy integers are accepted at runtime all the same
    assert p_rand(np.int64(370), np.int32(1), np.int64(5)) == pytest.approx(5 / 370)  # type: ignore[arg-type]


def test_monotone_in_k_and_r() -> None:
    n = 500
    for r in (1, 3, 40):
        curve = [p_rand(n, r, k) for k in range(0, n + 1)]
        assert all(b >= a for a, b in pairwise(curve))
    for k in (1, 5, 50):
        by_r = [p_rand(n, r, k) for r in range(1, n + 1)]
        assert all(b >= a for a, b in pairwise(by_r))


@pytest.mark.parametrize(("n", "r"), [(1, 1), (10, 3), (370, 1), (370, 6), (2479, 2), (10_000_000, 4), (50, 50)])
def test_curve_matches_scalar(n: int, r: int) -> None:
    k_max = min(n + 5, 400)
    curve = log_p_rand_curve(n, r, k_max)
    assert curve.shape == (k_max + 1,)
    assert curve[0] == -math.inf
    for k in range(1, k_max + 1):
        assert curve[k] == pytest.approx(log_p_rand(n, r, k), rel=1e-12, abs=1e-15)


def test_bor_bits() -> None:
    assert bor_bits(1.0, 0.5) == pytest.approx(1.0)
    assert bor_bits(0.5, 0.5) == 0.0
    assert bor_bits(0.25, 0.5) == pytest.approx(-1.0)
    assert bor_bits(0.0, 0.1) == -math.inf
    assert bor_bits(0.9, 1 / 370) == pytest.approx(math.log2(0.9 * 370))
    for bad in ((1.1, 0.5), (-0.1, 0.5), (0.5, 0.0), (0.5, 1.5), (math.nan, 0.5)):
        with pytest.raises(ValueError):
            bor_bits(*bad)


def test_max_and_ceiling_bits() -> None:
    assert bor_max_bits(370, 1, 1) == pytest.approx(math.log2(370))
    assert bor_max_bits(370, 1, 5) == pytest.approx(math.log2(370 / 5))
    for n, k in ((370, 1), (370, 7), (2479, 20), (10_000_000, 3)):
        assert bor_ceiling_bits(n, k) == pytest.approx(math.log2(n / k))
        assert bor_ceiling_bits(n, k) == pytest.approx(bor_max_bits(n, 1, k), rel=1e-12)
        # more relevant tools make chance success likelier: ceiling is an upper bound
        assert bor_max_bits(n, 3, k) <= bor_ceiling_bits(n, k)
    # paper, section 3.3: ~7 bits at K=3 of 500, ~2 bits at K=100
    assert bor_max_bits(500, 1, 3) == pytest.approx(7.38, abs=0.01)
    assert bor_max_bits(500, 1, 100) == pytest.approx(2.32, abs=0.01)
    with pytest.raises(ValueError):
        bor_ceiling_bits(370, 0)
    with pytest.raises(ValueError):
        bor_ceiling_bits(0, 1)


# ----------------------------------------------------------------------------- every needed tool


def _exact_p_rand_all(n: int, r: int, k: int) -> Fraction:
    k = min(k, n)
    return Fraction(math.comb(n - r, k - r), math.comb(n, k)) if k >= r else Fraction(0)


@pytest.mark.parametrize(("n", "r", "k"), GRID)
def test_p_rand_all_matches_scipy_hypergeom(n: int, r: int, k: int) -> None:
    want = float(hypergeom(n, r, k).pmf(r))  # every one of the r needed tools drawn
    got = p_rand_all(n, r, k)
    if want < 1e-280:  # scipy's pmf underflows; compare the logs instead
        assert log_p_rand_all(n, r, k) == pytest.approx(float(hypergeom(n, r, k).logpmf(r)), rel=1e-6)
    else:
        assert got == pytest.approx(want, rel=1e-6)
        # abs 1e-8: near P = 1 at N = 1e7 scipy's pmf is off by ~2e-9 (the exact-rational test
        # below holds ours to 1e-12)
        assert log_p_rand_all(n, r, k) == pytest.approx(math.log(want), rel=1e-6, abs=1e-8)


@pytest.mark.parametrize(
    ("n", "r", "k"),
    [(n, r, k) for (n, r, k) in GRID if n <= 10_000 and min(r, n - k) <= 2000]
    + [(10_000_000, 3, 10), (10_000_000, 2, 5000), (10_000_000, 1, 123), (2479, 6, 50)],
)
def test_p_rand_all_matches_exact_rationals(n: int, r: int, k: int) -> None:
    exact = _exact_p_rand_all(n, r, k)
    if exact == 0:
        assert p_rand_all(n, r, k) == 0.0
        return
    want = math.log(exact.numerator) - math.log(exact.denominator)
    assert log_p_rand_all(n, r, k) == pytest.approx(want, rel=1e-12, abs=1e-12)
    if float(exact) > 1e-300:
        assert p_rand_all(n, r, k) == pytest.approx(float(exact), rel=1e-11)


@pytest.mark.parametrize("n", [1, 2, 4, 6, 8])
def test_p_rand_all_matches_brute_force_enumeration(n: int) -> None:
    """Count the K-subsets of a tiny registry that hold every needed tool {0..R-1}."""
    from itertools import combinations

    for r in range(1, n + 1):
        needed = set(range(r))
        for k in range(n + 1):
            subsets = list(combinations(range(n), k))
            hits = sum(1 for s in subsets if needed <= set(s))
            assert p_rand_all(n, r, k) == pytest.approx(hits / len(subsets), rel=1e-12, abs=0)
            # and the "any" chance, by the same enumeration
            any_hits = sum(1 for s in subsets if needed & set(s))
            assert p_rand(n, r, k) == pytest.approx(any_hits / len(subsets), rel=1e-12, abs=0)


def test_p_rand_all_edges_and_relations() -> None:
    assert p_rand_all(370, 3, 2) == 0.0 and log_p_rand_all(370, 3, 2) == -math.inf
    assert p_rand_all(370, 1, 0) == 0.0
    assert p_rand_all(370, 3, 370) == 1.0 and log_p_rand_all(370, 3, 10**6) == 0.0  # clamped
    assert p_rand_all(10, 10, 10) == 1.0
    # R = 3, K = 3: exactly the needed tools, 1 / C(N, 3)
    assert p_rand_all(100, 3, 3) == pytest.approx(1 / math.comb(100, 3), rel=1e-13)
    for n, r, k in ((370, 1, 1), (370, 1, 17), (2479, 1, 50), (10_000_000, 1, 3)):
        assert p_rand_all(n, r, k) == pytest.approx(p_rand(n, r, k), rel=1e-12)  # R = 1: any == all
    for n, r, k in ((370, 2, 5), (2479, 3, 20), (50, 5, 30)):
        assert p_rand_all(n, r, k) < p_rand(n, r, k)  # all is harder than any
    # monotone: up in K, down in R
    curve = [p_rand_all(200, 4, k) for k in range(201)]
    assert all(b >= a for a, b in pairwise(curve))
    by_r = [p_rand_all(200, r, 30) for r in range(1, 40)]
    assert all(b <= a for a, b in pairwise(by_r))
    # a tiny probability keeps full precision: N = 1e7, R = 3, K = 10 -> 720 / (N (N-1) (N-2))
    n = 10_000_000
    assert p_rand_all(n, 3, 10) == pytest.approx(720 / (n * (n - 1) * (n - 2)), rel=1e-13)
    # far below float range: still finite in log space
    assert p_rand_all(n, 200, 1000) == 0.0
    assert math.isfinite(log_p_rand_all(n, 200, 1000)) and log_p_rand_all(n, 200, 1000) < -1000
    for bad in ((0, 1, 1), (10, 0, 1), (10, 11, 1), (10, 1, -1), (10, 1, 2.5)):
        with pytest.raises(ValueError):
            log_p_rand_all(*bad)


@pytest.mark.parametrize(("n", "r"), [(1, 1), (10, 3), (370, 1), (370, 6), (2479, 2), (10_000_000, 4), (50, 50)])
def test_all_curve_matches_scalar(n: int, r: int) -> None:
    k_max = min(n + 5, 400)
    curve = log_p_rand_all_curve(n, r, k_max)
    assert curve.shape == (k_max + 1,)
    for k in range(k_max + 1):
        want = log_p_rand_all(n, r, k)
        if want == -math.inf:
            assert curve[k] == -math.inf
        else:
            assert curve[k] == pytest.approx(want, rel=1e-11, abs=1e-11)


def test_bor_all_bits_and_ceiling() -> None:
    # a system that always shows both needed tools at K = 2 of 100: log2 C(100, 2) bits
    assert bor_all_max_bits(100, 2, 2) == pytest.approx(math.log2(math.comb(100, 2)), rel=1e-12)
    assert bor_all_bits(1.0, 100, 2, 2) == pytest.approx(math.log2(4950), rel=1e-12)
    assert bor_all_bits(0.5, 100, 2, 10) == pytest.approx(
        math.log2(0.5) - math.log2(float(_exact_p_rand_all(100, 2, 10))), rel=1e-12
    )
    assert bor_all_bits(0.0, 100, 2, 10) == -math.inf
    # where P_rand_all underflows a float, bits stay finite
    n = 10_000_000
    assert bor_all_bits(0.5, n, 200, 1000) == pytest.approx(-1 - log_p_rand_all(n, 200, 1000) / math.log(2))
    # R = 1: the "any" ceiling
    for nn, k in ((370, 1), (370, 7), (2479, 20)):
        assert bor_all_max_bits(nn, 1, k) == pytest.approx(bor_ceiling_bits(nn, k), rel=1e-12)
    # the ceiling peaks at K = R and reaches 0 at K = N; infinite below R
    assert bor_all_max_bits(50, 3, 2) == math.inf
    assert bor_all_max_bits(50, 3, 50) == 0.0
    ceil = [bor_all_max_bits(50, 3, k) for k in range(3, 51)]
    assert all(b <= a for a, b in pairwise(ceil))
    # needing every tool is harder by chance, so the all-ceiling is at least the any-ceiling
    assert bor_all_max_bits(370, 3, 10) > bor_max_bits(370, 3, 10)
    for bad in ((1.2, 100, 2, 5), (-0.1, 100, 2, 5), (0.5, 100, 3, 2)):
        with pytest.raises(ValueError):
            bor_all_bits(*bad)
