#!/usr/bin/env bash
# The benchmarks that mean something on one GPU (or TPU) host with no copy of the weights:
# decode and the train step at Llama-3.2-1B / Llama-3-8B shapes with random weights
# (`--model preset:NAME[:DTYPE]`, tools/bench/common.py), each against transformers on the same
# device, and rooflines from the device's datasheet (common.DATASHEETS).
#
#   OUT=build/accelerator bash tools/bench/accelerator_run.sh
#
# Each benchmark runs in its own process under a time limit, so one failure leaves the others'
# reports. JAX and torch share the device in one process: JAX may take at most half its memory.
set -u
OUT=${OUT:-build/accelerator}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
PY=${PYTHON:-python3}
B=tools/bench
LOG=$OUT/log.txt
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  $PY -c "import jax, flax, optax, transformers; print('jax', jax.__version__, 'flax', \
flax.__version__, 'optax', optax.__version__, 'transformers', transformers.__version__); \
print(jax.devices())"
} >>"$LOG" 2>&1 || { echo "no JAX here: see $LOG"; cat "$LOG"; exit 1; }

run() {  # run LIMIT_S NAME ARGS...: one benchmark, its report at $OUT/NAME.md
  local limit=$1 name=$2
  shift 2
  echo "== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$LOG"
  timeout "$limit" $PY "$@" --out "$OUT/$name.md" >>"$LOG" 2>&1
  echo "== $name exit $? $(date -u +%T)" | tee -a "$LOG"
}

run "${DECODE_1B_S:-200}" decode_1b $B/bench_decode.py --model preset:1b:bfloat16 \
  --prompts 8 --group 8 --prompt-len 128 --new-tokens 256 --both-layer-loops
run "${TRAIN_1B_S:-150}" train_step_1b $B/bench_train_step.py --model preset:1b \
  --batch 8 --seq 512 --steps 5
run "${DECODE_8B_S:-120}" decode_8b $B/bench_decode.py --model preset:8b:bfloat16 \
  --prompts 8 --group 8 --prompt-len 128 --new-tokens 256 --skip-hf --both-layer-loops
run "${LAYER_LOOP_S:-60}" layer_loop_8b $B/bench_layer_loop.py --layers 32 --hidden 4096 \
  --ffn 14336 --rows 64 --steps 16
tail -n 40 "$LOG"
