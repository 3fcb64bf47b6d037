"""How much one feedback event counts: the single rule the usage memory, the usage profiles and
the refit (its fit and its held-out estimate) all apply, so an attacker's influence is bounded
the same way everywhere (issue 23 item 2).

Per registry, events replayed in order (``received`` times, so every replica and every refit
weighs the same log the same way)::

    rate      a caller's events beyond ``per_minute`` in one minute (by ``received``) do not
              count ("rate_limited"): influence per unit of time is bounded
    decay     the j-th event (0-based) a caller reports for one tool weighs 1 / (1 + j / half_life):
              repeating a claim adds only logarithmically (10 events weigh 5.39, 30 weigh 9.02 at 4)
    share     once two or more callers have counted evidence and the registry holds at least
              ``min_events`` of it, a caller's event counts only up to the weight that brings
              it to ``caller_share`` of the total, and at least ``over_share_weight`` (0.05) of
              its decayed weight: a caller sending a share p of the events settles at
              max(caller_share, p e / (p e + 1 - p)) of the evidence (e = 0.05: 20% for any
              p up to 0.83), never at 0

Nothing here locks learning after N events: with one shared token (every agent one caller)
legitimate traffic spreads over many tools and keeps counting, and 30 correcting events
outweigh 10 wrong ones. A caller is the token's hash, or with an ``X-Caller-Id`` header
``<token hash>.<id hash>`` (service.auth.caller_hash): the rate and the share count per token
(:func:`principal`), so one token rotating ids gets no more than one token; the decay counts
per id, so agents sharing a token do not dampen each other's claims. Without tokens, callers
are self-declared (see docs/security.md, "Poisoned feedback").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from registry.settings import LearningArgs

__all__ = ["EvidenceConfig", "EvidenceCounter", "decay_weight", "evidence_config", "principal"]

_MAX_PAIRS = 200_000
_MAX_CALLERS = 10_000


@dataclass(frozen=True, slots=True)
class EvidenceConfig:
    """Knobs of the evidence rule (``SHORTLIST_LEARNING_*`` settings)."""

    half_life: float = 4.0
    per_minute: int = 600
    caller_share: float = 0.2
    min_events: float = 20.0
    over_share_weight: float = 0.05  # what an event of a caller at its share still weighs


def evidence_config(learning: LearningArgs) -> EvidenceConfig:
    """The rule's knobs from the learning group (the usage memory, the profiles and the refit)."""
    return EvidenceConfig(
        half_life=learning.learning_half_life,
        per_minute=learning.learning_caller_events_per_minute,
        caller_share=learning.learning_caller_share,
    )


def principal(caller: str | None) -> str:
    """Who the rate and share limits count: the token part of a caller (``""``: anonymous)."""
    return (caller or "").split(".", 1)[0]


def decay_weight(prior: int, half_life: float) -> float:
    """Weight of a caller's event for a tool after ``prior`` earlier ones for that tool."""
    return 1.0 / (1.0 + max(prior, 0) / half_life)


@dataclass
class EvidenceCounter:
    """The rule's running state for one registry (bounded; see :meth:`to_json`)."""

    config: EvidenceConfig = field(default_factory=EvidenceConfig)
    pairs: OrderedDict[str, int] = field(default_factory=OrderedDict)  # "caller\0tool" -> events
    weight: dict[str, float] = field(default_factory=dict)  # principal ("" anonymous) -> counted weight
    window: dict[str, tuple[int, int]] = field(default_factory=dict)  # principal -> (minute, events)
    total: float = 0.0

    def check(self, caller: str | None, received: float) -> str | None:
        """Why an event of ``caller`` at ``received`` would not count (``"rate_limited"``), or None."""
        key = principal(caller)
        minute = int(received // 60)
        at, n = self.window.get(key, (minute, 0))
        if at == minute and n >= self.config.per_minute:
            return "rate_limited"
        return None

    def weigh(self, caller: str | None, tools: Iterable[str], received: float) -> dict[str, float]:
        """Count an event (call :meth:`check` first): the weight of each of ``tools``."""
        cfg = self.config
        key = principal(caller)
        minute = int(received // 60)
        at, n = self.window.get(key, (minute, 0))
        self.window[key] = (minute, n + 1 if at == minute else 1)
        own = self.weight.get(key, 0.0)
        out: dict[str, float] = {}
        for tool in dict.fromkeys(tools):
            pair = f"{caller or ''}\0{tool}"  # the decay: per id under the token
            prior = self.pairs.pop(pair, 0)
            self.pairs[pair] = prior + 1  # most recent last: the oldest pairs are forgotten first
            out[tool] = decay_weight(prior, cfg.half_life)
        spent = max(out.values(), default=0.0)
        factor = self._share_factor(own, spent)
        if factor < 1.0:
            out = {tool: factor * w for tool, w in out.items()}
            spent *= factor
        self.weight[key] = own + spent
        self.total += spent
        self._bound()
        return out

    def _share_factor(self, own: float, spent: float) -> float:
        """How much of ``spent`` a caller holding ``own`` may add under the share rule."""
        cfg = self.config
        if len(self.weight) < 2 or self.total < cfg.min_events or cfg.caller_share >= 1.0 or spent <= 0:
            return 1.0
        # own + x <= share * (total + x): the most that keeps the caller within its share
        headroom = (cfg.caller_share * self.total - own) / (1.0 - cfg.caller_share)
        if headroom >= spent:
            return 1.0
        return max(headroom, cfg.over_share_weight * spent) / spent

    def _bound(self) -> None:
        while len(self.pairs) > _MAX_PAIRS:
            self.pairs.popitem(last=False)
        if len(self.weight) > _MAX_CALLERS:  # forget the lightest callers (their share is small)
            for key in sorted(self.weight, key=self.weight.__getitem__)[: len(self.weight) - _MAX_CALLERS]:
                self.total -= self.weight.pop(key)
                self.window.pop(key, None)

    def to_json(self) -> dict[str, Any]:
        return {"pairs": list(self.pairs.items()), "weight": self.weight,
                "window": {k: list(v) for k, v in self.window.items()}, "total": self.total}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None, config: EvidenceConfig) -> EvidenceCounter:
        if not raw:
            return cls(config)
        return cls(
            config,
            OrderedDict((str(k), int(v)) for k, v in raw.get("pairs", [])),
            {str(k): float(v) for k, v in raw.get("weight", {}).items()},
            {str(k): (int(v[0]), int(v[1])) for k, v in raw.get("window", {}).items()},
            float(raw.get("total", 0.0)),
        )
