#!/usr/bin/env bash
# The GPU table (benchmarks/run.py --gpu, issue 19 item 4) as it was run on a lent H200: the
# machine's own python3 (jax with CUDA, flax, optax, torch), the few packages it lacks carried
# as wheels in .whl/ (ml-collections; google-tunix 0.1.7 and what its sampler imports), results
# under $OUT. Two processes, so that one failing section leaves the other's figures:
#   1. ours vs the recorded Hugging Face / PyTorch numbers (sampler, policy_step);
#   2. ours vs tunix's Sampler on the same random weights (tunix in a worker process on the
#      same GPU, so neither process preallocates the GPU's memory).
# Usage there: bash tools/gpu_lease.sh  (after `pip install --target /tmp/site .whl/*.whl`).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TF_CPP_MIN_LOG_LEVEL=2
PY=$(command -v python3)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
"$PY" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
nproc; uptime
RUNS=${RUNS:-3}
REPS=${REPS:-2}
timeout "${T1:-270}" "$PY" benchmarks/run.py --gpu --only sampler,policy_step --runs "$RUNS" \
  --reps "$REPS" --out "$OUT/gpu.json" || echo "SECTION 1 EXIT $?"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${T2:-300}" "$PY" benchmarks/run.py --gpu \
  --only tunix_sampler --runs "$RUNS" --reps "$REPS" --tunix-python "$PY" \
  --out "$OUT/gpu_tunix.json" || echo "SECTION 2 EXIT $?"
