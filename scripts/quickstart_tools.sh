#!/usr/bin/env bash
# Set up (if needed) and run the second CPU demo: a small model learns to call a calculator tool.
# GRPO with partial rollouts (APRIL) on the built-in calc task (slime.data.calc) from the shipped
# tool-calling warm start, with the multi-turn generate (slime.rollout.multiturn.calculator_generate):
# the model's tool calls run, tool results go back into the conversation with loss mask 0, and a
# turn aborted at a weight update resumes mid-turn. Extra arguments are passed to `slime train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -e runs/quickstart_tools ] && [[ " $* " != *" --save "* ]]; then
  mv runs/quickstart_tools "runs/quickstart_tools.prev-$(date +%Y%m%d-%H%M%S)"
fi
exec .venv/bin/slime train \
  --builtin-task calc --hf-checkpoint slime/data/assets/calc-warmstart \
  --custom-generate-function-path slime.rollout.multiturn.calculator_generate \
  --partial-rollout \
  --rollout-batch-size 16 --over-sampling-batch-size 32 --n-samples-per-prompt 8 \
  --global-batch-size 128 --micro-batch-size 128 \
  --rollout-max-response-len 160 --rollout-temperature 1.0 \
  --num-rollout 20 --lr 3e-5 --use-tis --max-staleness 4 \
  --num-eval-prompts 200 --eval-interval 5 \
  --save runs/quickstart_tools --seed 1 \
  "$@"
