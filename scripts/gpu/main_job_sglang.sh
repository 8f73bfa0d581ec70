#!/usr/bin/env bash
# The demo task (scripts/quickstart.sh's recipe, shipped arithmetic warm start) in LAUNCH mode on one
# GPU: `slime train` starts SGLang 0.5.17 itself (--rollout-num-gpus 1), the megatron trainer shares
# the GPU with it, disk weight sync. One run per mode, one after another, each bounded by `timeout`:
#
#   bash scripts/gpu/main_job_sglang.sh [sync,april,async][,colocate]     (default: sync,april,async)
#
#   sync / april / async   --rollout-mode of the run (async: pause in place + /update_weights_from_disk)
#   colocate               sync with --colocate: SGLang releases its memory while the trainer trains
#                          (--enable-memory-saver, added by the launch plan); not in the default set
#
# Per mode it prints eval accuracy before/after (200 held-out problems, greedy), the per-step
# trainer/engine logprob gap (train/train_rollout_logprob_abs_diff, and its _max when the trainer
# reports one), step and sync times, and copies summary.json and metrics.jsonl to
# $OUT/main_<mode>_summary.json / main_<mode>_metrics.jsonl; $OUT/main_sglang.json has every mode's
# numbers, $OUT/run.log the whole output (with the tail of the SGLang log of a failed mode).
# PASSED when every mode exits 0 and its accuracy after is above its accuracy before.
#
# Environment: SGLang 0.5.17's site at /tmp/sgl-site (unpacked here from $SGL_PARTS if missing) and
# the project's extra wheels (megatron-core, ...) in /tmp/site (installed here from .whl/ if present,
# without transformers/tokenizers: the SGLang server imports the same PYTHONPATH and needs the
# site's transformers 5.12.1); PYTHONPATH=/tmp/site:/tmp/sgl-site:$PWD. The first SGLang start on a
# fresh machine costs ~70 s of kernel JIT, later ones less. Limits (s): SYNC_LIMIT 220, APRIL_LIMIT
# 120, ASYNC_LIMIT 120, COLOCATE_LIMIT 150, and FIRST_MODE_EXTRA more for the first mode run (default 120
# when one mode is asked for, 0 for several: a mode run alone pays the engine's and the trainer's start-up
# and JIT; async alone reached its eval at 96 s and was cut after step 3 of 15 at 120 s on 2026-12-01);
# STEPS (20) steps per mode.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
OUT=${OUT:-/tmp/slime_gpu_out}
mkdir -p "$OUT" /tmp/slime_gpu
LOG="$OUT/run.log"
MODES=${1:-sync,april,async}
STEPS=${STEPS:-20}
SGL_PARTS=${SGL_PARTS:-shared/gpu/sglang}

if [ ! -f /tmp/sgl-site/.complete ]; then
    echo "unpacking the SGLang site from $SGL_PARTS to /tmp/sgl-site" | tee -a "$LOG"
    mkdir -p /tmp/sgl-site && cat "$SGL_PARTS"/sgl-site-cp312.tar.xz.part* | xz -dc | tar -x -C /tmp/sgl-site \
        && touch /tmp/sgl-site/.complete || { echo "main_job_sglang.sh: FAILED (no SGLang site)" | tee -a "$LOG"; exit 1; }
fi
if [ -d .whl ] && ! PYTHONPATH=/tmp/site python3 -c "import megatron.core" 2>/dev/null; then
    wheels=$(ls .whl/*.whl | grep -v -E '/(transformers|tokenizers|huggingface_hub)-')
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site

status=0
python3 -c "import sys, torch, sglang, transformers, megatron.core, msgspec; print(sys.version.split()[0], 'torch', torch.__version__, 'sglang', sglang.__version__, 'transformers', transformers.__version__, 'megatron-core', megatron.core.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "main_job_sglang.sh: FAILED (environment)" | tee -a "$LOG"; exit 1; }

COMMON=(--train-backend megatron --rollout-num-gpus 1
        --sglang-attention-backend triton --sglang-sampling-backend pytorch --sglang-disable-cuda-graph --sglang-mem-fraction-static 0.3
        --engine-startup-timeout-s 300
        --rollout-batch-size 16 --over-sampling-batch-size 32 --n-samples-per-prompt 8
        --global-batch-size 128 --micro-batch-size 128
        --rollout-max-response-len 48 --rollout-temperature 1.0
        --num-rollout "$STEPS" --lr 3e-5 --use-tis --max-staleness 4
        --num-eval-prompts 200 --eval-interval 0 --seed 1 --no-progress)

stop_leftovers() {  # a server whose slime process was SIGKILLed (timeout -k): its process group, by the pid slime logged
    local pid
    for pid in $(grep -o 'started actor-[0-9]* (pid [0-9]*)' "$1" | grep -o '[0-9]*)' | tr -d ')'); do
        if kill -0 "$pid" 2>/dev/null; then
            echo "stopping leftover SGLang process group $pid" | tee -a "$LOG"
            kill -9 -- "-$pid" 2>/dev/null
        fi
    done
}

# One mode alone gets 120 s more (start-up and JIT are all its own); the default three modes fit 600 s without.
FIRST_EXTRA=${FIRST_MODE_EXTRA:-$([[ "$MODES" == *,* ]] && echo 0 || echo 120)}
[[ "$FIRST_EXTRA" =~ ^[0-9]+$ ]] || { echo "main_job_sglang.sh: FIRST_MODE_EXTRA must be seconds, got '$FIRST_EXTRA'"; exit 2; }
run_mode() {  # run_mode NAME LIMIT_S FLAGS...
    local name=$1 limit=$(( $2 + FIRST_EXTRA )); shift 2
    FIRST_EXTRA=0
    local run=/tmp/slime_gpu/main_$name mode_log=/tmp/slime_gpu/main_$name.log
    rm -rf "$run" "$mode_log"
    echo "=== $(date +%T) mode $name (limit ${limit}s): slime train $* ${COMMON[*]} --save $run" | tee -a "$LOG"
    local t0=$SECONDS
    timeout -k 40 "$limit" python3 -m slime.cli train "$@" "${COMMON[@]}" --save "$run" > "$mode_log" 2>&1
    local rc=$?
    grep -v -E 'Writing model shards|Loading weights' "$mode_log" | tail -n 40 >> "$LOG"
    echo "=== mode $name rc=$rc after $((SECONDS - t0))s" | tee -a "$LOG"
    stop_leftovers "$mode_log"
    if [ "$rc" -ne 0 ]; then
        status=1
        for f in "$run"/logs/*.log; do [ -f "$f" ] && { echo "--- tail of $f" >> "$LOG"; tail -n 30 "$f" >> "$LOG"; }; done
    fi
    for f in summary.json metrics.jsonl; do
        [ -f "$run/$f" ] && cp "$run/$f" "$OUT/main_${name}_$f"
    done
    echo "$name $rc $((SECONDS - t0))" >> /tmp/slime_gpu/main_rcs.txt
}

has() { [[ ",$MODES," == *",$1,"* ]]; }
rm -f /tmp/slime_gpu/main_rcs.txt
has sync && run_mode sync "${SYNC_LIMIT:-220}" --rollout-mode sync
has april && run_mode april "${APRIL_LIMIT:-120}" --rollout-mode april
has async && run_mode async "${ASYNC_LIMIT:-120}" --rollout-mode async
has colocate && run_mode colocate "${COLOCATE_LIMIT:-150}" --rollout-mode sync --colocate
# the same run through Ray (issue 28): a local Ray started by the driver, trainer and server as its actors
has ray-colocate && run_mode ray_colocate "${RAY_LIMIT:-200}" --ray --ray-address local --rollout-mode sync --colocate
touch /tmp/slime_gpu/main_rcs.txt

python3 - "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import json, os, statistics, sys
out = sys.argv[1]
results, ok = {}, True
for line in open("/tmp/slime_gpu/main_rcs.txt"):
    name, rc, wall = line.split()
    res = results[name] = {"rc": int(rc), "wall_s": int(wall)}
    try:
        summary = json.load(open(f"{out}/main_{name}_summary.json"))
        recs = [json.loads(l) for l in open(f"{out}/main_{name}_metrics.jsonl")]
    except OSError:
        print(f"{name}: rc={rc}, no summary"); ok = False; continue
    steps = [r for r in recs if r.get("kind") == "step"]
    gap = [r.get("train/train_rollout_logprob_abs_diff") for r in steps]
    gap_max = [r.get("train/train_rollout_logprob_abs_diff_max") for r in steps]
    med = lambda key: statistics.median([r[key] for r in steps[1:] or steps if isinstance(r.get(key), (int, float))] or [float("nan")])
    res.update(accuracy_before=summary["eval_accuracy_before"], accuracy_after=summary["eval_accuracy_after"],
               logprob_abs_diff=gap, logprob_abs_diff_max=gap_max if any(g is not None for g in gap_max) else None,
               step_time_s_median=med("step_time_s"), train_time_s_median=med("train_time_s"), weight_sync_s_median=med("weight_sync_s"),
               rollout_wait_s_median=med("rollout_wait_s"), aborted_samples=summary["aborted_samples"],
               engine_memory_released_gib_median=med("weight_sync/engine_memory_released_gib"),  # --colocate only
               resumed_samples=summary["resumed_samples"], max_versions_in_a_trained_sample=summary["max_versions_in_a_trained_sample"],
               steps=len(steps), run_wall_time_s=summary["wall_time_s"])
    # start-up: from the command to the first eval's start (engines up, weights loaded; with --ray also
    # Ray's start and the placement): the process's wall before the run's clock, plus the run's until then
    eval0 = next((r for r in recs if r.get("kind") == "eval" and r.get("step") == 0), None)
    if eval0 is not None:
        res["startup_s"] = round(int(wall) - summary["wall_time_s"] + eval0["time_s"] - eval0.get("eval_time_s", 0), 1)
    learned = res["rc"] == 0 and None not in (res["accuracy_before"], res["accuracy_after"]) and res["accuracy_after"] > res["accuracy_before"]
    ok &= learned
    fmt = lambda xs: " ".join("-" if x is None else f"{x:.2e}" for x in xs)
    print(f"{name}: accuracy {res['accuracy_before']} -> {res['accuracy_after']} ({'learned' if learned else 'DID NOT LEARN'}), "
          f"{len(steps)} steps, step {res['step_time_s_median']:.2f}s (train {res['train_time_s_median']:.2f}s, "
          f"sync {res['weight_sync_s_median']:.3f}s), aborted/resumed {res['aborted_samples']}/{res['resumed_samples']}, wall {wall}s, "
          f"start-up {res.get('startup_s', '-')}s")
    if res["engine_memory_released_gib_median"] == res["engine_memory_released_gib_median"]:  # not NaN: a --colocate run
        print(f"  device memory freed by the engine's release: {res['engine_memory_released_gib_median']:.1f} GiB (median)")
    print(f"  logprob |trainer - engine| mean per step: {fmt(gap)}")
    if res["logprob_abs_diff_max"]:
        print(f"  logprob |trainer - engine| max per step:  {fmt(gap_max)}")
json.dump(results, open(f"{out}/main_sglang.json", "w"), indent=1)
sys.exit(0 if ok and results else 1)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "main_job_sglang.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$LOG"
exit $status
