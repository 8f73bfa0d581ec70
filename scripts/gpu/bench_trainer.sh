#!/usr/bin/env bash
# The trainer benchmark (scripts/gpu/bench_trainer.py) on one GPU, run on the device machine from the repository root.
#
#   bash scripts/gpu/bench_trainer.sh [ARGS...]      (ARGS go to bench_trainer.py; default: both shapes, no profile)
#
#   bash scripts/gpu/bench_trainer.sh                                   0.5B and 1.5B shapes, megatron vs transformers
#   bash scripts/gpu/bench_trainer.sh --profile                         + one profiled RL step per backend
#   bash scripts/gpu/bench_trainer.sh --shapes qwen2.5-3b,qwen2-7b      larger shapes (7B: 4 samples; skipped if OOM)
#   bash scripts/gpu/bench_trainer.sh --backends transformers,megatron,torch   + slime's torch backend (--bf16)
#   bash scripts/gpu/bench_trainer.sh --backends transformers,megatron,megatron+swiglu_function   + a kernel candidate
#                                                                       (slime/bench/candidates.py) in the same process
#
# Workload: 16 samples x 4,096 tokens per optimizer step, 16k-token micro-batches, bf16, random
# weights, 4 warm-up steps excluded, median of 7. Needs .whl/ carried (scripts/gpu/fetch_wheels.sh:
# megatron-core, msgspec). Writes $OUT/bench_trainer.log, bench_trainer.json (and
# bench_trainer_profile.json with --profile); prints a markdown table and PASSED/FAILED.
# Bounded by BENCH_LIMIT seconds (default 450: the default run of two backends at two shapes takes about 4 minutes on one H200).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/slime_gpu_out}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/bench_trainer.log"

if ! python3 -c "import megatron.core, msgspec" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD

timeout "${BENCH_LIMIT:-450}" python3 scripts/gpu/bench_trainer.py --out "$OUT" "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "bench_trainer.sh: timed out after ${BENCH_LIMIT:-450}s" | tee -a "$LOG"
echo "bench_trainer.sh: $([ "$rc" -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit "$rc"
