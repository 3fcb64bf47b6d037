"""The one way tests build a core or an engine.

Tests used to build a :class:`~registry.core.Shortlister` (or a bare engine) each their own way:
settings copied with overrides, a hashing embedder factory, the shipped ONNX depth policy. These
helpers are that, once; the conftest fixtures (``settings``, ``bor_policy``, ``make_core``, ``engine``) use them,
and so does every test that builds a core or an engine itself.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from registry.assembly import Registries
from registry.core import EmbedderFactory, Shortlister
from registry.index.embed import Embedder, HashingEmbedder
from registry.serving.depth_policies import OnnxDepthPolicy, TunableDepthPolicy
from registry.settings import EngineArgs, Settings
from registry.store.base import Store
from registry.store.local import LocalStore
from service.settings import ServiceSettings

POLICY_DIR = Path(__file__).resolve().parent.parent / "models" / "default"


def settings_for(data_dir: Path, **overrides: Any) -> ServiceSettings:
    """Settings for a test: data under ``data_dir``, no demo registry, and the Host TestClient
    sends (``testserver``) allowed."""
    values: dict[str, Any] = {"data_dir": data_dir, "demo_registry": None, "allowed_hosts": ("localhost", "testserver")}
    return ServiceSettings(**{**values, **overrides})


@cache
def shipped_policy() -> TunableDepthPolicy:
    """The shipped ONNX depth policy (models/default), loaded once per test process."""
    return OnnxDepthPolicy.from_dir(POLICY_DIR)


def hashing_factory(_: object) -> Embedder:
    """An embedder factory for the fast fake embedder (the core calls it with its embedder group)."""
    return HashingEmbedder()


def new_core(
    settings: Settings,
    *,
    embedder_factory: EmbedderFactory = hashing_factory,
    bor_policy: TunableDepthPolicy | None = None,
    store: Store | None = None,
    start: bool = True,
    **overrides: Any,
) -> Shortlister:
    """A core on ``settings`` with ``overrides`` (field name -> value), the hashing embedder and
    the shipped depth policy unless given; loaded inline when ``start``. Close it when done."""
    return Shortlister.from_settings(
        settings.model_copy(update=overrides) if overrides else settings,
        embedder_factory=embedder_factory,
        bor_policy=bor_policy or shipped_policy(),
        store=store,
        start=start,
    )


def new_engine(
    settings: EngineArgs,
    *,
    store: Store | None = None,
    embedder: Embedder | None = None,
    bor_policy: TunableDepthPolicy | None = None,
    **kwargs: Any,
) -> Registries:
    """A bare engine (a writer and a query runner over one snapshot map, no core around it) on ``store`` (default: a local store in the settings'
    data directory), with the hashing embedder and the shipped policy unless given; ``kwargs``
    go to the engine (``usage=``, ``policy_book=``)."""
    if store is None:
        assert isinstance(settings, Settings), "a local store needs the settings' data_dir"
        store = LocalStore(settings.data_dir)
    return Registries.build(
        settings, store, embedder or HashingEmbedder(), bor_policy or shipped_policy(), **kwargs
    )
