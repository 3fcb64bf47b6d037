"""The one onnxruntime session builder, used by the embedder and the depth policy.

Like fastembed's model loading: explicit :class:`onnxruntime.SessionOptions` (thread caps,
sequential execution, full graph optimisation, quiet logging), a check that the CPU provider
exists, and load failures turned into :class:`~registry.errors.ArtifactError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import ArtifactError

__all__ = ["CPU_PROVIDER", "make_session"]

CPU_PROVIDER = "CPUExecutionProvider"


def make_session(
    model: Path | bytes,
    *,
    threads: int = 1,
    origin: Path | None = None,
    mem_arena: bool = True,
    hint: str = "",
) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU provider for a model path or its bytes.

    Args:
        model: the ``.onnx`` file or its contents.
        threads: intra-op threads (inter-op is always 1, execution sequential).
        origin: the file named in errors (default ``model`` when it is a path).
        mem_arena: keep onnxruntime's CPU arena; off keeps RSS at the live working set
            (batch embedding otherwise keeps its peak resident).
        hint: appended to the load-failure message (e.g. how to rebuild the file).

    Raises:
        ArtifactError: onnxruntime missing or without the CPU provider, or the model unloadable.
    """
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a core dependency
        raise ArtifactError("onnxruntime is not installed; install tool-shortlist") from exc
    where = origin if origin is not None else model if isinstance(model, Path) else Path("<bytes>")
    available = ort.get_available_providers()
    if CPU_PROVIDER not in available:
        raise ArtifactError(
            f"onnxruntime offers no {CPU_PROVIDER} (available: {available}); "
            "reinstall the CPU build: pip install --force-reinstall onnxruntime",
            {"available_providers": available},
        )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only; ORT warns about unused initializers on load
    opts.enable_cpu_mem_arena = mem_arena
    source = str(model) if isinstance(model, Path) else model
    try:
        return ort.InferenceSession(source, sess_options=opts, providers=[CPU_PROVIDER])
    except Exception as exc:  # onnxruntime's own Fail / InvalidProtobuf / ... types
        tail = f"; {hint}" if hint else ""
        raise ArtifactError(f"cannot load ONNX model {where}: {exc}{tail}", {"path": str(where)}) from exc
