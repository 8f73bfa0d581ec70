#!/usr/bin/env bash
# A DeepSeek-V3-shaped model (MLA, 64 sigmoid-routed experts in 8 groups, 2 shared experts, first layer dense,
# YaRN; 1.28 B parameters, 0.27 B active; scripts/gpu/deepseek_shape.py) on one H200, run from the repository root:
#
#   source /tmp/slime-env.sh; bash scripts/gpu/deepseek_shape.sh [make][,rl][,replay][,bench]   (default: all; ~7 min)
#
#   make   random bf16 weights + word tokenizer + prompts in $MODEL (/tmp/slime_gpu/deepseek_shape; ~1 min, kept)
#   rl     slime train --train-backend megatron with real SGLang 0.5.17 started by slime on the same GPU
#          (--attention-backend triton: the MLA backend that runs in this site, which has no FA3 library and
#          whose flashinfer backends JIT for minutes), --rollout-mode sync, $STEPS (3) steps, disk weight sync
#          after every step; prints and writes the per-step trainer/engine logprob gap ($OUT/deepseek_rl.json)
#          and copies the run's summary.json / metrics.jsonl ($OUT/deepseek_rl_summary.json, _metrics.jsonl)
#   replay the same run with --use-rollout-routing-replay (slime starts SGLang with --enable-return-routed-experts;
#          the trainer replays the engine's experts): $OUT/deepseek_replay.json, deepseek_replay_summary.json /
#          _metrics.jsonl, and one line with both runs' per-step gaps side by side
#   bench  the trainer-benchmark row: RL step (old-logprob pass + train step) and MFU of plain transformers
#          (DeepseekV3ForCausalLM, SDPA, bf16 autocast, fused AdamW) and of the megatron backend on the same 8 x
#          2,048-token random samples, 1 warm-up step excluded, median of 2 ($OUT/deepseek_bench.json)
#
# Environment: /tmp/slime-env.sh (scripts/gpu/setup_env.sh, an earlier call) when it exists; else as
# scripts/gpu/main_job_sglang.sh: SGLang's site at /tmp/sgl-site (unpacked from $SGL_PARTS if missing), the
# project's wheels (.whl/, carried) in /tmp/site without transformers/tokenizers (the site's transformers 5.12.1
# serves both processes). Limits (s): MAKE_LIMIT 120, RL_LIMIT 240, BENCH_LIMIT 120 (about 5 minutes in all when
# the machine has started SGLang before, up to 8 on a fresh one: the first SGLang start JITs kernels);
# $OUT/deepseek_shape.log has everything (and the tail of the SGLang log when the run fails).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
OUT=${OUT:-/tmp/slime_gpu_out}
MODEL=${MODEL:-/tmp/slime_gpu/deepseek_shape}
PARTS=${1:-make,rl,replay,bench}
STEPS=${STEPS:-3}
SGL_PARTS=${SGL_PARTS:-shared/gpu/sglang}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/deepseek_shape.log"
has() { [[ ",$PARTS," == *",$1,"* ]]; }

if [ -f "${SLIME_ENV_FILE:-/tmp/slime-env.sh}" ]; then  # scripts/gpu/setup_env.sh ran in an earlier call
    source "${SLIME_ENV_FILE:-/tmp/slime-env.sh}"
else
    if { has rl || has replay; } && [ ! -f /tmp/sgl-site/.complete ]; then
        echo "unpacking the SGLang site from $SGL_PARTS to /tmp/sgl-site" | tee -a "$LOG"
        mkdir -p /tmp/sgl-site && cat "$SGL_PARTS"/sgl-site-cp312.tar.xz.part* | xz -dc | tar -x -C /tmp/sgl-site \
            && touch /tmp/sgl-site/.complete || { echo "deepseek_shape.sh: FAILED (no SGLang site)" | tee -a "$LOG"; exit 1; }
    fi
    if [ -d .whl ] && ! PYTHONPATH=/tmp/site python3 -c "import megatron.core" 2>/dev/null; then
        wheels=$(ls .whl/*.whl | grep -v -E '/(transformers|tokenizers|huggingface_hub)-')
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
    fi
    site=""; [ -f /tmp/sgl-site/.complete ] && site=:/tmp/sgl-site
    export PYTHONPATH=$PWD:/tmp/site$site
fi
python3 -c "import sys, torch, transformers, megatron.core; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'megatron-core', megatron.core.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"
status=0

if has make; then
    echo "=== $(date +%T) make $MODEL" | tee -a "$LOG"
    timeout "${MAKE_LIMIT:-120}" python3 scripts/gpu/deepseek_shape.py make "$MODEL" 2>&1 | grep -v -E 'Writing model shards' | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "deepseek_shape.sh: FAILED (could not make the model)" | tee -a "$LOG"; exit 1; }
fi

rl_run() {  # rl_run NAME FLAGS...: one RL run, its files under $OUT as deepseek_NAME*
    local name=$1; shift
    local run=/tmp/slime_gpu/deepseek_$name
    rm -rf "$run"
    echo "=== $(date +%T) $name: $STEPS steps, megatron trainer + SGLang (triton MLA) on one GPU $*" | tee -a "$LOG"
    timeout -k 40 "${RL_LIMIT:-240}" python3 -m slime.cli train --train-backend megatron --bf16 "$@" \
        --hf-checkpoint "$MODEL" --prompt-data "$MODEL/prompts.jsonl" --input-key prompt \
        --custom-rm-path scripts/gpu/deepseek_shape.py:reward \
        --rollout-num-gpus 1 --sglang-attention-backend triton --sglang-sampling-backend pytorch \
        --sglang-disable-cuda-graph --sglang-mem-fraction-static 0.3 --engine-startup-timeout-s 300 \
        --rollout-mode sync --rollout-batch-size 8 --over-sampling-batch-size 8 --n-samples-per-prompt 4 \
        --global-batch-size 32 --micro-batch-size 32 --use-dynamic-batch-size --max-tokens-per-gpu 8192 \
        --rollout-max-response-len 64 --rollout-temperature 1.0 --num-rollout "$STEPS" --lr 1e-5 \
        --num-eval-prompts 16 --eval-interval 0 --seed 1 --no-progress --save "$run" > "$run.log" 2>&1
    local rc=$?
    grep -v -E 'Writing model shards|Loading weights' "$run.log" | tail -n 40 >> "$LOG"
    echo "=== $name rc=$rc" | tee -a "$LOG"
    for pid in $(grep -o 'started actor-[0-9]* (pid [0-9]*)' "$run.log" | grep -o '[0-9]*)' | tr -d ')'); do
        kill -0 "$pid" 2>/dev/null && { echo "stopping leftover SGLang process group $pid" | tee -a "$LOG"; kill -9 -- "-$pid" 2>/dev/null; }
    done
    if [ "$rc" -ne 0 ]; then
        status=1
        for f in "$run"/logs/*.log; do [ -f "$f" ] && { echo "--- tail of $f" >> "$LOG"; tail -n 30 "$f" >> "$LOG"; }; done
    fi
    for f in summary.json metrics.jsonl; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/deepseek_${name}_$f"; done
    if [ -f "$run/metrics.jsonl" ]; then
        python3 scripts/gpu/deepseek_shape.py summarize "$run" --out "$OUT" --name "$name" 2>&1 | tee -a "$LOG"
    fi
}

has rl && rl_run rl
has replay && rl_run replay --use-rollout-routing-replay
if [ -f "$OUT/deepseek_rl.json" ] && [ -f "$OUT/deepseek_replay.json" ]; then
    python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, os, sys
runs = {n: json.load(open(os.path.join(sys.argv[1], f"deepseek_{n}.json"))) for n in ("rl", "replay")}
fmt = lambda xs: " ".join("-" if x is None else f"{x:.3g}" for x in xs)
for key in ("logprob_abs_diff", "logprob_abs_diff_max"):
    print(f"{key} per step: without replay {fmt(runs['rl'][key])} | with replay {fmt(runs['replay'][key])}")
PY
fi

if has bench; then
    echo "=== $(date +%T) bench: transformers vs megatron RL step" | tee -a "$LOG"
    timeout "${BENCH_LIMIT:-120}" python3 scripts/gpu/deepseek_shape.py bench "$MODEL" --out "$OUT" 2>&1 \
        | grep -v -E 'Loading weights' | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "deepseek_shape.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
