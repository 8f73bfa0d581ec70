#!/usr/bin/env bash
# Set up (if needed) and run the CPU main job: GRPO with partial rollouts (APRIL) on the arithmetic
# task, from the shipped warm start, through the embedded engine over the SGLang HTTP protocol.
# Writes runs/quickstart/ (a previous one is kept as runs/quickstart.prev-<time>).
# Extra arguments are passed to `slime train` (e.g. --seed 2 --save runs/seed2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -e runs/quickstart ] && [[ " $* " != *" --save "* ]]; then
  mv runs/quickstart "runs/quickstart.prev-$(date +%Y%m%d-%H%M%S)"
fi
exec .venv/bin/slime train \
  --partial-rollout \
  --rollout-batch-size 16 --over-sampling-batch-size 32 --n-samples-per-prompt 8 \
  --global-batch-size 128 --micro-batch-size 128 \
  --rollout-max-response-len 48 --rollout-temperature 1.0 \
  --num-rollout 50 --lr 3e-5 --use-tis --max-staleness 4 \
  --num-eval-prompts 200 --eval-interval 10 \
  --save runs/quickstart --seed 1 \
  "$@"
