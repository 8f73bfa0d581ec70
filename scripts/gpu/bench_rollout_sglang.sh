#!/usr/bin/env bash
# The long-tail rollout benchmark on a real SGLang 0.5.17 (issue 13, item 7), on the device machine,
# from the repository root: sync vs APRIL vs async against ONE server, then the simulated engine
# calibrated to the decode cost measured in the same run.
#
#   bash scripts/gpu/bench_rollout_sglang.sh           # makes the model, starts SGLang, runs the bench
#   SGLANG_URL=http://127.0.0.1:30000 bash scripts/gpu/bench_rollout_sglang.sh   # a server already up,
#       started on $MODEL_DIR (default /tmp/qwen2-0.5b-random) with --max-running-requests $CAP
#
# Needs: SGLang's site parts in $PARTS (default /tmp/parts) and .sgl/b/start_sglang.sh (when it starts
# the server); our extra wheels in /tmp/site. Time: model ~20 s, server start ~130 s on a fresh machine
# (kernel JIT) + ~45 s CUDA-graph capture, bench ~4 min (probe ~10 s, real modes ~165 s, simulated
# modes at time scale 3 ~60 s). Run it in one call with a 600 s limit, or start the server first
# (START_ONLY=1, ~240 s) and run the bench in a second call with SGLANG_URL (~270 s).
#
# CUDA graphs are ON (CUDA_GRAPH=0 turns them off): without them a decode step of this 24-layer model
# is bound by kernel launches on the CPU, which is neither the production setting nor the cost the
# simulator is calibrated to (1.98 ms/step at 1 running, 4.44 ms at 256 with graphs); the ~45 s
# capture happens once, at server start, outside the timed run.
#
# Workload (flags below; see docs/benchmarks.md for the reasoning): response lengths log-normal,
# median 300, p99 3,000, cap 4,800 tokens (the standard shape, median : p99 : cap = 1 : 10 : 16,
# scaled so a sync step is ~13 s), enforced per request (max_new_tokens from the draw, ignore_eos);
# 16 groups x 8 samples per step (128 samples on an engine of 256 slots), 8 steps; train step 2 s
# (a 0.5B model trains ~63k tokens in ~1-2 s on an H200); a real /update_weights_from_disk of the
# model dir after every step; april 32 groups in flight (2x), async 48 groups in flight, eta 4.
#
# Server flags: --skip-tokenizer-init (with its tokenizer loaded, SGLang 0.5.17 crashed at its warm-up on
# this model: "cannot reshape tensor of 0 elements" in the rotary embedding, H200 2026-12-01; the bench
# sends token ids and needs no text) and --disable-radix-cache (async updates pause in place; with a
# prefix cache every update would abort and flush instead, docs/ARCHITECTURE.md).
#
# Results in $OUT: bench_rollout_sglang.json, bench_rollout_sglang.png, bench.log, sglang.log.
# Prints PASSED when every mode ran, each delivered sample had exactly its drawn length and april
# >= 2.0x, async >= 3.0x sync delivered tokens/s; FAILED otherwise (the table says which).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/slime_gpu_out}
PARTS=${PARTS:-/tmp/parts}
PORT=${PORT:-30000}
CAP=${CAP:-256}
MODEL_DIR=${MODEL_DIR:-/tmp/qwen2-0.5b-random}
mkdir -p "$OUT"
LOG="$OUT/bench.log"

# The model is made with SGLang's transformers (5.12.1) when its site is unpacked, else the image's.
site=""; [ -f /tmp/sgl-site/.complete ] && site=/tmp/sgl-site
echo "=== $(date +%T) model: $MODEL_DIR" | tee -a "$LOG"
timeout 300 env PYTHONPATH="$site" python3 scripts/gpu/make_random_qwen2.py "$MODEL_DIR" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: could not make the model"; exit 1; }

if [ -z "${SGLANG_URL:-}" ]; then
    graph_args=(--cuda-graph-max-bs "$CAP")
    [ "${CUDA_GRAPH:-1}" = 0 ] && graph_args=(--disable-cuda-graph)
    echo "=== $(date +%T) starting SGLang on port $PORT" | tee -a "$LOG"
    timeout 420 bash "${START_SGLANG:-/tmp/sglb/start_sglang.sh}" "$PARTS" "$PORT" -- --model-path "$MODEL_DIR" --dtype bfloat16 \
        --attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 \
        --skip-tokenizer-init --disable-radix-cache \
        --max-running-requests "$CAP" "${graph_args[@]}" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    cp "/tmp/sglang-$PORT.log" "$OUT/sglang.log" 2>/dev/null
    [ "$rc" -eq 0 ] || { echo "FAILED: SGLang did not start (log: $OUT/sglang.log)"; exit 1; }
    SGLANG_URL=http://127.0.0.1:$PORT
    [ "${START_ONLY:-0}" = 1 ] && { echo "PASSED: SGLang ready at $SGLANG_URL (START_ONLY)"; exit 0; }
fi

echo "=== $(date +%T) bench against $SGLANG_URL" | tee -a "$LOG"
timeout 480 env PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site python3 -m slime.bench.rollout \
    --engine-urls "$SGLANG_URL" --weights-path "$MODEL_DIR" --max-running-requests "$CAP" \
    --steps 8 --median 300 --p99 3000 --max-len 4800 --rollout-batch-size 16 --n-samples-per-prompt 8 --train-s 2 \
    --april-over-sampling 32 --async-capacity 48 --async-max-staleness 4 \
    --calibrate-sim --time-scale 3 --overhead-samples 0 --http-requests 0 --strict \
    --json "$OUT/bench_rollout_sglang.json" --png "$OUT/bench_rollout_sglang.png" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
cp "/tmp/sglang-${SGLANG_URL##*:}.log" "$OUT/sglang.log" 2>/dev/null
curl -sf "$SGLANG_URL/health" >/dev/null && echo "SGLang still healthy after the run" | tee -a "$LOG" \
    || echo "SGLang NOT healthy after the run (see $OUT/sglang.log)" | tee -a "$LOG"
if [ "$rc" -eq 0 ] && [ -f "$OUT/bench_rollout_sglang.json" ]; then
    echo "PASSED: bench_rollout_sglang (targets met; table above)"
else
    echo "FAILED: bench_rollout_sglang rc=$rc (124: timeout; 1 with the JSON written: a target missed, see the table)"
    exit 1
fi
