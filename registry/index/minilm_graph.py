"""The MiniLM sentence encoder as an ONNX graph, written node by node from its safetensors weights.

Serving must not need torch (a CPU wheel of ~750 MB, or several GB of CUDA packages from the
public index) to get the one graph it runs, so the graph is written here with numpy and the
``onnx`` package's helper API instead of being traced. It is the BERT encoder of
``transformers.BertModel`` (post-norm, exact erf GELU, eager attention) followed by the
sentence-transformers head, for the checkpoint's own ``config.json`` sizes::

    x_0     = LayerNorm(E_word[ids] + E_pos[0..S) + E_type[types])
    a_l     = softmax(Q K^T / sqrt(d_head) + (1 - m) * min_float) V        (per head)
    x_l'    = LayerNorm(x_{l-1} + a_l W_o + b_o)
    x_l     = LayerNorm(x_l' + GELU(x_l' W_i + b_i) W_2 + b_2)
    e       = sum_t(m_t * x_L,t) / max(sum_t m_t, 1e-9)                     (mean pooling)
    out     = e / max(||e||_2, 1e-12)                                       (sentence_embedding)

A fine-tune's fp16 delta (``models/tuned-embedder/encoder-delta.safetensors``) is added to the
fp32 weights in numpy, as ``torch``'s ``param.add_(delta.float())`` did; a tool adapter's linear
map goes between pooling and the norm. ``tests/test_minilm_graph.py`` holds the graph to the torch
model on real texts (1e-4).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from registry.errors import ArtifactError

__all__ = ["INPUT_NAMES", "build_sentence_encoder", "load_weights"]

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17  # LayerNormalization is an operator from 17 on

Weights = dict[str, npt.NDArray[Any]]


def load_weights(model_dir: Path, delta_file: Path | None = None) -> tuple[dict[str, Any], Weights]:
    """The checkpoint's ``config.json`` and fp32 weights, with ``delta_file`` added if given.

    Raises:
        ArtifactError: A file is missing or unreadable, or the delta names a tensor the base
            lacks or gives it another shape (the message names the command that rebuilds it).
    """
    from safetensors.numpy import load_file

    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        weights = {k: np.asarray(v, dtype=np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read the MiniLM weights in {model_dir}: {exc}", {"model_dir": str(model_dir)}) from exc
    if delta_file is not None:
        try:
            delta = load_file(str(delta_file))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"cannot read {delta_file}: {exc}", {"path": str(delta_file)}) from exc
        for name, tensor in delta.items():
            base = weights.get(name)
            if base is None or base.shape != tensor.shape:
                raise ArtifactError(
                    f"{delta_file} holds {name} {tuple(tensor.shape)}, which the base MiniLM "
                    "does not have; rebuild it with `shortlist train-embedder`",
                    {"path": str(delta_file), "tensor": name},
                )
            weights[name] = base + tensor.astype(np.float32)
    return config, weights


class _Graph:
    """Nodes and initializers of one graph, with fresh names for intermediate values."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def const(self, name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        self._count += 1
        name = out or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=f"n{self._count}_{op_type}", **attrs))
        return name

    def linear(self, x: str, weights: Mapping[str, npt.NDArray[Any]], prefix: str) -> str:
        """``x @ W^T + b`` for the torch ``Linear`` stored under ``prefix``."""
        w = self.const(f"{prefix}.weight.T", np.ascontiguousarray(weights[f"{prefix}.weight"].T))
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("Add", self.op("MatMul", x, w), b)

    def layer_norm(self, x: str, weights: Mapping[str, npt.NDArray[Any]], prefix: str, eps: float) -> str:
        scale = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        bias = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)


def build_sentence_encoder(
    config: Mapping[str, Any],
    weights: Mapping[str, npt.NDArray[Any]],
    *,
    adapter: npt.NDArray[np.float32] | None = None,
    output_name: str = "sentence_embedding",
    token_output: str | None = None,
) -> Any:
    """The ``onnx.ModelProto`` of the encoder, mean pooling and L2 norm (module docstring).

    Args:
        config: The checkpoint's ``config.json`` (``hidden_size``, ``num_attention_heads``,
            ``num_hidden_layers``, ``layer_norm_eps``, ``hidden_act`` must be ``gelu``).
        weights: fp32 tensors named as in ``transformers.BertModel.state_dict()``.
        adapter: A ``(dim, dim)`` map applied to the pooled vector before the norm, or ``None``.
        output_name: The graph's output.
        token_output: Also output the last layer's token states ``x_L`` (``[batch, sequence,
            hidden]``, what ``BertModel`` calls ``last_hidden_state``) under this name, for a
            late-interaction stage that reads the request's tokens from the pass already run.
            The nodes are the same either way, so the pooled output is bit-identical.

    Raises:
        ArtifactError: The config is not a post-norm GELU BERT this function writes.
    """
    from onnx import TensorProto, helper

    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ArtifactError(
            f"the checkpoint is not a GELU BERT with absolute positions: {dict(config)}", {}
        )
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = hidden // heads
    eps = float(config.get("layer_norm_eps", 1e-12))
    g = _Graph()

    # Embeddings: word + position (0..S) + token type, then LayerNorm.
    ids, mask, types = INPUT_NAMES
    seq_len = g.op("Gather", g.op("Shape", ids), g.const("axis1", 1, np.int64), axis=0)
    positions = g.op("Range", g.const("zero", 0, np.int64), seq_len, g.const("one", 1, np.int64))
    emb = "embeddings"
    x = g.op(
        "Add",
        g.op(
            "Add",
            g.op("Gather", g.const(f"{emb}.word", weights[f"{emb}.word_embeddings.weight"]), ids),
            g.op("Gather", g.const(f"{emb}.pos", weights[f"{emb}.position_embeddings.weight"]), positions),
        ),
        g.op("Gather", g.const(f"{emb}.type", weights[f"{emb}.token_type_embeddings.weight"]), types),
    )
    x = g.layer_norm(x, weights, f"{emb}.LayerNorm", eps)

    # The additive attention mask of BertModel: 0 where m = 1, float32 min where m = 0, [B,1,1,S].
    mask_f = g.op("Cast", mask, to=TensorProto.FLOAT)
    inverted = g.op("Sub", g.const("one_f", 1.0), mask_f)
    neg = g.op("Mul", inverted, g.const("min_f", np.finfo(np.float32).min))
    additive = g.op("Unsqueeze", neg, g.const("axes_1_2", [1, 2], np.int64))

    split_shape = g.const("split_heads", [0, 0, heads, head_dim], np.int64)
    merge_shape = g.const("merge_heads", [0, 0, hidden], np.int64)
    inv_sqrt = g.const("inv_sqrt_d", 1.0 / np.sqrt(head_dim))
    inv_sqrt2 = g.const("inv_sqrt2", 1.0 / np.sqrt(2.0))
    half = g.const("half", 0.5)
    one = "one_f"

    for layer in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{layer}"

        def heads_of(name: str, perm: list[int], x: str = x, p: str = p) -> str:
            projected = g.linear(x, weights, f"{p}.attention.self.{name}")
            return g.op("Transpose", g.op("Reshape", projected, split_shape), perm=perm)

        q = heads_of("query", [0, 2, 1, 3])  # [B,H,S,D]
        k = heads_of("key", [0, 2, 3, 1])  # [B,H,D,S]
        v = heads_of("value", [0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), inv_sqrt), additive)
        probs = g.op("Softmax", scores, axis=-1)
        context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        context = g.op("Reshape", context, merge_shape)
        attended = g.linear(context, weights, f"{p}.attention.output.dense")
        x = g.layer_norm(g.op("Add", attended, x), weights, f"{p}.attention.output.LayerNorm", eps)

        inner = g.linear(x, weights, f"{p}.intermediate.dense")
        erf = g.op("Erf", g.op("Mul", inner, inv_sqrt2))
        gelu = g.op("Mul", g.op("Mul", inner, half), g.op("Add", erf, one))
        out = g.linear(gelu, weights, f"{p}.output.dense")
        x = g.layer_norm(g.op("Add", out, x), weights, f"{p}.output.LayerNorm", eps)

    # Mean pooling over the mask, the optional adapter, then the L2 norm.
    m = g.op("Unsqueeze", mask_f, g.const("axes_2", [2], np.int64))
    summed = g.op("ReduceSum", g.op("Mul", x, m), g.const("axes_1", [1], np.int64), keepdims=0)
    counts = g.op("ReduceSum", m, "axes_1", keepdims=0)
    pooled = g.op("Div", summed, g.op("Max", counts, g.const("count_floor", 1e-9)))
    if adapter is not None:
        pooled = g.op("MatMul", pooled, g.const("adapter.T", np.ascontiguousarray(adapter.T)))
    norm = g.op("ReduceL2", pooled, axes=[-1], keepdims=1)  # axes an attribute until opset 18
    g.op("Div", pooled, g.op("Max", norm, g.const("norm_floor", 1e-12)), out=output_name)

    dims = ["batch", "sequence"]
    outputs = [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", hidden])]
    if token_output is not None:
        g.op("Identity", x, out=token_output)
        outputs.append(helper.make_tensor_value_info(token_output, TensorProto.FLOAT, [*dims, hidden]))
    graph = helper.make_graph(
        g.nodes,
        "minilm_sentence_encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in INPUT_NAMES],
        outputs,
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tool-shortlist"
    )
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    return model
