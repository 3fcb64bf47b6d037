"""The depth policy's networks (torch): a Q-network, an ensemble, a size-gated pair, the trained policy.

Shared by training (:mod:`registry.offline.train`) and export (:mod:`registry.offline.export`),
so neither imports the other at module level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from registry.serving.depth_policies import first_stop, policy_depth_limit
from registry.serving.features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION, depth_features
from registry.serving.needs import NeedsModel, needs_features

__all__ = ["INPUT_CLIP", "QEnsemble", "QNetwork", "SizeGatedQ", "TrainedPolicy"]

INPUT_CLIP = 10.0


def _buffer(module: nn.Module, name: str) -> torch.Tensor:
    """A tensor attribute (buffer or property) of a sub-network, typed."""
    value = getattr(module, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.{name} is not a tensor")
    return value


class QNetwork(nn.Module):
    """``raw features (B, F) -> [Q_stop, Q_continue] (B, 2)``, standardisation included."""

    mean: torch.Tensor  # buffers (registered in __init__)
    inv_std: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        n_features: int,
        hidden: Sequence[int] = (64, 64),
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        big = float(np.finfo(np.float32).max)
        mean_t = torch.zeros(n_features) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
        std_t = torch.ones(n_features) if std is None else torch.as_tensor(std, dtype=torch.float32)
        low_t = torch.full((n_features,), -big) if low is None else torch.as_tensor(low, dtype=torch.float32)
        high_t = torch.full((n_features,), big) if high is None else torch.as_tensor(high, dtype=torch.float32)
        if bool((low_t > high_t).any()):
            raise ValueError("feature range: low > high")
        self.register_buffer("mean", mean_t.clone())
        self.register_buffer("inv_std", 1.0 / std_t.clone())
        self.register_buffer("low", low_t.clone())  # the range each feature spanned in training
        self.register_buffer("high", high_t.clone())
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 2))
        self.mlp = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = torch.minimum(torch.maximum(features, self.low), self.high)
        z = torch.clamp((x - self.mean) * self.inv_std, -INPUT_CLIP, INPUT_CLIP)
        return self.mlp(z)


class QEnsemble(nn.Module):
    """The mean Q-value of several :class:`QNetwork` members (seeds): one ONNX graph, less variance."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    @property
    def mean(self) -> torch.Tensor:  # the input statistics (shared by all members)
        return _buffer(self.members[0], "mean")

    @property
    def inv_std(self) -> torch.Tensor:
        return _buffer(self.members[0], "inv_std")

    @property
    def low(self) -> torch.Tensor:
        return _buffer(self.members[0], "low")

    @property
    def high(self) -> torch.Tensor:
        return _buffer(self.members[0], "high")

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(features) for m in self.members]).mean(dim=0)


class SizeGatedQ(nn.Module):
    """Two Q-networks gated on the registry size, read from the raw ``log2_n`` feature.

    ``Q = w * small(x) + (1 - w) * large(x)``, ``w = 1`` up to ``n_lo`` tools, ``w = 0`` from
    ``n_hi`` tools on, linear in ``log2 N`` between. ``shortlist train --size-gate`` trains the
    large expert on the full registries alone with the plain reward (the previous recipe, so
    registries of ``n_hi``+ tools keep exactly its behaviour) and the small expert with carved
    sub-registries (:mod:`registry.offline.carve`). One network fitted to both regimes lost up to
    0.27 of depth efficiency on the unseen BFCL-live registry (docs/results/registry-size.md).
    """

    log2_lo: torch.Tensor  # buffers (registered in __init__)
    log2_hi: torch.Tensor

    def __init__(self, small: nn.Module, large: nn.Module, n_lo: int, n_hi: int) -> None:
        super().__init__()
        if not 1 <= n_lo < n_hi:
            raise ValueError(f"size gate needs 1 <= n_lo < n_hi, got {n_lo}, {n_hi}")
        self.small = small
        self.large = large
        self.n_lo, self.n_hi = int(n_lo), int(n_hi)
        self.register_buffer("log2_lo", torch.tensor(math.log2(n_lo), dtype=torch.float32))
        self.register_buffer("log2_hi", torch.tensor(math.log2(n_hi), dtype=torch.float32))
        self.col = FEATURE_NAMES.index("log2_n")

    @property
    def mean(self) -> torch.Tensor:  # the small expert's input statistics (it saw every size)
        return _buffer(self.small, "mean")

    @property
    def inv_std(self) -> torch.Tensor:
        return _buffer(self.small, "inv_std")

    @property
    def low(self) -> torch.Tensor:
        return torch.minimum(_buffer(self.small, "low"), _buffer(self.large, "low"))

    @property
    def high(self) -> torch.Tensor:
        return torch.maximum(_buffer(self.small, "high"), _buffer(self.large, "high"))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features[:, self.col : self.col + 1]
        w = torch.clamp((self.log2_hi - x) / (self.log2_hi - self.log2_lo), 0.0, 1.0)
        return w * self.small(features) + (1.0 - w) * self.large(features)


@dataclass
class TrainedPolicy:
    """A trained Q-network plus everything needed to export and describe it.

    ``choose_depth`` applies the same rule as the served
    :class:`~registry.serving.depth_policies.OnnxDepthPolicy`: first ``k`` with
    ``Q_stop - Q_continue >= bias`` (:func:`~registry.serving.depth_policies.first_stop`), else the cap.
    """

    network: QNetwork | QEnsemble | SizeGatedQ
    config: dict[str, Any]
    feature_names: tuple[str, ...] = FEATURE_NAMES
    feature_schema_version: str = FEATURE_SCHEMA_VERSION
    history: list[dict[str, float]] = field(default_factory=list)
    name: str = "bor"
    needs_model: NeedsModel | None = None  # set: feature schema 2 (registry.serving.needs)

    @property
    def max_depth(self) -> int:
        return int(self.config["max_depth"])

    def q_values(self, features: np.ndarray) -> np.ndarray:
        """``(B, 2)`` float32 Q-values of raw feature rows."""
        self.network.eval()
        with torch.no_grad():
            return self.network(torch.as_tensor(np.asarray(features, dtype=np.float32))).numpy()

    def features(self, scores: np.ndarray, n_tools: int, d: int, signals: np.ndarray | None = None) -> np.ndarray:
        """The policy's input rows for depths ``1..d`` (its feature schema)."""
        if self.needs_model is None:
            return depth_features(np.asarray(scores), n_tools, d)
        return needs_features(np.asarray(scores), n_tools, d, signals, self.needs_model)

    def choose_depth(
        self, scores: np.ndarray, n_tools: int, max_k: int, bias: float = 0.0,
        signals: np.ndarray | None = None,
    ) -> int:
        d = min(int(max_k), len(scores), self.max_depth, policy_depth_limit(n_tools))
        if d < 1:
            return 0
        return first_stop(self.q_values(self.features(scores, n_tools, d, signals)), bias)
