"""Export a trained depth policy to ONNX + manifest, the artifact pair serving loads.

``out_dir/policy.onnx``: opset 17, input ``features`` float32 ``(batch, F)`` (raw
:func:`~registry.serving.features.depth_features` rows), output ``q_values`` float32
``(batch, 2)`` = ``[Q_stop, Q_continue]``.

``out_dir/manifest.json``: name, feature schema version and names, ONNX file name and its
sha256, opset, reward, step cost, gamma, max depth, seed, scorer, the range each feature is
clamped to inside the graph (``feature_range``, the range seen in training), training data,
metrics and the creation time. :class:`~registry.serving.depth_policies.OnnxDepthPolicy` checks the schema and
the hash before serving.

Both files are written atomically (temp file in the same directory, fsync, ``os.replace``),
the ONNX file first, so a reader sees either the old pair, the new pair, or a new ONNX file
with the old manifest (refused by the hash check), never a truncated file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from registry.fsio import atomic_write_bytes, json_safe
from registry.offline.model import TrainedPolicy
from registry.serving.depth_policies import INPUT_NAME, MANIFEST_NAME, OUTPUT_NAME

__all__ = ["ONNX_FILE", "OPSET", "export_onnx", "onnx_bytes"]

OPSET = 17
ONNX_FILE = "policy.onnx"


def onnx_bytes(trained: TrainedPolicy) -> bytes:
    """Serialise the Q-network to ONNX (opset 17, dynamic batch) and return the bytes."""
    net = trained.network.eval()
    dummy = torch.zeros(1, len(trained.feature_names), dtype=torch.float32)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            net,
            (dummy,),
            buf,  # type: ignore[arg-type]  # a file object works; the stub lists paths only
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    return buf.getvalue()


def _check_parity(trained: TrainedPolicy, blob: bytes, n: int = 512, atol: float = 1e-4) -> float:
    """Max |ONNX - torch| on random states around the training distribution."""
    import onnxruntime as ort

    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    mean = trained.network.mean.numpy()
    std = 1.0 / trained.network.inv_std.numpy()
    x = (mean + 2.0 * std * rng.standard_normal((n, mean.size))).astype(np.float32)
    (got,) = sess.run([OUTPUT_NAME], {INPUT_NAME: x})
    want = trained.q_values(x)
    diff = float(np.max(np.abs(got - want)))
    if not diff < atol:
        raise RuntimeError(f"ONNX export differs from the PyTorch network by {diff}")
    return diff


def export_onnx(
    trained: TrainedPolicy,
    out_dir: str | Path,
    *,
    training_data: dict[str, Any],
    metrics: dict[str, Any],
    seed: int,
    scorer: str | None = None,
    name: str = "bor",
) -> Path:
    """Write ``out_dir/policy.onnx`` and ``out_dir/manifest.json``.

    Args:
        trained: the policy from :func:`~registry.offline.train.train_dqn`.
        out_dir: artifact directory (created if needed).
        training_data: provenance of the training episodes (files, hashes, counts, ...).
        metrics: evaluation results to record (e.g. held-out comparison with fixed K).
        seed: training seed.
        scorer: scorer the episodes came from (default: ``training_data["scorer"]`` or ``"unknown"``).
        name: policy name served (``"bor"``).

    Returns:
        ``out_dir`` (ready for ``OnnxDepthPolicy.from_dir``).

    Raises:
        RuntimeError: the exported graph does not reproduce the PyTorch outputs.
    """
    out = Path(out_dir)
    blob = onnx_bytes(trained)
    parity = _check_parity(trained, blob)
    digest = hashlib.sha256(blob).hexdigest()
    cfg = trained.config
    manifest = {
        "name": name,
        "feature_schema_version": trained.feature_schema_version,
        "feature_names": list(trained.feature_names),
        "onnx_file": ONNX_FILE,
        "sha256": digest,
        "opset": OPSET,
        "input": INPUT_NAME,
        "output": OUTPUT_NAME,
        "reward": cfg.get("reward"),
        "step_cost": cfg.get("step_cost"),
        "gamma": cfg.get("gamma"),
        "max_depth": cfg.get("max_depth"),
        "seed": seed,
        "scorer": scorer or str(training_data.get("scorer", "unknown")),
        "network": {"hidden": cfg.get("hidden"), "parity_max_abs_diff": parity},
        # inputs are clamped to this range inside the graph (the range seen in training)
        "feature_range": {
            feature: [float(lo), float(hi)]
            for feature, lo, hi in zip(
                trained.feature_names, trained.network.low.tolist(), trained.network.high.tolist()
            )
        },
        **({"needs_model": trained.needs_model.to_json()} if trained.needs_model is not None else {}),
        "training_data": training_data,
        "metrics": metrics,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    text = json.dumps(json_safe(manifest), indent=2, allow_nan=False)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / ONNX_FILE, blob)
    manifest_path = out / MANIFEST_NAME
    atomic_write_bytes(manifest_path, (text + "\n").encode("utf-8"))
    return out
