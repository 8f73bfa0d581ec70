#!/usr/bin/env bash
# `slime bench learning` (issue 15) on the GPU machine with real SGLang 0.5.17 and the megatron trainer:
# the CPU bench's task, warm start and recipe (the addition-chain task, 8 groups x 8 samples a step,
# 200 held-out problems), one seed per mode, one process per mode, against ONE SGLang server that every
# run shares (each run first loads its initial weights into it: external engines get the run's weights).
#
#   bash scripts/gpu/bench_learning_sglang.sh [MODES]     (default: all seven; e.g. sync,april,async)
#   SGLANG_URL=http://127.0.0.1:30200 bash scripts/gpu/bench_learning_sglang.sh ...   (a server already up)
#
# The server: the chain warm start (fp32, served as float16 by --dtype auto), triton attention, no CUDA
# graphs, --disable-radix-cache (async updates pause in place: docs/ARCHITECTURE.md), 30 % of the GPU;
# started once per machine (a later call reuses it: it answers on $PORT). Each mode is bounded by
# MODE_LIMIT_S (default 150) and the script by DEADLINE_S (default 560, counted from the start): a mode that
# would start past the deadline is left for the next call. Finished modes stay in $RUNS (default
# /tmp/slime_gpu/learning, kept between calls on a warm machine) with their settings, and are not run again
# with the same settings; every call merges the modes it was asked for (`slime bench learning --merge`)
# into $OUT/learning/{learning.json,learning.txt,learning.png}.
#
# Other knobs: SGLANG_CUDA_GRAPH=1 (the server with CUDA graphs, --cuda-graph-max-bs $CUDA_GRAPH_MAX_BS, 256; without
# them if it does not start so), SGLANG_MEM_FRACTION (0.3; smaller for servers side by side), MIN_RUN_S (60: a mode starts only with this much left before the deadline),
# NUM_ROLLOUT (30), EVAL_INTERVAL (3), TARGET (0.9), SEEDS (0; e.g. 0,1), TRAIN_FLAGS (default: the megatron
# trainer on the GPU; the CPU smoke test sets the torch trainer and the embedded engine), SERVER=none
# (no SGLang: the runs use whatever TRAIN_FLAGS say). Prints "bench_learning_sglang: PASSED" when every
# mode asked for has a finished run, FAILED otherwise.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SLIME_MEGATRON_COMPILE=${SLIME_MEGATRON_COMPILE:-0}
START=$(date +%s)
OUT=${OUT:-/tmp/slime_gpu_out}
RUNS=${RUNS:-/tmp/slime_gpu/learning}
PORT=${PORT:-30200}
MODES=${1:-sync,april,async,april-mask,async-tis,async-mis,async-decoupled}
MODE_LIMIT_S=${MODE_LIMIT_S:-150}
DEADLINE_S=${DEADLINE_S:-560}
PY=${PYTHON:-python3}
MODEL=${MODEL:-$PWD/slime/data/assets/chain-warmstart}
mkdir -p "$OUT" "$RUNS"
LOG="$OUT/learning.log"
[ -d /tmp/sgl-site ] && export PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site

extra=()
if [ "${SERVER:-sglang}" != none ]; then
    if [ -z "${SGLANG_URL:-}" ]; then
        SGLANG_URL=http://127.0.0.1:$PORT
        if ! curl -sf "$SGLANG_URL/health" >/dev/null; then
            echo "=== $(date +%T) starting SGLang on $PORT: $MODEL" | tee -a "$LOG"
            start_server() {  # start_server GRAPH_FLAGS...
                timeout 300 bash "${START_SGLANG:-/tmp/sglb/start_sglang.sh}" "${PARTS:-/tmp/parts}" "$PORT" -- --model-path "$MODEL" \
                    --weight-version 0 --attention-backend triton --sampling-backend pytorch "$@" \
                    --mem-fraction-static "${SGLANG_MEM_FRACTION:-0.3}" --disable-radix-cache 2>&1 | tail -3 | tee -a "$LOG"
            }
            if [ "${SGLANG_CUDA_GRAPH:-0}" = 1 ]; then
                # decode-bound long tails: a small model's decode step is launch-bound without graphs (~6.5 ms for
                # the 24M long-tail model on the H200); graphs keep their pointers across in-place weight loads
                start_server --cuda-graph-max-bs "${CUDA_GRAPH_MAX_BS:-256}"
                curl -sf "$SGLANG_URL/health" >/dev/null || { echo "=== CUDA graphs: no server; again without" | tee -a "$LOG"
                    python3 scripts/gpu/stop_port.py "$PORT" >/dev/null 2>&1; start_server --disable-cuda-graph; }
            else
                start_server --disable-cuda-graph
            fi
            curl -sf "$SGLANG_URL/health" >/dev/null || { tail -40 "/tmp/sglang-$PORT.log" > "$OUT/learning_sglang.log"
                echo "bench_learning_sglang: FAILED (SGLang did not start)" | tee -a "$LOG"; exit 1; }
        fi
    fi
    extra=(--rollout-external-engine-addrs "${SGLANG_URL#http://}")
fi
read -r -a train_flags <<< "${TRAIN_FLAGS:---train-backend megatron --micro-batch-size 64}"

status=0
# a finished mode is reused only when it ran with these settings (steps, evals, target, flags, engine)
settings="${NUM_ROLLOUT:-30} ${EVAL_INTERVAL:-3} ${TARGET:-0.9} ${SEEDS:-0} ${MODEL} ${train_flags[*]} ${extra[*]} graphs=${SGLANG_CUDA_GRAPH:-0}"
IFS=, read -r -a mode_list <<< "$MODES"
for mode in "${mode_list[@]}"; do
    if [ -f "$RUNS/$mode/learning.json" ] && [ "$(cat "$RUNS/$mode/settings" 2>/dev/null)" = "$settings" ]; then
        echo "=== $mode: already run with these settings ($RUNS/$mode)" | tee -a "$LOG"; continue
    fi
    elapsed=$(( $(date +%s) - START ))
    if [ $(( elapsed + ${MIN_RUN_S:-60} )) -gt "$DEADLINE_S" ]; then
        echo "=== $mode: left for the next call (${elapsed}s of ${DEADLINE_S}s used)" | tee -a "$LOG"; status=1; continue
    fi
    limit=$(( DEADLINE_S - elapsed < MODE_LIMIT_S ? DEADLINE_S - elapsed : MODE_LIMIT_S ))
    rm -rf "${RUNS:?}/$mode"
    echo "=== $(date +%T) $mode (limit ${limit}s)" | tee -a "$LOG"
    t0=$(date +%s)
    timeout -k 20 "$limit" "$PY" -m slime.cli bench learning --modes "$mode" --seeds "${SEEDS:-0}" --num-rollout "${NUM_ROLLOUT:-30}" \
        --eval-interval "${EVAL_INTERVAL:-3}" --target-accuracy "${TARGET:-0.9}" --out "$RUNS/$mode" \
        -- "${train_flags[@]}" "${extra[@]}" > "$RUNS/$mode.log" 2>&1
    rc=$?
    grep -E '^\[|error|Error' "$RUNS/$mode.log" | tail -n 6 | tee -a "$LOG"
    echo "=== $mode: rc=$rc after $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
    if [ "$rc" -ne 0 ]; then
        status=1; tail -n 30 "$RUNS/$mode.log" >> "$LOG"; rm -f "$RUNS/$mode/learning.json"
    else
        echo "$settings" > "$RUNS/$mode/settings"
    fi
done

done_files=""  # the modes asked for, each finished with these settings
for mode in "${mode_list[@]}"; do
    if [ -f "$RUNS/$mode/learning.json" ] && [ "$(cat "$RUNS/$mode/settings" 2>/dev/null)" = "$settings" ]; then
        done_files="$done_files $RUNS/$mode/learning.json"
    else
        status=1
    fi
done
if [ -n "$done_files" ]; then
    "$PY" -m slime.cli bench learning --merge $done_files --out "$OUT/learning" 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    status=1
fi
echo "bench_learning_sglang: $([ $status -eq 0 ] && echo PASSED || echo FAILED) ($(( $(date +%s) - START ))s)" | tee -a "$LOG"
exit $status
