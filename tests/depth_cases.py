"""Synthetic score lists shared by the depth-policy tests."""

from __future__ import annotations

import numpy as np


def descending(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 scores, best first."""
    return np.sort(np.asarray(x, dtype=np.float32))[::-1].copy()


def random_cases(n: int = 300) -> list[tuple[np.ndarray, int, int]]:
    """``(scores, n_tools, max_k)`` of every shape the policies must bound: short and long lists,
    registries as long as the list, flat lists (seeded)."""
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(n):
        length = int(rng.integers(1, 70))
        n_tools = int(rng.integers(length, length + 500))
        if rng.random() < 0.2:
            n_tools = length
        max_k = int(rng.integers(1, 60))
        scores = descending(rng.normal(0.4, 0.2, length))
        if rng.random() < 0.1:
            scores[:] = scores[0]
        cases.append((scores, n_tools, max_k))
    return cases
