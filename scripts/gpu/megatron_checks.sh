#!/usr/bin/env bash
# GPU checks of the megatron-core backend, run on the device machine from the repository root.
#
#   bash scripts/gpu/megatron_checks.sh [ab|c|m|all]    (default: all; "c" and "m" need 2 GPUs)
#
#   a  tests/gpu/megatron_logprob_parity.py   megatron vs torch-backend logprobs (bf16 mean |diff| <= 1e-2; dense vs varlen attention too),
#                                            varlen vs per-sequence SDPA, one train step, save_hf round trip
#   b  scripts/bench_megatron_mfu.py          Qwen2-0.5B shape, seq len 4096: MFU vs a measured bf16 matmul
#                                            (--profile: one more step under torch.profiler, kernel classes)
#   c  tests/gpu/megatron_parallel_loss.py    1 GPU vs TP=2 vs DP=2 (distributed optimizer) vs TP=2 + SP:
#                                            same metrics within bf16 tolerance (megatron_compare_parallel.py)
#   m  MoE (random Qwen3-MoE, 4 layers x 8 experts, top-2, aux loss 1e-2): 1 GPU vs EP=2 vs TP=2+SP with
#                                            EP=2 (ETP=1): same metrics and router metrics within bf16 tolerance,
#                                            and the weights gathered onto rank 0 under EP equal the checkpoint
#                                            bit for bit (megatron_moe_parallel.json)
#
# The image has Python 3.12, torch, transformers, triton and psutil but neither megatron-core nor
# msgspec: both travel as wheels in .whl/ (scripts/gpu/fetch_wheels.sh; carry ".whl"). The same checks in
# the environment shared with SGLang 0.5.17, once per megatron-core version: scripts/gpu/megatron_versions.sh. Results land in $OUT (5 files at most):
# checks.log, megatron_parity.json, megatron_mfu.json, megatron_mfu_profile.json,
# megatron_parallel.json (m: megatron_moe_parallel.json). Each part is bounded by `timeout` so the whole call stays under 8 minutes
# (a and b include torch.compile of the fused kernels: Inductor's cache in /tmp carries from a to b).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/slime_gpu_out}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/checks.log"
PARTS=${1:-all}

source scripts/gpu/lib.sh
install_wheels

[[ $PARTS == m ]] || run 60 python3 -c "import sys, torch, megatron.core, transformers; print(sys.version.split()[0], torch.__version__, 'megatron-core', megatron.core.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"

if [[ $PARTS == all || $PARTS == *a* ]]; then
    run 210 python3 tests/gpu/megatron_logprob_parity.py
fi
if [[ $PARTS == all || $PARTS == *b* ]]; then
    run 180 python3 scripts/bench_megatron_mfu.py --profile
fi
if [[ $PARTS == all || $PARTS == *c* ]]; then
    ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
    if [ "$ngpu" -lt 2 ]; then
        echo "part c needs 2 GPUs, found $ngpu: skipped" | tee -a "$LOG"
    else
        RUNS=/tmp/slime_gpu/parallel
        rm -rf "$RUNS"
        run 120 python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); import megatron_common as m, torch; m.make_hf_dir('/tmp/slime_gpu/small_bf16', m.SMALL, dtype=torch.bfloat16)"
        P="tests/gpu/megatron_parallel_loss.py --out-dir $RUNS"
        run 90 env CUDA_VISIBLE_DEVICES=0 python3 -m torch.distributed.run --standalone --nproc-per-node 1 $P --name single
        run 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $P --tp 2 --name tp2
        run 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $P --tp 1 --distributed-optimizer --name dp2
        run 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 $P --tp 2 --sequence-parallel --name tp2sp
        run 30 python3 tests/gpu/megatron_compare_parallel.py "$RUNS" single tp2 dp2 tp2sp
    fi
fi
if [[ $PARTS == all || $PARTS == *m* ]]; then
    ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
    if [ "$ngpu" -lt 2 ]; then
        echo "part m needs 2 GPUs, found $ngpu: skipped" | tee -a "$LOG"
    else
        RUNS=/tmp/slime_gpu/moe_parallel MOE=/tmp/slime_gpu/moe_bf16
        export SLIME_MEGATRON_COMPILE=0  # eager kernels: no compile time in each of the short runs below
        rm -rf "$RUNS"
        run 60 python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); import megatron_common as m, torch; m.make_hf_dir('$MOE', m.QWEN3_MOE_SMALL, dtype=torch.bfloat16, family='qwen3_moe')"
        P="tests/gpu/megatron_parallel_loss.py --out-dir $RUNS --model-dir $MOE --static --micro-batch-size 1 --moe-aux-loss-coeff 1e-2"
        TR="python3 -m torch.distributed.run --standalone"
        run 80 env CUDA_VISIBLE_DEVICES=0 $TR --nproc-per-node 1 $P --name moe_single
        run 80 $TR --nproc-per-node 2 $P --ep 2 --check-gather --name moe_ep2
        run 80 $TR --nproc-per-node 2 $P --tp 2 --sequence-parallel --ep 2 --etp 1 --check-gather --name moe_ep2tp2sp
        run 30 python3 tests/gpu/megatron_compare_parallel.py "$RUNS" moe_single moe_ep2 moe_ep2tp2sp --out megatron_moe_parallel.json
    fi
fi
echo "megatron_checks.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
