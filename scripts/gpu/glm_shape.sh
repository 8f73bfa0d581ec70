#!/usr/bin/env bash
# A GLM-4.5-shaped MoE model (Glm4MoeForCausalLM: partial RoPE, q/k/v bias, q/k norms, first layer dense, 32 sigmoid-routed
# experts with an expert bias, one shared expert; ~0.35 B parameters, scripts/gpu/make_random_glm45.py) on one H200,
# trained by the megatron backend and served by real SGLang 0.5.17 that slime starts on the same GPU; run from the
# repository root:
#
#   source /tmp/slime-env.sh; bash scripts/gpu/glm_shape.sh [make][,rl][,replay]   (default: make,rl,replay; ~5 min)
#
#   make    random bf16 weights + the arithmetic demo's tokenizer in $MODEL (/tmp/slime_gpu/glm45_shape; kept)
#   rl      slime train --train-backend megatron --builtin-task arith, --rollout-mode sync, $STEPS (4) steps, disk
#           weight sync after each; the per-step trainer/engine logprob gap (train/train_rollout_logprob_abs_diff
#           and _max) goes to $OUT/glm_shape.json under "no_replay"
#   replay  the same run with --use-rollout-routing-replay (SGLang started with --enable-return-routed-experts),
#           under "replay"; skipped with one line when this tree's `slime train` has no such flag
#
# Environment as scripts/gpu/deepseek_shape.sh: /tmp/slime-env.sh (scripts/gpu/setup_env.sh) when it exists, else
# SGLang's site at /tmp/sgl-site (unpacked from $SGL_PARTS) and .whl/ (carried) in /tmp/site. Limits (s): MAKE_LIMIT
# 120, RL_LIMIT 200 per run (the first SGLang start on a fresh machine JITs kernels for ~70 s). Everything is in
# $OUT/glm_shape.log, plus each run's summary.json / metrics.jsonl ($OUT/glm_<run>_summary.json, _metrics.jsonl).
# GLM_SHAPE_MAKER (a maker script taking OUT_DIR) and GLM_SHAPE_TAG (the "glm" of every file name above) let another
# GLM shape reuse this script: scripts/gpu/glm_flash_shape.sh (GLM-4.7-Flash) sets them.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
OUT=${OUT:-/tmp/slime_gpu_out}
MODEL=${MODEL:-/tmp/slime_gpu/glm45_shape}
PARTS=${1:-make,rl,replay}
STEPS=${STEPS:-4}
SGL_PARTS=${SGL_PARTS:-shared/gpu/sglang}
mkdir -p "$OUT" /tmp/slime_gpu
TAG=${GLM_SHAPE_TAG:-glm}
MAKER=${GLM_SHAPE_MAKER:-scripts/gpu/make_random_glm45.py}
LOG="$OUT/${TAG}_shape.log"
has() { [[ ",$PARTS," == *",$1,"* ]]; }

if [ -f "${SLIME_ENV_FILE:-/tmp/slime-env.sh}" ]; then
    source "${SLIME_ENV_FILE:-/tmp/slime-env.sh}"
else
    if [ ! -f /tmp/sgl-site/.complete ]; then
        echo "unpacking the SGLang site from $SGL_PARTS to /tmp/sgl-site" | tee -a "$LOG"
        mkdir -p /tmp/sgl-site && cat "$SGL_PARTS"/sgl-site-cp312.tar.xz.part* | xz -dc | tar -x -C /tmp/sgl-site \
            && touch /tmp/sgl-site/.complete || { echo "${TAG}_shape.sh: FAILED (no SGLang site)" | tee -a "$LOG"; exit 1; }
    fi
    if [ -d .whl ] && ! PYTHONPATH=/tmp/site python3 -c "import megatron.core" 2>/dev/null; then
        wheels=$(ls .whl/*.whl | grep -v -E '/(transformers|tokenizers|huggingface_hub)-')
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
    fi
    export PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site
fi
python3 -c "import sys, torch, transformers, megatron.core; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'megatron-core', megatron.core.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"
status=0

if has make; then
    echo "=== $(date +%T) make $MODEL" | tee -a "$LOG"
    timeout "${MAKE_LIMIT:-120}" python3 "$MAKER" "$MODEL" 2>&1 | grep -v -E 'Writing model shards' | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "${TAG}_shape.sh: FAILED (could not make the model)" | tee -a "$LOG"; exit 1; }
fi

rl_run() {  # rl_run NAME FLAGS...
    local name=$1; shift
    local run=/tmp/slime_gpu/${TAG}_$name
    rm -rf "$run"
    echo "=== $(date +%T) $name: $STEPS steps, megatron trainer + SGLang on one GPU $*" | tee -a "$LOG"
    timeout -k 40 "${RL_LIMIT:-200}" python3 -m slime.cli train --train-backend megatron --bf16 "$@" \
        --hf-checkpoint "$MODEL" --builtin-task arith --custom-rm-path scripts/gpu/deepseek_shape.py:reward \
        --rollout-num-gpus 1 --sglang-attention-backend triton --sglang-sampling-backend pytorch \
        --sglang-disable-cuda-graph --sglang-mem-fraction-static 0.3 --engine-startup-timeout-s 300 \
        --rollout-mode sync --rollout-batch-size 16 --over-sampling-batch-size 16 --n-samples-per-prompt 4 \
        --global-batch-size 64 --micro-batch-size 64 --rollout-max-response-len 32 --rollout-temperature 1.0 \
        --num-rollout "$STEPS" --lr 1e-5 --num-eval-prompts 16 --eval-interval 0 --seed 1 --no-progress \
        --save "$run" > "/tmp/slime_gpu/${TAG}_$name.log" 2>&1
    local rc=$?
    grep -v -E 'Writing model shards|Loading weights' "/tmp/slime_gpu/${TAG}_$name.log" | tail -n 40 >> "$LOG"
    echo "=== $name rc=$rc" | tee -a "$LOG"
    for pid in $(grep -o 'started actor-[0-9]* (pid [0-9]*)' "/tmp/slime_gpu/${TAG}_$name.log" | grep -o '[0-9]*)' | tr -d ')'); do
        kill -0 "$pid" 2>/dev/null && { echo "stopping leftover SGLang process group $pid" | tee -a "$LOG"; kill -9 -- "-$pid" 2>/dev/null; }
    done
    if [ "$rc" -ne 0 ]; then
        status=1
        for f in "$run"/logs/*.log; do [ -f "$f" ] && { echo "--- tail of $f" >> "$LOG"; tail -n 30 "$f" >> "$LOG"; }; done
    fi
    for f in summary.json metrics.jsonl; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/${TAG}_${name}_$f"; done
}

has rl && rl_run no_replay
if has replay; then
    if python3 -m slime.cli train --help 2>/dev/null | grep -q -- "--use-rollout-routing-replay"; then
        rl_run replay --use-rollout-routing-replay --sglang-enable-return-routed-experts
    else
        echo "replay: skipped (this tree's slime train has no --use-rollout-routing-replay)" | tee -a "$LOG"
    fi
fi

python3 - "$OUT" "$TAG" <<'PY' 2>&1 | tee -a "$LOG"
import json, os, sys
out, tag, result = sys.argv[1], sys.argv[2], {}
for name in ("no_replay", "replay"):
    path = os.path.join(out, f"{tag}_{name}_metrics.jsonl")
    if not os.path.exists(path):
        continue
    steps = [r for r in map(json.loads, open(path)) if r.get("kind") == "step"]
    pick = lambda key: [r.get(key) for r in steps]
    result[name] = dict(steps=len(steps), logprob_abs_diff=pick("train/train_rollout_logprob_abs_diff"),
                        logprob_abs_diff_max=pick("train/train_rollout_logprob_abs_diff_max"),
                        step_time_s=pick("step_time_s"), train_time_s=pick("train_time_s"), weight_sync_s=pick("weight_sync_s"))
    fmt = lambda xs: " ".join("-" if x is None else f"{x:.3g}" for x in xs)
    print(f"{name}: {len(steps)} steps; logprob |trainer - engine| per step: {fmt(result[name]['logprob_abs_diff'])}; "
          f"max: {fmt(result[name]['logprob_abs_diff_max'])}; step s: {fmt(result[name]['step_time_s'])}")
json.dump(result, open(os.path.join(out, f"{tag}_shape.json"), "w"), indent=1)
PY
echo "${TAG}_shape.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
