#!/usr/bin/env bash
# Set up (if needed) and run the on-policy distillation demo: the shipped 1.6M-parameter arithmetic
# warm start (the student) is distilled from a 4.7M-parameter teacher (slime/data/assets/arith-opd-teacher,
# made by scripts/make_opd_teacher.py, which runs here first if the teacher is missing). An embedded
# engine serves the teacher beside the student's; it scores every finished sample (prefill only,
# input_token_logprobs) and the per-token reverse KL is the only training signal (--opd-only: the
# task reward is logged and evaluated, not trained). Watch `rkl` (opd/reverse_kl) fall and the eval
# accuracy rise. Sync mode (every step a fresh random batch), so the per-step KL is comparable across
# steps; --partial-rollout works too. Writes runs/quickstart_opd/. Extra arguments go to `slime train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TEACHER=slime/data/assets/arith-opd-teacher
if [ ! -f "$TEACHER/model.safetensors" ]; then
  .venv/bin/python scripts/make_opd_teacher.py --out "$TEACHER"
fi
if [ -e runs/quickstart_opd ] && [[ " $* " != *" --save "* ]]; then
  mv runs/quickstart_opd "runs/quickstart_opd.prev-$(date +%Y%m%d-%H%M%S)"
fi
exec .venv/bin/slime train \
  --use-opd --opd-only --opd-kl-coef 1.0 --opd-teacher-load "$TEACHER" \
  --rollout-batch-size 16 --n-samples-per-prompt 8 \
  --global-batch-size 128 --micro-batch-size 128 \
  --rollout-max-response-len 48 --rollout-temperature 1.0 \
  --num-rollout 30 --lr 3e-5 --use-tis --max-staleness 4 \
  --num-eval-prompts 200 --eval-interval 10 \
  --save runs/quickstart_opd --seed 1 \
  "$@"
