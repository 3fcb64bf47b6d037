"""The embedder factory: the configured ONNX embedder, loaded from the cache (made on first use).

Every part that needs the real MiniLM (the assembly, the CLI, bench and scripts) loads it here;
:mod:`registry.index.minilm_export` makes and checks the cached files this reads.
"""

from __future__ import annotations

from pathlib import Path

from registry.index.embed import TOKENIZER_FILE, OnnxEmbedder
from registry.index.minilm_export import ensure_embedder_onnx
from registry.settings import EmbedderArgs, EmbedderName

__all__ = ["default_embedder", "load_embedder", "load_minilm"]


def load_minilm(
    cache_dir: Path,
    *,
    threads: int = 1,
    embedder: EmbedderName = "minilm",
    adapter_dir: Path | None = None,
) -> OnnxEmbedder:
    """Make ``embedder``'s ONNX file under ``cache_dir`` if needed (fp32 by default), then load it.

    Args:
        cache_dir: Cache root (see this module's docstring).
        threads: ONNX Runtime intra-op threads.
        embedder: ``minilm`` (fp32), ``minilm-int8``, ``tuned`` or ``tuned-int8``.
        adapter_dir: The tool adapter (``Settings.tuned_embedder_dir``), for the tuned ones.

    Raises:
        ArtifactError: The export failed, a cached file is corrupt or unloadable.
    """
    return load_embedder(cache_dir, embedder, threads=threads, adapter_dir=adapter_dir)


def default_embedder(settings: EmbedderArgs) -> OnnxEmbedder:
    """The configured embedder (``SHORTLIST_EMBEDDER``) from its cache (made on first use)."""
    return load_minilm(
        settings.resolved_embedder_cache(),
        threads=settings.embed_threads,
        embedder=settings.embedder,
        adapter_dir=settings.tuned_embedder_dir,
    )


def load_embedder(
    cache_dir: Path,
    embedder: EmbedderName = "minilm",
    *,
    threads: int = 1,
    adapter_dir: Path | None = None,
) -> OnnxEmbedder:
    """Make ``embedder``'s ONNX file under ``cache_dir`` if needed, then load it.

    Raises:
        ArtifactError: See :func:`ensure_embedder_onnx` and :class:`OnnxEmbedder`.
    """
    onnx_path = ensure_embedder_onnx(cache_dir, embedder, adapter_dir)
    return OnnxEmbedder(onnx_path, onnx_path.parent / TOKENIZER_FILE, threads=threads)
