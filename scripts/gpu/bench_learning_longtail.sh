#!/usr/bin/env bash
# `slime bench learning` on the GPU-sized addition chains (issue 30 item 4): responses of tens to ~1,550 tokens
# (slime.data.chain.GPU_SIZE), a warm start made here by SFT, real SGLang, 2 seeds of sync, april and async.
#
#   source /tmp/slime-env.sh; bash scripts/gpu/bench_learning_longtail.sh        (~15 minutes: run it in two calls)
#
# 1. scripts/gpu/make_longtail_warmstart.py: the task's JSONL and a ~24M-parameter Llama (character tokenizer,
#    2,048 positions) fine-tuned by `slime train --loss-type sft_loss` on SFT_STEPS x 64 solutions, a share
#    DIRECT_FRACTION (0.5) of them the direct answer `#<sum>` instead of the worked chain (the CPU warm starts'
#    recipe: a warm start of worked solutions only left RL nothing to learn in 20 steps on the H200, a mixed one
#    leaves it the strategy; docs/benchmarks.md) (torch trainer on the GPU; bounded by SFT_LIMIT_S), into
#    $WORK/warm/sft/model (reused on a warm machine).
# 2. scripts/gpu/bench_learning_sglang.sh with that model, once per seed (seed 0 of every mode first): one SGLang
#    server on $PORT shared by the runs, one process per (mode, seed), the megatron trainer, the task's data and
#    reward (--rm-type chain). Finished runs stay in $WORK/runs/seedS/MODE: a second call on a warm machine
#    runs only what is missing.
# 3. The target: sync's mean final accuracy less TARGET_DROP (0.01) unless TARGET_FINAL is set; every run is
#    timed against it (`slime bench learning --merge ... --retarget T`) into $OUT/learning_longtail/
#    {learning.json, learning.txt, learning.png}; the table is printed, with the bias columns.
#
# The recipe, by measurement (lr 1e-5, the CPU chain recipe, did not move this warm start in 20 steps):
#   VARIANTS="NAME=FLAGS;NAME=FLAGS"   a sweep instead of step 2: one run of MODES' first mode (default sync) per
#                        variant, its FLAGS added to the recipe's, side by side, each with its own server on PORT+i
#                        (SWEEP_MEM_FRACTION 0.08 of the GPU each), into $WORK/sweep/NAME (FLAGS in NAME/flags);
#                        scripts/gpu/pick_variant.py writes the best to $WORK/sweep/best_variant (mean held-out
#                        accuracy after step 0) and prints each run's reward, entropy and grad norm beside its curve.
#                        The server on PORT stays for the runs after.
#   LRS=3e-5,1e-4        the same over learning rates: VARIANTS="lr3e-5=--lr 3e-5;lr1e-4=--lr 1e-4"
#   VARIANT=NAME | auto  step 2 with a variant's flags (auto: the sweep's pick); LR=1e-4 | auto: with that rate
#   SFT_ONLY=1           step 1 alone (e.g. in the background while another stage runs; a later call waits for
#                        an SFT still running instead of starting one)
#
# Knobs: WORK (/tmp/slime_gpu/longtail), PORT (30300), SFT_STEPS (800), SFT_LIMIT_S (330), DIRECT_FRACTION (0.5), SFT_FLAGS (--micro-batch-size 64 -- --bf16), MODES (sync,april,async),
# SEEDS (0,1), NUM_ROLLOUT (20), EVAL_INTERVAL (4), DEADLINE_S (560, from the start), MODE_LIMIT_S (330 per
# run: a run needs ~40 s beyond its steps and evals to start and end), MIN_RUN_S (150: no run starts with less
# left), SGLANG_CUDA_GRAPH (1),
# TRAIN_FLAGS (the megatron trainer), SMOKE=1 (the CPU check: a tiny model, 2 SFT steps, the embedded engine
# and the torch trainer, tests/data/test_chain_longtail.py). Prints "bench_learning_longtail: PASSED" or FAILED.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
START=$(date +%s)
OUT=${OUT:-/tmp/slime_gpu_out}
WORK=${WORK:-/tmp/slime_gpu/longtail}
PY=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-560}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/longtail.log"
[ -d /tmp/sgl-site ] && export PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site

# 64 rows a forward under bf16 autocast: ~0.7 s a step at 16 rows in fp32 (launch-bound at this size), 600 steps
# would not fit one call
read -r -a sft_flags <<< "${SFT_FLAGS:---micro-batch-size 64 -- --bf16}"
if [ "${SMOKE:-0}" = 1 ]; then  # the CPU check of the path: seconds, not a model that learns
    sft_flags=(--steps 2 --batch-size 4 --micro-batch-size 2 --num-train 64 --hidden-size 32 --intermediate-size 64
        --num-layers 1 --num-heads 2 --num-kv-heads 1 --threads 1)
    # one line each: bench_learning_sglang.sh reads TRAIN_FLAGS' first line only
    export SERVER=none
    TRAIN_FLAGS="--rollout-batch-size 2 --n-samples-per-prompt 2 --global-batch-size 4 --num-eval-prompts 4"
fi
# an SFT already running (SFT_ONLY=1 started in the background by an earlier call) is waited for, not repeated
if [ -f "$WORK/sft.pid" ] && kill -0 "$(cat "$WORK/sft.pid")" 2>/dev/null; then
    echo "=== $(date +%T) waiting for the SFT already running (pid $(cat "$WORK/sft.pid"))" | tee -a "$LOG"
    while kill -0 "$(cat "$WORK/sft.pid")" 2>/dev/null; do sleep 2; done
fi
if [ ! -f "$WORK/warm/sft/model/model.safetensors" ]; then
    rm -rf "$WORK/warm"
    echo $$ > "$WORK/sft.pid"
    echo "=== $(date +%T) SFT warm start" | tee -a "$LOG"
    timeout -k 10 "${SFT_LIMIT_S:-330}" "$PY" scripts/gpu/make_longtail_warmstart.py --out "$WORK/warm" \
        --steps "${SFT_STEPS:-800}" --direct-fraction "${DIRECT_FRACTION:-0.5}" "${sft_flags[@]}" > "$WORK/sft.log" 2>&1
    rc=$?
    rm -f "$WORK/sft.pid"
    grep -E '^step +[0-9]*0 |^done|^warm start|Error' "$WORK/sft.log" | tail -n 8 | tee -a "$LOG"
    if [ "$rc" -ne 0 ] || [ ! -f "$WORK/warm/sft/model/model.safetensors" ]; then
        tail -n 30 "$WORK/sft.log" >> "$LOG"; echo "bench_learning_longtail: FAILED (SFT rc=$rc)" | tee -a "$LOG"; exit 1
    fi
fi
cp "$WORK/sft.log" "$OUT/longtail_sft.log" 2>/dev/null
[ "${SFT_ONLY:-0}" = 1 ] && { echo "bench_learning_longtail: SFT done ($(( $(date +%s) - START ))s)" | tee -a "$LOG"; exit 0; }

D=$WORK/warm/data
data_flags="--hf-checkpoint $WORK/warm/sft/model --prompt-data $D/train.jsonl --eval-prompt-data $D/eval.jsonl --rm-type chain"
response_len=1600
[ "${SMOKE:-0}" = 1 ] && response_len=24
train_flags="${TRAIN_FLAGS:---train-backend megatron --micro-batch-size 16} $data_flags --rollout-max-response-len $response_len"

if [ -n "${LRS:-}" ] && [ -z "${VARIANTS:-}" ]; then
    VARIANTS=$(echo "$LRS" | tr ',' '\n' | sed 's/.*/lr&=--lr &/' | paste -sd ';')
fi
if [ -n "${VARIANTS:-}" ]; then
    # one run per variant side by side, each with its own server (their wall times share the GPU and mean
    # nothing; sync's accuracy per step does not depend on them)
    SW=$WORK/sweep
    mkdir -p "$SW"
    rm -f "$SW/best_lr" "$SW/best_variant"
    IFS=';' read -r -a variant_list <<< "$VARIANTS"
    i=0; pids=()
    for variant in "${variant_list[@]}"; do
        name=${variant%%=*}; flags=${variant#*=}
        port=$(( ${PORT:-30300} + i ))
        echo "=== $(date +%T) sweep: $name ($flags) on port $port" | tee -a "$LOG"
        mkdir -p "$SW/$name"; echo "$flags" > "$SW/$name/flags"
        MODEL="$WORK/warm/sft/model" SEEDS="${SEEDS:-0}" RUNS="$SW/$name" PORT="$port" \
            SGLANG_CUDA_GRAPH="${SGLANG_CUDA_GRAPH:-1}" SGLANG_MEM_FRACTION="${SWEEP_MEM_FRACTION:-0.08}" \
            MIN_RUN_S="${MIN_RUN_S:-150}" NUM_ROLLOUT="${NUM_ROLLOUT:-20}" EVAL_INTERVAL="${EVAL_INTERVAL:-4}" TARGET=0.5 \
            MODE_LIMIT_S="${MODE_LIMIT_S:-330}" DEADLINE_S=$(( DEADLINE_S - ($(date +%s) - START) - 20 )) OUT="$SW/out-$name" \
            TRAIN_FLAGS="$train_flags $flags" \
            bash scripts/gpu/bench_learning_sglang.sh "${MODES:-sync}" > "$SW/$name.log" 2>&1 &
        pids+=($!)
        i=$((i + 1))
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    # the first variant's server (on $PORT) stays for the runs that follow; the others give their memory back
    for ((j = 1; j < i; j++)); do python3 scripts/gpu/stop_port.py $(( ${PORT:-30300} + j )) >/dev/null 2>&1; done
    "$PY" scripts/gpu/pick_variant.py "$SW" --mode "$(echo "${MODES:-sync}" | cut -d, -f1)" 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    echo "bench_learning_longtail: sweep $([ "$status" -eq 0 ] && echo PASSED || echo FAILED) ($(( $(date +%s) - START ))s)" | tee -a "$LOG"
    exit "$status"
fi
if [ -n "${VARIANT:-}" ]; then  # a variant's flags, or auto: the sweep's pick
    name=$VARIANT
    [ "$VARIANT" = auto ] && name=$(cat "$WORK/sweep/best_variant" 2>/dev/null)
    flags=$(cat "$WORK/sweep/$name/flags" 2>/dev/null) || { echo "bench_learning_longtail: FAILED (VARIANT=$VARIANT: no flags in $WORK/sweep/${name:-?})" | tee -a "$LOG"; exit 1; }
    echo "=== variant $name: $flags" | tee -a "$LOG"
    train_flags="$train_flags $flags"
fi
if [ -n "${LR:-}" ]; then  # a rate, or auto: the sweep's pick (waited for while the sweep runs)
    lr=$LR
    if [ "$LR" = auto ]; then
        lr=$(cat "$WORK/sweep/best_lr" 2>/dev/null) || { echo "bench_learning_longtail: FAILED (LR=auto: no sweep pick in $WORK/sweep)" | tee -a "$LOG"; exit 1; }
    fi
    echo "=== lr $lr" | tee -a "$LOG"
    train_flags="$train_flags --lr $lr"
fi

# one bench_learning_sglang.sh per seed (RUNS/seedS): a run killed at its limit loses that (mode, seed) only,
# and seed 0 of every mode comes before seed 1 of any, so a call that ends early leaves comparable runs
status=0
IFS=, read -r -a seed_list <<< "${SEEDS:-0,1}"
for seed in "${seed_list[@]}"; do
    elapsed=$(( $(date +%s) - START ))
    # bench_learning_sglang.sh counts its deadline from its own start: what is left of ours
    MODEL="$WORK/warm/sft/model" SEEDS="$seed" RUNS="$WORK/runs/seed$seed" PORT="${PORT:-30300}" \
        SGLANG_CUDA_GRAPH="${SGLANG_CUDA_GRAPH:-1}" MIN_RUN_S="${MIN_RUN_S:-150}" \
        NUM_ROLLOUT="${NUM_ROLLOUT:-20}" EVAL_INTERVAL="${EVAL_INTERVAL:-4}" TARGET=0.5 \
        MODE_LIMIT_S="${MODE_LIMIT_S:-330}" DEADLINE_S=$(( DEADLINE_S - elapsed - 20 )) OUT="$WORK/out" \
        TRAIN_FLAGS="$train_flags" \
        bash scripts/gpu/bench_learning_sglang.sh "${MODES:-sync,april,async}" 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

files=$(ls "$WORK"/runs/seed*/*/learning.json 2>/dev/null)
target=${TARGET_FINAL:-}
if [ -z "$target" ]; then  # sync's mean final accuracy over its seeds, less the drop
    target=$("$PY" -c 'import glob, json, sys
try:
    finals = [r["final_accuracy"] for p in sorted(glob.glob(sys.argv[1])) for r in json.load(open(p))["curves"]["sync"]]
    print(round(sum(finals) / len(finals) - float(sys.argv[2]), 3))
except (OSError, KeyError, ValueError, ZeroDivisionError):
    pass' "$WORK/runs/seed*/sync/learning.json" "${TARGET_DROP:-0.01}")
fi
if [ -z "$files" ] || [ -z "$target" ]; then
    echo "bench_learning_longtail: FAILED (no sync run to set the target from; $(( $(date +%s) - START ))s)" | tee -a "$LOG"
    exit 1
fi
echo "=== target $target (sync's final less ${TARGET_DROP:-0.01})" | tee -a "$LOG"
# shellcheck disable=SC2086  # one path a word
"$PY" -m slime.cli bench learning --merge $files --retarget "$target" --out "$OUT/learning_longtail" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "bench_learning_longtail: $([ "$status" -eq 0 ] && echo PASSED || echo FAILED) ($(( $(date +%s) - START ))s)" | tee -a "$LOG"
exit "$status"
