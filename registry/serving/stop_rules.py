"""Per-registry depth policies: versioned stop rules over the shared learned network.

A registry's policy is the default ONNX Q-network plus a :class:`StopRule`: the network's
``Q_stop - Q_continue`` margin is compared with ``request bias + bias_offset`` and the depth is
at most ``max_depth``. The default rule (version ``"default"``) changes nothing. A refit
(:mod:`registry.learning.refit`) proposes a new rule; the :class:`PolicyHistory` of a registry
keeps every version and which one is active, in a :class:`registry.store.policies.PolicyStore`
(a directory locally, keys in Redis across replicas). Every replica holds the active rules in a :class:`PolicyBook`,
read on the query path without a lock and reloaded when the store says something changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from registry.errors import NotFound, ValidationFailed
from registry.serving.depth_policies import first_stop
from registry.store.policies import PolicyStore

__all__ = [
    "DEFAULT_VERSION",
    "PolicyBook",
    "PolicyHistory",
    "StopRule",
]

log = logging.getLogger(__name__)

DEFAULT_VERSION = "default"


@dataclass(frozen=True, slots=True)
class StopRule:
    """One version of a registry's depth policy.

    Two kinds. A *bias* rule stops where the network's ``Q_stop - Q_continue`` reaches the
    request's ``depth_bias + bias_offset``. A *calibrated* rule (``weights`` set) stops at the
    first depth whose estimated miss probability ``P(used tool ranked deeper)`` -- a logistic
    model on the policy's features and margin, fitted on the registry's feedback -- is at most
    ``threshold * 2**-depth_bias`` (a positive bias still asks for longer lists).

    Attributes:
        version: ``"default"`` or ``"refit-<n>"``.
        bias_offset: bits added to the request's ``depth_bias`` (``> 0``: longer lists).
        max_depth: deepest list the rule shows (``None``: the request's cap).
        weights: calibrated rule: intercept then one weight per standardised input.
        center, scale: the inputs' standardisation (features, then the margin).
        threshold: calibrated rule: the miss probability it stops at.
        feature_schema: calibrated rule: the depth policy's feature schema its inputs follow
            (``"1"`` score features, ``"2"`` plus the request's needs); a policy of another
            schema serves the network's own stop instead (:meth:`reads`).
        created: wall-clock seconds it was made.
        parent: the version it was refit from.
        estimate: the refit's off-policy evaluation (found rate, mean K, CI...).
    """

    version: str = DEFAULT_VERSION
    bias_offset: float = 0.0
    max_depth: int | None = None
    created: float = 0.0
    parent: str | None = None
    estimate: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    weights: tuple[float, ...] = ()
    center: tuple[float, ...] = ()
    scale: tuple[float, ...] = ()
    threshold: float = 0.0
    feature_schema: str = "1"

    @property
    def kind(self) -> str:
        return "calibrated" if self.weights else "bias"

    def reads(self, schema: str) -> bool:
        """Whether this rule can run on a policy of feature ``schema`` (a bias rule always can)."""
        return not self.weights or self.feature_schema == schema

    def miss_probability(self, features: np.ndarray, margins: np.ndarray) -> np.ndarray:
        """Calibrated rule: ``P(the used tool is ranked past depth k)`` per row ``k - 1``."""
        x = np.column_stack([np.asarray(features, np.float64), np.asarray(margins, np.float64)])
        z = (x - np.asarray(self.center)) / np.asarray(self.scale)
        w = np.asarray(self.weights)
        return 1.0 / (1.0 + np.exp(-np.clip(z @ w[1:] + w[0], -30, 30)))

    def depth(self, q: np.ndarray, features: Callable[[], np.ndarray], bias: float = 0.0) -> int:
        """The depth this rule shows given the network's ``(D, 2)`` Q-values (already cut to the
        deepest allowed list) and, for a calibrated rule, the policy's feature rows."""
        if q.shape[0] == 0:
            return 0
        if not self.weights:
            return first_stop(q, bias + self.bias_offset)
        p = self.miss_probability(features(), q[:, 0] - q[:, 1])
        stop = np.flatnonzero(p <= self.threshold * 2.0 ** (-bias))
        return int(stop[0]) + 1 if stop.size else int(q.shape[0])

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": self.kind,
            "bias_offset": self.bias_offset,
            "max_depth": self.max_depth,
            "created": self.created,
            "parent": self.parent,
            "estimate": self.estimate,
            "weights": list(self.weights),
            "center": list(self.center),
            "scale": list(self.scale),
            "threshold": self.threshold,
            "feature_schema": self.feature_schema,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StopRule:
        max_depth = d.get("max_depth")
        return cls(
            version=str(d["version"]),
            bias_offset=float(d.get("bias_offset", 0.0)),
            max_depth=None if max_depth is None else int(max_depth),
            created=float(d.get("created", 0.0)),
            parent=None if d.get("parent") is None else str(d["parent"]),
            estimate=dict(d.get("estimate") or {}),
            weights=tuple(float(v) for v in d.get("weights") or ()),
            center=tuple(float(v) for v in d.get("center") or ()),
            scale=tuple(float(v) for v in d.get("scale") or ()),
            threshold=float(d.get("threshold", 0.0)),
            feature_schema=str(d.get("feature_schema") or "1"),
        )


DEFAULT_RULE = StopRule()


@dataclass(frozen=True, slots=True)
class PolicyHistory:
    """Every version of one registry's policy and the active one (``default`` is implicit)."""

    registry: str
    active: str = DEFAULT_VERSION
    versions: tuple[StopRule, ...] = ()

    def rule(self, version: str) -> StopRule:
        """The rule ``version`` (raises :class:`NotFound`)."""
        if version == DEFAULT_VERSION:
            return DEFAULT_RULE
        for rule in self.versions:
            if rule.version == version:
                return rule
        raise NotFound(
            f"registry {self.registry!r} has no policy version {version!r}",
            {"registry": self.registry, "version": version},
        )

    @property
    def active_rule(self) -> StopRule:
        try:
            return self.rule(self.active)
        except NotFound:
            return DEFAULT_RULE

    def next_version(self) -> str:
        numbers = [int(v.version.split("-", 1)[1]) for v in self.versions if v.version.startswith("refit-")]
        return f"refit-{max(numbers, default=0) + 1}"

    def with_rule(self, rule: StopRule, *, activate: bool, keep: int = 20) -> PolicyHistory:
        """This history plus ``rule`` (the oldest inactive versions beyond ``keep`` dropped)."""
        versions = [*self.versions, rule]
        active = rule.version if activate else self.active
        while len(versions) > keep:
            drop = next((v for v in versions if v.version != active), None)
            if drop is None:
                break
            versions.remove(drop)
        return replace(self, active=active, versions=tuple(versions))

    def activated(self, version: str) -> PolicyHistory:
        self.rule(version)  # raises NotFound
        return replace(self, active=version)

    def to_json(self) -> dict[str, Any]:
        return {
            "registry": self.registry,
            "active": self.active,
            "versions": [v.to_json() for v in self.versions],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PolicyHistory:
        return cls(
            registry=str(d["registry"]),
            active=str(d.get("active") or DEFAULT_VERSION),
            versions=tuple(StopRule.from_json(v) for v in d.get("versions") or ()),
        )


class PolicyBook:
    """The active rule of every registry, as served by this replica.

    Reads (:meth:`active`) take no lock: the mapping is replaced whole. :meth:`refresh` reloads
    from the store when its epoch moved (called on every sync tick and after local writes).
    """

    def __init__(self, store: PolicyStore | None = None) -> None:
        self.store = store
        self._rules: dict[str, StopRule] = {}
        self._histories: dict[str, PolicyHistory] = {}  # what a store that lost its data gets back
        self._epoch: str | None = None
        self._lock = threading.Lock()

    def active(self, registry: str) -> StopRule:
        return self._rules.get(registry, DEFAULT_RULE)

    def refresh(self, *, force: bool = False) -> bool:
        """Reload the active rules when the store's epoch changed. Returns whether it did."""
        store = self.store
        if store is None:
            return False
        with self._lock:
            epoch = store.epoch()
            if epoch == self._epoch and not force:
                return False
            histories = {registry: self._load(store, registry) for registry in store.registries()}
            if not histories and self._histories and store.lost():
                # the shared store lost its data: keep serving, and write back what is held
                self.write_back()
                return False
            rules = {}
            for registry, history in histories.items():
                rule = history.active_rule
                if rule.version != DEFAULT_VERSION:
                    rules[registry] = rule
            self._rules = rules
            self._histories = histories
            self._epoch = epoch
            return True

    def write_back(self) -> int:
        """After the shared store lost its data: write back every history this replica holds
        (absent ones only); returns how many it wrote."""
        store = self.store
        if store is None or not self._histories:
            return 0
        written = store.restore({name: history.to_json() for name, history in self._histories.items()})
        if written:
            log.warning("wrote %d depth-policy histories back to the shared store", written)
        return written

    def history(self, registry: str) -> PolicyHistory:
        return self._load(self.store, registry) if self.store is not None else PolicyHistory(registry)

    @staticmethod
    def _load(store: PolicyStore, registry: str) -> PolicyHistory:
        doc = store.load(registry)
        return PolicyHistory(registry) if doc is None else PolicyHistory.from_json(doc)

    def add(self, rule: StopRule, registry: str, *, activate: bool) -> PolicyHistory:
        """Store ``rule`` as a new version of ``registry``'s policy (activating it or not)."""
        store = self._require_store()
        with self._lock:
            history = self._load(store, registry)
            rule = replace(rule, version=history.next_version(), created=rule.created or time.time())
            history = history.with_rule(rule, activate=activate)
            store.save(registry, history.to_json())
        self.refresh(force=True)
        return history

    def activate(self, registry: str, version: str) -> PolicyHistory:
        """Make ``version`` (``"default"`` included) the active one: a rollback or a roll-forward."""
        store = self._require_store()
        with self._lock:
            history = self._load(store, registry).activated(version)
            store.save(registry, history.to_json())
        self.refresh(force=True)
        return history

    def forget(self, registry: str) -> None:
        """Drop every version of ``registry``'s policy (the registry was deleted or wiped)."""
        if self.store is not None:
            self.store.delete(registry)
        self.refresh(force=True)

    def _require_store(self) -> PolicyStore:
        if self.store is None:
            raise ValidationFailed("no policy store configured", [])
        return self.store
