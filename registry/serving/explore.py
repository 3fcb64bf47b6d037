"""Exploration: a share of adaptive shortlists is served a little deeper than the policy chose.

With probability ``share`` a request's depth ``d`` becomes ``min(d + e, limit)`` with ``e`` drawn
uniformly from ``1..MAX_EXTRA``; the probability of the depth actually shown (its
*propensity*) is logged with the shortlist, so feedback tells where in the ranking a used
tool sat past the policy's cut, and an off-policy estimate can weight it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from registry.serving.stop_rules import DEFAULT_RULE, StopRule

__all__ = ["MAX_EXTRA", "DepthTrace", "Explorer", "propensity"]

MAX_EXTRA = 3  # exploration adds 1..MAX_EXTRA tools, uniformly


def propensity(chosen: int, shown: int, limit: int, share: float) -> float:
    """P(depth ``shown`` | the policy chose ``chosen``) under exploration ``share``."""
    if limit <= chosen:  # nothing deeper can be shown: the depth is certain
        return 1.0 if shown == chosen else 0.0
    hits = sum(1 for e in range(1, MAX_EXTRA + 1) if min(chosen + e, limit) == shown)
    return (1.0 - share) * (shown == chosen) + share * hits / MAX_EXTRA


class Explorer:
    """Draws the served depth. ``share`` 0 never explores; ``rng`` is injectable for tests."""

    def __init__(self, share: float, rng: random.Random | None = None) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"explore share must be in [0, 1], got {share}")
        self.share = float(share)
        self._rng = rng or random.Random()

    def draw(self, chosen: int, limit: int) -> tuple[int, float]:
        """``(depth shown, its propensity)`` for a policy depth ``chosen``, at most ``limit``."""
        shown = chosen
        if self.share > 0.0 and limit > chosen and self._rng.random() < self.share:
            shown = min(chosen + self._rng.randint(1, MAX_EXTRA), limit)
        return shown, propensity(chosen, shown, limit, self.share)


@dataclass(slots=True)
class DepthTrace:
    """How one adaptive request's depth was chosen (filled on the query path, then logged).

    Attributes:
        rule: the registry's active stop rule (its version names the policy that served).
        chosen: the depth the policy chose for the request's own ranking.
        shown: the depth served for it (``chosen`` unless exploration went deeper).
        propensity: probability of ``shown`` under the serving policy, exploration included.
        margins: the learned policy's ``Q_stop - Q_continue`` per depth on that ranking.
        scores: that ranking's top scores (the policy's feature window).
        done: the request's own ranking was handled (intents' rankings are not traced).
        explore: exploration may deepen it (off for a request answered inside a batch, whose
            feedback cannot say which request's depth it judges).
    """

    rule: StopRule = DEFAULT_RULE
    chosen: int = 0
    shown: int = 0
    propensity: float = 1.0
    margins: tuple[float, ...] = field(default=())
    scores: tuple[float, ...] = field(default=())
    done: bool = False
    explore: bool = True
