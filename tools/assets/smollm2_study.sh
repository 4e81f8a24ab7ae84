#!/usr/bin/env bash
# The Cooper study for SmolLM2-135M-Instruct on GSM8K train, evaluated on GSM8K, SVAMP, MATH500
# and OlympiadBench (8 samples, T=0.7, top-p 0.95, as the paper). Meant for a GPU; one command:
#
#   RM=runs/smollm2_rm bash tools/assets/smollm2_study.sh results/smollm2_study
#
# RM: a trained reference-based RM directory for the static_rm and cooper rows (make one with
# cooper_jax/cli/annotate.py + cooper_jax/cli/pretrain_rm.py). Without it, both start from a fresh zero score
# head, which makes static_rm a constant reward (the log says so). SEEDS, STEPS override.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/smollm2_study}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-200}
PY=${PY:-.venv/bin/python}
BENCH=gsm8k/test,svamp/test,math500/test,olympiadbench/test
EVAL=(--benchmarks "$BENCH" --samples 8 --temperature 0.7 --top_p 0.95 --max_new_tokens 512
      --batch_size 256)
RM_FLAG=()
[ -n "${RM:-}" ] && RM_FLAG=(--config.rm.model="$RM")
mkdir -p "$OUT"
"$PY" -m cooper_jax.evaluate --model smollm2-135m-instruct "${EVAL[@]}" \
    --label "untrained" --out "$OUT/untrained"
for mode in rule static_rm cooper; do
  for seed in $SEEDS; do
    wd="$OUT/runs/${mode}_s${seed}"
    "$PY" -m cooper_jax.train --config "experiments/smollm2.py:$mode" --workdir "$wd" \
        --config.seed="$seed" --config.train.steps="$STEPS" \
        --config.policy.optim.total_steps="$STEPS" --config.rm.optim.total_steps="$STEPS" \
        --config.policy.dtype=bfloat16 --config.rm.dtype=bfloat16 "${RM_FLAG[@]}"
    "$PY" -m cooper_jax.evaluate --checkpoint "$wd" "${EVAL[@]}" --seed "$seed" \
        --label "${mode} seed ${seed}" --out "$OUT/eval_${mode}_s${seed}"
  done
done
cat "$OUT"/untrained/table.md "$OUT"/eval_*/table.md > "$OUT/table.md"
echo "wrote $OUT/table.md"
