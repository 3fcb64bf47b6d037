"""The embedder's ONNX graph, written without torch (registry/index/minilm_graph.py), against torch.

The reference is what the export used to trace: ``transformers.BertModel`` (eager attention) with
the shipped fine-tune's delta added to its parameters, mean pooling and the L2 norm, on real
texts (the demo registry's tool descriptions and requests). The export itself runs in a process
where ``import torch`` fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from registry.errors import ArtifactError
from registry.index.embed import OnnxEmbedder
from registry.index.embedders import load_minilm
from registry.index.minilm_export import DELTA_FILE, minilm_model_dir
from registry.index.minilm_graph import load_weights

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "models" / "tuned-embedder"


def _texts() -> list[str]:
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())["tools"]
    specs = [t.get("function", t) for t in tools[:24]]  # OpenAI, Anthropic and MCP shapes
    described = [f"{t['name']}: {t.get('description', '')}" for t in specs]
    return [
        *described,
        "show me the first lines of notes.txt",
        "refund the last charge of customer 42 and email them a receipt",
        "東京の天気を教えてください",
        "a " * 300,  # truncated to 256 tokens by both
        "",
    ]


def _torch_reference(texts: list[str], delta: Path | None) -> np.ndarray:
    """What the torch export computed: BertModel (+ delta), mean pooling, L2 norm."""
    import torch  # the [test] extra installs [train]: a missing torch is a broken install, not a skip
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model_dir = minilm_model_dir()
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager")
    model.eval()
    if delta is not None:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in load_file(str(delta)).items():
                params[name].add_(tensor.to(params[name].dtype))
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    rows = []
    with torch.no_grad():
        for text in texts:  # one by one: no padding, the reference's own path
            enc = tokenizer.encode(text)
            ids = torch.tensor([enc.ids])
            mask = torch.tensor([enc.attention_mask])
            hidden = model(
                input_ids=ids, attention_mask=mask, token_type_ids=torch.tensor([enc.type_ids])
            ).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, p=2.0, dim=1)[0].numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedder-cache")


@pytest.mark.parametrize("embedder", ["minilm", "tuned"])
def test_the_graph_matches_torch_within_1e_4(embedder: str, cache: Path) -> None:
    texts = _texts()
    onnx: OnnxEmbedder = load_minilm(cache, embedder=embedder, adapter_dir=SHIPPED)  # type: ignore[arg-type]
    expected = _torch_reference(texts, SHIPPED / DELTA_FILE if embedder == "tuned" else None)
    batched = onnx.embed_documents(texts, batch_size=8)  # padded batches: the mask matters
    single = np.stack([onnx.embed_query(t) for t in texts])
    assert np.max(np.abs(batched - expected)) < 1e-4
    assert np.max(np.abs(single - expected)) < 1e-4
    if embedder == "tuned":
        plain = _torch_reference(texts[:4], None)
        assert np.max(np.abs(batched[:4] - plain)) > 1e-3  # the fine-tune is really in the graph


def test_the_export_runs_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    blocker = tmp_path / "no-torch"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError('torch is blocked here')\n")
    out = tmp_path / "cache" / "model-tuned.onnx"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "registry.index.export_embedder", "--out", str(out), "--adapter", str(SHIPPED)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(out.with_name(out.name + ".json").read_text())
    assert manifest["model"] == "all-MiniLM-L6-v2+tool-finetune"
    assert manifest["builder"].startswith("registry.index.minilm_graph")


def test_a_delta_for_another_model_names_the_file_and_the_command(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    bad = tmp_path / DELTA_FILE
    save_file({"encoder.layer.0.output.dense.bias": np.zeros(7, np.float16)}, str(bad))
    with pytest.raises(ArtifactError) as err:
        load_weights(minilm_model_dir(), bad)
    assert str(bad) in err.value.message and "shortlist train-embedder" in err.value.message


def test_the_token_output_is_bert_last_hidden_state_and_leaves_the_pooled_vector_unchanged() -> None:
    """A late-interaction stage reads the request's token vectors from the pass already run: the
    second output must be torch's ``last_hidden_state`` and must not move the pooled output."""
    import onnxruntime as ort
    import torch  # the [test] extra installs [train]: a missing torch is a broken install, not a skip
    from tokenizers import Tokenizer
    from transformers import AutoModel

    from registry.index.minilm_graph import build_sentence_encoder

    model_dir = minilm_model_dir()
    config, weights = load_weights(model_dir, SHIPPED / DELTA_FILE)
    plain = build_sentence_encoder(config, weights)
    both = build_sentence_encoder(config, weights, token_output="token_embeddings")
    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (plain, both)]
    assert [o.name for o in sessions[1].get_outputs()] == ["sentence_embedding", "token_embeddings"]

    reference = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager")
    reference.eval()
    params = dict(reference.named_parameters())
    from safetensors.torch import load_file

    with torch.no_grad():
        for name, tensor in load_file(str(SHIPPED / DELTA_FILE)).items():
            params[name].add_(tensor.to(params[name].dtype))
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    for text in _texts()[-6:-1]:
        enc = tokenizer.encode(text)
        feeds = {
            "input_ids": np.asarray([enc.ids], np.int64),
            "attention_mask": np.asarray([enc.attention_mask], np.int64),
            "token_type_ids": np.asarray([enc.type_ids], np.int64),
        }
        (pooled,) = sessions[0].run(None, feeds)
        pooled_too, tokens = sessions[1].run(None, feeds)
        assert np.array_equal(pooled, pooled_too)
        with torch.no_grad():
            hidden = reference(**{k: torch.tensor(v) for k, v in feeds.items()}).last_hidden_state.numpy()
        assert tokens.shape == hidden.shape == (1, len(enc.ids), 384)
        assert np.max(np.abs(tokens - hidden)) < 1e-4
