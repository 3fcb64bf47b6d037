"""Per-registry depth policies: versioned stop rules over the shared learned network.

A registry's policy is the default ONNX Q-network plus a :class:`StopRule`: the network's
``Q_stop - Q_continue`` margin is compared with ``request bias + bias_offset`` and the depth is
at most ``max_depth``. The default rule (version ``"default"``) changes nothing. A refit
(:mod:`registry.learning.refit`) proposes a new rule; the :class:`PolicyHistory` of a registry
keeps every version and which one is active, in a :class:`PolicyStore` (a directory locally,
keys in Redis across replicas). Every replica holds the active rules in a :class:`PolicyBook`,
read on the query path without a lock and reloaded when the store says something changed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from registry.errors import NotFound, StoreUnavailable, ValidationFailed
from registry.fsio import atomic_write_bytes, storage_errors
from registry.names import validate_registry_name
from registry.serving.depth_policies import first_stop

__all__ = [
    "DEFAULT_VERSION",
    "LocalPolicyStore",
    "PolicyBook",
    "PolicyHistory",
    "PolicyStore",
    "RedisPolicyStore",
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


class PolicyStore(Protocol):
    """Where policy histories live; ``epoch`` changes whenever one is written or deleted."""

    def load(self, registry: str) -> PolicyHistory: ...

    def save(self, history: PolicyHistory) -> None: ...

    def delete(self, registry: str) -> None: ...

    def registries(self) -> list[str]: ...

    def epoch(self) -> str: ...

    def lost(self) -> bool:
        """Whether the store lost its data (a shared store wiped; never a local one)."""
        ...

    def restore(self, histories: list[PolicyHistory]) -> int:
        """Write back the ``histories`` a wiped store lost, each only if absent; how many."""
        ...


class LocalPolicyStore:
    """One JSON file per registry under ``<data_dir>/policies/`` (atomic replace)."""

    def __init__(self, data_dir: Path | str) -> None:
        self.root = Path(data_dir) / "policies"
        self._lock = threading.Lock()
        self._epoch = 0

    def _path(self, registry: str) -> Path:
        return self.root / f"{validate_registry_name(registry)}.json"

    def load(self, registry: str) -> PolicyHistory:
        try:
            return PolicyHistory.from_json(json.loads(self._path(registry).read_text("utf-8")))
        except FileNotFoundError:
            return PolicyHistory(registry)

    def save(self, history: PolicyHistory) -> None:
        path = self._path(history.registry)
        raw = json.dumps(history.to_json(), separators=(",", ":")).encode("utf-8")
        with self._lock, storage_errors("saving a registry's depth policies"):
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, raw)  # whole or absent; no temporary left on failure
            self._epoch += 1

    def delete(self, registry: str) -> None:
        with self._lock, storage_errors("deleting a registry's depth policies"):
            self._path(registry).unlink(missing_ok=True)
            self._epoch += 1

    def registries(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json"))

    def epoch(self) -> str:
        return str(self._epoch)

    def lost(self) -> bool:
        return False  # files are not wiped behind this process's back

    def restore(self, histories: list[PolicyHistory]) -> int:
        return 0


class _Guarded:
    """A Redis client whose errors surface as :class:`StoreUnavailable` (a 503, not a 500)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)  # a proxy: every client method, wrapped
        if not callable(attr) or name == "pipeline":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if type(exc).__module__.startswith("redis"):
                    raise StoreUnavailable(f"policy store unavailable: {exc}") from exc
                raise

        return call


class RedisPolicyStore:
    """``<prefix>policies:<registry>`` (JSON) and a ``<prefix>policies-epoch`` counter every
    replica polls (one GET per sync interval) to hot-swap the active rules."""

    def __init__(self, client: Any, prefix: str) -> None:
        self._client = _Guarded(client)
        self._key = f"{prefix}policies:"
        self._epoch_key = f"{prefix}policies-epoch"

    def load(self, registry: str) -> PolicyHistory:
        raw = self._client.get(self._key + registry)
        return PolicyHistory(registry) if raw is None else PolicyHistory.from_json(json.loads(raw))

    def save(self, history: PolicyHistory) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self._key + history.registry, json.dumps(history.to_json(), separators=(",", ":")))
        pipe.incr(self._epoch_key)
        pipe.execute()

    def delete(self, registry: str) -> None:
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self._key + registry)
        pipe.incr(self._epoch_key)
        pipe.execute()

    def registries(self) -> list[str]:
        names = (k.decode() if isinstance(k, bytes) else str(k) for k in self._client.scan_iter(self._key + "*"))
        return sorted(n[len(self._key) :] for n in names)

    def epoch(self) -> str:
        raw = self._client.get(self._epoch_key)
        return "0" if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))

    def lost(self) -> bool:
        """Whether the store lost its data (its epoch counter, set by every save, is gone)."""
        return not self._client.exists(self._epoch_key)

    def restore(self, histories: list[PolicyHistory]) -> int:
        """Write back histories the store lost, each only if absent (the first replica to
        write one back wins); returns how many this call wrote."""
        written = 0
        for history in histories:
            raw = json.dumps(history.to_json(), separators=(",", ":"))
            written += bool(self._client.set(self._key + history.registry, raw, nx=True))
        self._client.incr(self._epoch_key)
        return written


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
            histories = {registry: store.load(registry) for registry in store.registries()}
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
        written = store.restore(list(self._histories.values()))
        if written:
            log.warning("wrote %d depth-policy histories back to the shared store", written)
        return written

    def history(self, registry: str) -> PolicyHistory:
        return self.store.load(registry) if self.store is not None else PolicyHistory(registry)

    def add(self, rule: StopRule, registry: str, *, activate: bool) -> PolicyHistory:
        """Store ``rule`` as a new version of ``registry``'s policy (activating it or not)."""
        store = self._require_store()
        with self._lock:
            history = store.load(registry)
            rule = replace(rule, version=history.next_version(), created=rule.created or time.time())
            history = history.with_rule(rule, activate=activate)
            store.save(history)
        self.refresh(force=True)
        return history

    def activate(self, registry: str, version: str) -> PolicyHistory:
        """Make ``version`` (``"default"`` included) the active one: a rollback or a roll-forward."""
        store = self._require_store()
        with self._lock:
            history = store.load(registry).activated(version)
            store.save(history)
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
