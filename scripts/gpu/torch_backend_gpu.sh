#!/usr/bin/env bash
# The torch backend on one GPU (--train-device cuda, --bf16), run on the device machine from the repository root.
#
#   bash scripts/gpu/torch_backend_gpu.sh [tests][,parity][,main]     (default: all three)
#
#   tests   tests/train/test_torch_backend_device.py -m gpu: fp32 on the GPU = the CPU (1e-4), bf16 autocast
#           logprobs within 1e-2 (mean) / 6e-2 (max) nats of CPU fp32 before and after a step; sync weights,
#           save_hf and the loop checkpoint round trip from the GPU trainer
#   parity  one step of the main job (scripts/quickstart.sh's recipe) recorded on the CPU with
#           --debug-rollout-only, then tests/gpu/torch_backend_parity.py trains it with the CPU fp32
#           trainer, the GPU fp32 one and the GPU bf16 one: logprobs before and after the step
#           (fp32: mean <= 1e-5, max <= 1e-3 nats; bf16: mean <= 1e-2, max <= 0.25) -> torch_backend_parity.json
#   main    the main job itself, 20 steps, trainer on the GPU with --bf16 (embedded engine on the CPU,
#           disk weight sync): it must finish and report an eval; summary.json and metrics.jsonl come back
#
# Needs .whl/ carried (scripts/gpu/fetch_wheels.sh: msgspec, math-verify, ...; megatron-core is not used).
# Writes to $OUT: torch_backend_gpu.log, torch_backend_parity.json, summary.json, metrics.jsonl.
# Each part is bounded by `timeout`; the whole call stays under 8 minutes.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/slime_gpu_out}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/torch_backend_gpu.log"
PARTS=${1:-tests,parity,main}

source scripts/gpu/lib.sh
install_wheels

MAIN_JOB=(--partial-rollout --rollout-batch-size 16 --over-sampling-batch-size 32 --n-samples-per-prompt 8
          --global-batch-size 128 --micro-batch-size 128 --rollout-max-response-len 48 --rollout-temperature 1.0
          --lr 3e-5 --use-tis --max-staleness 4 --seed 1 --no-progress)

run 60 python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

if [[ $PARTS == *tests* ]]; then
    run 180 python3 -m pytest tests/train/test_torch_backend_device.py -m gpu -o addopts="" -p no:cacheprovider -q -rA
fi
if [[ $PARTS == *parity* ]]; then
    REC=/tmp/slime_gpu/torch_record
    rm -rf "$REC"
    run 120 python3 -m slime.cli train "${MAIN_JOB[@]}" --num-rollout 1 --train-device cpu --debug-rollout-only \
        --save "$REC/run" --save-debug-rollout-data "$REC/rollout_{rollout_id}.msgpack"
    run 120 python3 tests/gpu/torch_backend_parity.py --record "$REC/rollout_{rollout_id}.msgpack" --device cuda
fi
if [[ $PARTS == *main* ]]; then
    RUN=/tmp/slime_gpu/torch_main_run
    rm -rf "$RUN"
    run 240 python3 -m slime.cli train "${MAIN_JOB[@]}" --num-rollout 20 --num-eval-prompts 200 --eval-interval 10 \
        --train-device cuda --bf16 --save "$RUN"
    for f in summary.json metrics.jsonl; do
        [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/$f"
    done
    if [ -f "$RUN/summary.json" ]; then
        python3 - "$RUN" <<'EOF' 2>&1 | tee -a "$LOG" || status=1
import json, statistics, sys
recs = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
steps = [r for r in recs if r.get("kind") == "step"]
evals = [(r["step"], r["accuracy"]) for r in recs if r.get("kind") == "eval"]
print("evals:", evals, "steps:", len(steps))
xs = [r["train_time_s"] for r in steps if isinstance(r.get("train_time_s"), (int, float))]
if xs:
    print(f"train_time_s: first {xs[0]:.3f} median {statistics.median(xs):.3f}")
sys.exit(0 if len(steps) == 20 and evals else 1)
EOF
    else
        echo "no summary.json" | tee -a "$LOG"; status=1
    fi
fi
echo "torch_backend_gpu.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
