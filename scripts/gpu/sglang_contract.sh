#!/usr/bin/env bash
# The real-SGLang contract suite (tests/e2e/test_sglang_contract.py, sglang backend) on the GPU machine.
#
#   bash scripts/gpu/sglang_contract.sh [PORT]        (default 30100)
#
# Needs: the SGLang 0.5.17 site unpacked at /tmp/sgl-site (scripts/gpu/setup_env.sh, or start_sglang.sh once),
# our extra wheels installed in /tmp/site (pytest-asyncio at least). Makes the contract model in /tmp, starts
# one SGLang server on it (bf16, triton attention, no CUDA graphs, 25 % of the GPU) unless one already answers
# on PORT, runs the suite against it and writes to $OUT: contract.log (pytest output), sglang_bodies.json
# (the raw response bodies, for tests/engines/data/sglang_bodies.json) and sglang_server.log (its tail).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-/tmp/slime_gpu_out}
PORT=${1:-30100}
MODEL=/tmp/slime_contract_model
mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site
START=${START_SGLANG:-.sgl/b/start_sglang.sh}

if ! curl -sf "127.0.0.1:$PORT/health_generate" >/dev/null; then
    [ -f "$MODEL/config.json" ] || timeout 120 python3 -c "
from tests.fixtures.tiny_model import contract_model_dir
print(contract_model_dir('$MODEL', gpu=True))" || { echo "FAILED: could not write the contract model"; exit 1; }
    timeout 400 bash "$START" /tmp/parts "$PORT" -- --model-path "$MODEL" --weight-version 0 --dtype bfloat16 \
        --attention-backend triton --sampling-backend pytorch --disable-cuda-graph --mem-fraction-static 0.25 \
        || { tail -50 "/tmp/sglang-$PORT.log" > "$OUT/sglang_server.log"; echo "FAILED: SGLang did not start"; exit 1; }
fi
SLIME_SGLANG_URL="http://127.0.0.1:$PORT" SLIME_SGLANG_MODEL="$MODEL" SLIME_CONTRACT_RECORD="$OUT/sglang_bodies.json" \
    timeout 420 python3 -m pytest tests/e2e/test_sglang_contract.py -k sglang -m gpu -o addopts="" -p no:cacheprovider \
    -o filterwarnings=default --timeout 150 -v -rA -s 2>&1 | tee "$OUT/contract.log"
rc=${PIPESTATUS[0]}
tail -200 "/tmp/sglang-$PORT.log" > "$OUT/sglang_server.log" 2>/dev/null
curl -sf "127.0.0.1:$PORT/health_generate" >/dev/null && echo "server alive after the suite" || echo "server NOT answering after the suite"
echo "sglang_contract.sh: $([ "$rc" -eq 0 ] && echo PASSED || echo FAILED)"
exit "$rc"
