"""Depth policies: how many of the ranked tools to put on the shortlist.

Every policy takes the candidates' scores (descending), the registry size and a cap, and
returns a depth ``k`` with ``1 <= k <= min(max_k, n_tools, len(scores))`` (0 only when there
is nothing to show). The learned ``bor`` policy runs as ONNX through onnxruntime; this module
never imports torch. Each rule names itself (``name``); :data:`POLICIES` lists every name a
request may ask for and :func:`depth_policies` builds them by name.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from registry.errors import ArtifactError, PolicySchemaMismatch
from registry.onnx import make_session
from registry.request import FIXED_POLICY, LEARNED_POLICY
from registry.serving.features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION, depth_features
from registry.serving.needs import (
    NEEDS_FEATURE_NAMES,
    NEEDS_SCHEMA_VERSION,
    NeedsModel,
    needs_features,
)

__all__ = [
    "INPUT_NAME",
    "MANIFEST_NAME",
    "OUTPUT_NAME",
    "POLICIES",
    "WHOLE_REGISTRY_MIN",
    "DepthPolicy",
    "FixedPolicy",
    "GapPolicy",
    "OnnxDepthPolicy",
    "ThresholdPolicy",
    "TunableDepthPolicy",
    "depth_policies",
    "first_stop",
    "policy_depth_limit",
]

MANIFEST_NAME = "manifest.json"
# the feature schemas this build computes: 1 = score features, 2 = + the request's needs
FEATURE_SCHEMAS: dict[str, tuple[str, ...]] = {
    FEATURE_SCHEMA_VERSION: FEATURE_NAMES,
    NEEDS_SCHEMA_VERSION: NEEDS_FEATURE_NAMES,
}
INPUT_NAME = "features"
OUTPUT_NAME = "q_values"  # (batch, 2) = [Q_stop, Q_continue]


@runtime_checkable
class DepthPolicy(Protocol):
    """Chooses a shortlist depth from a ranked score list."""

    name: str

    def choose_depth(self, scores: np.ndarray, n_tools: int, max_k: int) -> int:
        """Depth ``k``, ``1 <= k <= min(max_k, n_tools, len(scores))`` whenever ``n_tools >= 1``."""
        ...


class TunableDepthPolicy(DepthPolicy, Protocol):
    """The learned policy: Q-values per depth, and an operating knob (``bias``, bits; 0 is the
    trained behaviour). ``needs_model`` set: feature schema 2, the request's signals are inputs."""

    @property
    def needs_model(self) -> NeedsModel | None: ...

    def q_values(
        self, scores: np.ndarray, n_tools: int, max_k: int, signals: np.ndarray | None = None
    ) -> np.ndarray:
        """``(D, 2)`` ``[Q_stop, Q_continue]`` per depth ``1..D``."""
        ...

    def choose_depth(
        self, scores: np.ndarray, n_tools: int, max_k: int, bias: float = 0.0,
        signals: np.ndarray | None = None,
    ) -> int:
        ...


class RuleSettings(Protocol):
    """What the fixed-rule policies are built from (:class:`registry.settings.ServingArgs` has it)."""

    @property
    def fixed_k(self) -> int: ...
    @property
    def threshold(self) -> float: ...


WHOLE_REGISTRY_MIN = 8  # from this registry size on, a learned policy never shows it whole


def policy_depth_limit(n_tools: int) -> int:
    """The deepest list a LEARNED policy may show on a registry of ``n_tools`` tools.

    ``n_tools // 2`` from :data:`WHOLE_REGISTRY_MIN` (8) tools on, ``n_tools`` below. Beyond
    half the registry the BoR ceiling ``log2(N / k)`` is under one bit: a random pick of the
    same length would contain a given tool at least half the time, so the list no longer
    selects anything. Only an explicit ``k`` from the caller may ask for more. On registries of
    2-7 tools half is 1-3 tools, a list callers may legitimately need whole, so no cap applies.
    Training (:func:`registry.offline.env.depth_cap`), offline evaluation and serving
    (:meth:`OnnxDepthPolicy.choose_depth`) all apply this bound, so they agree.
    """
    n = int(n_tools)
    return n // 2 if n >= WHOLE_REGISTRY_MIN else max(n, 0)


def _upper(scores: np.ndarray, n_tools: int, max_k: int) -> int:
    """The largest depth a policy may return (0: nothing can be shown)."""
    return max(0, min(int(max_k), int(n_tools), len(scores)))


class FixedPolicy:
    """Always ``k`` tools (capped): the classic top-K."""

    name = FIXED_POLICY

    @classmethod
    def from_settings(cls, settings: RuleSettings) -> FixedPolicy:
        return cls(settings.fixed_k)

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = int(k)

    def choose_depth(self, scores: np.ndarray, n_tools: int, max_k: int) -> int:
        return min(self.k, _upper(scores, n_tools, max_k))

    def __repr__(self) -> str:
        return f"FixedPolicy(k={self.k})"


class GapPolicy:
    """Cut at the largest drop between consecutive scores.

    Looks at the first ``u = min(max_k, n_tools, len(scores))`` candidates plus the next score
    (when there is one) and stops just before the largest drop ``s_i - s_{i+1}``, i.e. at depth
    ``i + 1``. Ties go to the shallowest cut; ``u <= 1`` returns ``u``.
    """

    name = "gap"

    @classmethod
    def from_settings(cls, settings: RuleSettings) -> GapPolicy:
        return cls()

    def choose_depth(self, scores: np.ndarray, n_tools: int, max_k: int) -> int:
        u = _upper(scores, n_tools, max_k)
        if u <= 1:
            return u
        s = np.asarray(scores, dtype=np.float64)[: min(u + 1, len(scores))]
        drops = s[:-1] - s[1:]
        if not np.isfinite(drops).all():
            drops = np.nan_to_num(drops, nan=-np.inf, posinf=np.inf, neginf=-np.inf)
        return int(np.argmax(drops)) + 1

    def __repr__(self) -> str:
        return "GapPolicy()"


class ThresholdPolicy:
    """Keep the tools scoring at least ``threshold`` (at least one, at most the cap)."""

    name = "threshold"

    @classmethod
    def from_settings(cls, settings: RuleSettings) -> ThresholdPolicy:
        return cls(settings.threshold)

    def __init__(self, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"threshold must be finite, got {threshold}")
        self.threshold = float(threshold)

    def choose_depth(self, scores: np.ndarray, n_tools: int, max_k: int) -> int:
        u = _upper(scores, n_tools, max_k)
        if u == 0:
            return 0
        # scores are descending, so this is the length of the prefix above the threshold
        above = int(np.count_nonzero(np.asarray(scores)[:u] >= self.threshold))
        return max(1, above)

    def __repr__(self) -> str:
        return f"ThresholdPolicy(threshold={self.threshold})"


RULES = (FixedPolicy, GapPolicy, ThresholdPolicy)  # the policies that need no artifact
POLICIES: tuple[str, ...] = (LEARNED_POLICY, *(rule.name for rule in RULES))
"""Every depth policy a request may name (the API lists them in this order)."""


def depth_policies(settings: RuleSettings, learned: TunableDepthPolicy) -> dict[str, DepthPolicy]:
    """Every policy of :data:`POLICIES` by its name: ``learned`` (the ONNX policy) and the rules
    built from ``settings``."""
    rules = {rule.name: rule.from_settings(settings) for rule in RULES}
    return {LEARNED_POLICY: learned, **rules}


def _load_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArtifactError(f"depth policy manifest {path} not found", {"path": str(path)}) from exc
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read depth policy manifest {path}: {exc}", {"path": str(path)}) from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: manifest is not a JSON object", {"path": str(path)})
    missing = [
        key
        for key in ("feature_schema_version", "feature_names", "onnx_file", "sha256")
        if key not in manifest
    ]
    if missing:
        raise ArtifactError(f"{path}: manifest lacks {missing}", {"path": str(path), "missing": missing})
    return manifest




def first_stop(q: np.ndarray, bias: float = 0.0) -> int:
    """The depth a Q-network policy shows: the first ``k`` with ``Q_stop - Q_continue >= bias``.

    ``q`` holds ``[Q_stop, Q_continue]`` per depth (row ``k-1``). With no such ``k`` the
    answer is the last depth, ``len(q)`` (0 for an empty ``q``). ``bias`` is the operating knob
    in bits of expected BoR reward: ``> 0`` asks for more evidence before stopping (longer
    lists), ``< 0`` for less (shorter). For one query the depth never decreases as ``bias``
    grows: the set of depths allowed to stop only shrinks.
    """
    if q.shape[0] == 0:
        return 0
    stop = np.flatnonzero(q[:, 0] - q[:, 1] >= bias)
    return int(stop[0]) + 1 if stop.size else int(q.shape[0])


class OnnxDepthPolicy:
    """The learned BoR depth policy, served from an ONNX Q-network.

    The network maps :func:`depth_features` rows to ``[Q_stop, Q_continue]``. One
    ``session.run`` scores all ``D`` states of a request; the depth is the first ``k`` whose
    ``Q_stop - Q_continue >= bias`` (``bias`` 0 by default; see :func:`first_stop`), else
    ``D``. ``D`` is also capped by the ``max_depth`` the policy was trained with (deeper
    states were never seen in training) and by :func:`policy_depth_limit` (never the whole
    registry of 8+ tools, whatever the ``bias``).

    Build with :meth:`from_dir`, which refuses artifacts built for another feature schema
    (:class:`PolicySchemaMismatch`) and files whose sha256 differs from the manifest
    (:class:`ArtifactError`).
    """

    def __init__(
        self, session: Any, manifest: dict[str, Any], name: str = LEARNED_POLICY, needs_model: NeedsModel | None = None
    ) -> None:
        self._session = session
        self.manifest = manifest
        self.name = name
        self.needs_model = needs_model  # set: schema 2, the request's signals are inputs
        self.max_depth = int(manifest.get("max_depth") or 10**9)
        # False only to replay a policy as served before the whole-registry guarantee (benchmarks)
        self.limit_depth = True

    @classmethod
    def from_dir(cls, path: Path | str, *, threads: int = 1) -> OnnxDepthPolicy:
        """Load ``<path>/manifest.json`` and the ONNX file it names.

        Args:
            path: artifact directory.
            threads: onnxruntime intra-op threads (one request is ~1 µs of maths; keep 1).

        Raises:
            PolicySchemaMismatch: the manifest's feature schema differs from this code's.
            ArtifactError: files missing or unreadable, sha256 mismatch, unexpected graph.
        """
        directory = Path(path)
        manifest = _load_manifest(directory)
        version = str(manifest["feature_schema_version"])
        if version not in FEATURE_SCHEMAS:
            raise PolicySchemaMismatch(
                f"depth policy in {directory} was trained on feature schema {version!r}, "
                f"this build computes schemas {sorted(FEATURE_SCHEMAS)}; retrain or re-export it",
                {"artifact": version, "expected": sorted(FEATURE_SCHEMAS), "path": str(directory)},
            )
        names = FEATURE_SCHEMAS[version]
        if tuple(manifest["feature_names"]) != names:
            raise PolicySchemaMismatch(
                f"depth policy in {directory} lists other feature names than schema {version!r} defines",
                {"artifact": manifest["feature_names"], "expected": list(names)},
            )
        needs_model = None
        if version == NEEDS_SCHEMA_VERSION:
            try:
                needs_model = NeedsModel.from_json(manifest.get("needs_model"))
            except ValueError as exc:
                raise ArtifactError(
                    f"{directory / MANIFEST_NAME}: {exc}", {"path": str(directory / MANIFEST_NAME)}
                ) from exc
        onnx_path = directory / str(manifest["onnx_file"])
        if onnx_path.resolve().parent != directory.resolve():
            raise ArtifactError(f"onnx_file {manifest['onnx_file']!r} must lie inside {directory}")
        try:
            blob = onnx_path.read_bytes()
        except OSError as exc:
            raise ArtifactError(f"cannot read {onnx_path}: {exc}", {"path": str(onnx_path)}) from exc
        digest = hashlib.sha256(blob).hexdigest()
        if digest != str(manifest["sha256"]).lower():
            raise ArtifactError(
                f"{onnx_path} sha256 {digest} does not match the manifest's {manifest['sha256']}",
                {"path": str(onnx_path), "expected": manifest["sha256"], "actual": digest},
            )
        session = _make_session(blob, threads, onnx_path, len(names))
        return cls(session, manifest, name=str(manifest.get("name", LEARNED_POLICY)), needs_model=needs_model)

    def q_values(
        self, scores: np.ndarray, n_tools: int, max_k: int, signals: np.ndarray | None = None
    ) -> np.ndarray:
        """``(D, 2)`` float32 ``[Q_stop, Q_continue]`` per depth (``D = 0``: empty).

        ``signals``: the request's :func:`registry.serving.needs.request_signals`, read by a
        schema-2 policy (``None``: a one-intent request), ignored by a schema-1 one.
        """
        d = min(_upper(scores, n_tools, max_k), self.max_depth)
        if self.limit_depth:
            d = min(d, policy_depth_limit(n_tools))
        if d == 0:
            return np.zeros((0, 2), dtype=np.float32)
        if self.needs_model is None:
            feats = depth_features(np.asarray(scores), n_tools, d)
        else:
            feats = needs_features(np.asarray(scores), n_tools, d, signals, self.needs_model)
        (q,) = self._session.run([OUTPUT_NAME], {INPUT_NAME: feats})
        return np.asarray(q)

    def choose_depth(
        self, scores: np.ndarray, n_tools: int, max_k: int, bias: float = 0.0,
        signals: np.ndarray | None = None,
    ) -> int:
        return first_stop(self.q_values(scores, n_tools, max_k, signals), bias)

    def __repr__(self) -> str:
        return f"OnnxDepthPolicy(name={self.name!r}, sha256={str(self.manifest.get('sha256'))[:12]})"


def _make_session(blob: bytes, threads: int, origin: Path, n_features: int = len(FEATURE_NAMES)) -> Any:
    session = make_session(blob, threads=threads, origin=origin)
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise ArtifactError(
            f"{origin}: graph must have input {INPUT_NAME!r} and output {OUTPUT_NAME!r}, "
            f"has {sorted(inputs)} -> {sorted(outputs)}",
            {"path": str(origin)},
        )
    shape = inputs[INPUT_NAME].shape
    if len(shape) != 2 or (isinstance(shape[1], int) and shape[1] != n_features):
        raise ArtifactError(
            f"{origin}: input {INPUT_NAME!r} has shape {shape}, expected (batch, {n_features})",
            {"path": str(origin)},
        )
    return session
