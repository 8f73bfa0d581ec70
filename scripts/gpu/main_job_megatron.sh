#!/usr/bin/env bash
# The CPU demo's main job (scripts/quickstart.sh's recipe, 30 steps) with --train-backend megatron on
# one GPU, then optionally the MFU benchmark; run on the device machine from the repository root.
#
#   bash scripts/gpu/main_job_megatron.sh [main][,mfu][,ab]     (default: main,mfu)
#
#   main  slime train --train-backend megatron (fp32, one process: no torchrun needed for 1 GPU),
#         embedded engine on the CPU, shipped warm start; run dir in /tmp (weights stay there)
#   mfu   scripts/bench_megatron_mfu.py --steps 5 --profile with this tree's trainer
#   ab    the same benchmark (no profile) with the trainer of .ab/trainer.py (e.g. HEAD's), for an
#         A/B on one machine: `git show HEAD:slime/train/megatron/trainer.py > .ab/trainer.py`,
#         carry ".ab"; its JSON lands in $OUT/ab/ ("ab-first" runs it before "mfu")
#
# Needs .whl/ carried (scripts/gpu/fetch_wheels.sh: megatron-core, msgspec, math-verify +
# latex2sympy2_extended + antlr4 runtime, rank-bm25; the image has the rest, and its transformers 5.17
# serves the embedded engine: slime.hf_compat passes the KV cache as `past_key_values` there). Only small files come back: run.log, summary.json,
# metrics.jsonl, reward_curve.png, engine_busy.png, megatron_mfu.json, megatron_mfu_profile.json,
# ab/megatron_mfu.json. Each part is bounded by `timeout` so the whole call stays under 8 minutes.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/slime_gpu_out}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/run.log"
PARTS=${1:-main,mfu}
MAIN_LIMIT=${MAIN_LIMIT:-260}
EXTRA_DEADLINE=${EXTRA_DEADLINE:-100000}  # skip the benchmark parts if the script has run this many seconds
MFU_ARGS=${MFU_ARGS:---steps 5 --profile}

source scripts/gpu/lib.sh
install_wheels

run 60 python3 -c "import sys, torch, megatron.core, transformers, math_verify, rank_bm25, msgspec; print(sys.version.split()[0], torch.__version__, 'megatron-core', megatron.core.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(), 'cpus', __import__('os').cpu_count())"

if [[ $PARTS == *main* ]]; then
    RUN=/tmp/slime_gpu/main_run
    rm -rf "$RUN"
    run "$MAIN_LIMIT" python3 -m slime.cli train --train-backend megatron \
        --partial-rollout \
        --rollout-batch-size 16 --over-sampling-batch-size 32 --n-samples-per-prompt 8 \
        --global-batch-size 128 --micro-batch-size 128 \
        --rollout-max-response-len 48 --rollout-temperature 1.0 \
        --num-rollout 30 --lr 3e-5 --use-tis --max-staleness 4 \
        --num-eval-prompts 200 --eval-interval 10 \
        --save "$RUN" --seed 1 --no-progress
    for f in summary.json metrics.jsonl reward_curve.png engine_busy.png; do
        [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/$f"
    done
    [ -f "$RUN/summary.json" ] && python3 - "$RUN" <<'EOF' 2>&1 | tee -a "$LOG"
import json, statistics, sys
run = sys.argv[1]
recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steps = [r for r in recs if r.get("kind") == "step"]
evals = [(r["step"], r["accuracy"]) for r in recs if r.get("kind") == "eval"]
print("evals:", evals)
for key in ("train_time_s", "step_time_s", "rollout_wait_s", "weight_sync_s"):
    xs = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
    if xs:
        print(f"{key}: first {xs[0]:.3f}  median {statistics.median(xs):.3f}  median(2..) {statistics.median(xs[1:] or xs):.3f}  max {max(xs):.3f}  n={len(xs)}")
print("step keys:", sorted(k for k in steps[0] if k.endswith("_s")) if steps else None)
EOF
fi
mfu() { run 110 python3 scripts/bench_megatron_mfu.py $MFU_ARGS; }
ab() {
    rm -rf /tmp/ab && mkdir -p /tmp/ab "$OUT/ab" && cp -r slime /tmp/ab/ && cp .ab/trainer.py /tmp/ab/slime/train/megatron/trainer.py
    run 80 env PYTHONPATH=/tmp/site:/tmp/ab OUT="$OUT/ab" python3 scripts/bench_megatron_mfu.py --steps 5
}
if (( SECONDS > EXTRA_DEADLINE )); then
    echo "benchmark parts skipped: ${SECONDS}s > EXTRA_DEADLINE=${EXTRA_DEADLINE}s" | tee -a "$LOG"
elif [[ $PARTS == *ab-first* ]]; then  # order swapped, to see whether the order biases the A/B
    [ -f .ab/trainer.py ] && ab
    [[ $PARTS == *mfu* ]] && mfu
else
    [[ $PARTS == *mfu* ]] && mfu
    [[ $PARTS == *ab* && -f .ab/trainer.py ]] && ab
fi
echo "main_job_megatron.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
