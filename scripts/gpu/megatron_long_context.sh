#!/usr/bin/env bash
# Long context on one GPU: one megatron-backend RL train step on a 16k-token sample at the Qwen2-1.5B
# shape (random bf16 weights), without and with full activation recomputation.
#
#   bash scripts/gpu/megatron_long_context.sh [SEQ_LEN]      (default 16384; carry ".whl")
#
# Runs tests/gpu/megatron_long_context.py twice (each bounded by `timeout`, at most 7 minutes in all
# with the model build): "plain" keeps all activations, "recompute" uses megatron-core's full
# recomputation (uniform, one layer per group). Results in $OUT: megatron_long_context_plain.json,
# megatron_long_context_recompute.json (peak memory, step time, loss, grad norm), long_context.log.
# Prints PASSED when both steps trained (finite loss and grad norm), FAILED otherwise.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/slime_gpu_out}
export OUT
SEQ=${1:-16384}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/long_context.log"

source scripts/gpu/lib.sh
if python3 -c "import megatron.core" 2>/dev/null; then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    install_wheels  # carry .whl
fi

run 240 python3 tests/gpu/megatron_long_context.py --seq-len "$SEQ" --name plain
run 180 python3 tests/gpu/megatron_long_context.py --seq-len "$SEQ" --name recompute --recompute-granularity full

if [ "$status" -eq 0 ]; then echo "PASSED: megatron long context ($SEQ tokens, Qwen2-1.5B shape)"; else echo "FAILED: megatron long context ($SEQ tokens, Qwen2-1.5B shape; see $LOG)"; fi
exit $status
