#!/usr/bin/env bash
# Several GPU checks in one device call, each skipped when the call's deadline leaves too little time for it,
# with every output in one archive (a call brings back at most 8 files).
#
#   bash scripts/gpu/device_session.sh STAGE...       (from the repository root, on the device machine)
#
# Stages, in the order given (estimated seconds on a warm H200 in brackets; a stage runs only if its estimate
# fits before DEADLINE_S, default 560, counted from the start of this script, and is killed at the deadline, so
# the archive always comes back inside one 600 s call):
#   setup            scripts/gpu/setup_env.sh over the SGLang parts in $SGL_PARTS (default /tmp/parts)  [40]
#   contract         scripts/gpu/sglang_contract.sh 30100, then the server on 30100 is stopped            [90]
#   main-async       scripts/gpu/main_job_sglang.sh async (megatron eager, $STEPS steps, default 15)      [240]
#   main-colocate    scripts/gpu/main_job_sglang.sh colocate (prints engine_memory_released_gib)          [260]
#   ray-main         scripts/gpu/install_ray.sh, then main_job_sglang.sh colocate,ray-colocate: the same     [420]
#                    run in launch mode and through --ray, side by side (accuracy, start-up time;
#                    RAY_MODES=ray-colocate: the Ray run alone)
#   bench-trainer    scripts/gpu/bench_trainer.sh $BENCH_ARGS                                              [330]
#   bench-kernels    scripts/gpu/bench_kernels.py $KERNEL_ARGS                                             [70]
#   bench-fresh      bench_trainer.sh --fresh-data $FRESH_ARGS (new ragged data every step: the dense      [200]
#                    attention path's cuDNN plan builds show; default 1.5B, transformers/megatron/varlen)
#   deepseek         scripts/gpu/deepseek_shape.sh ${DEEPSEEK_PARTS:-make,rl,replay} (issue 29; RL_LIMIT 330:  [420]
#                    the first SGLang start on a fresh machine JITs for ~165 s)
#   glm / glm-flash  scripts/gpu/glm_shape.sh / glm_flash_shape.sh make,rl,replay (issue 29)                [300]
#   longtail         scripts/gpu/bench_learning_longtail.sh with what is left of the call as its deadline:  [200]
#                    SFT warm start, server and finished runs stay on a warm machine, so the next call's
#                    `longtail` runs only what is missing (issue 30; MODES, SEEDS, VARIANTS, LRS, VARIANT, LR as the script)
#   longtail-sft-bg  the long-tail warm start's SFT, started in the background (its own session: it outlives the
#                    stage and the call on a warm machine; `longtail` waits for it); log /tmp/slime_gpu/sft_bg.log  [5]
#
# Each stage writes under $OUT/STAGE/; at the end $OUT holds session.log (one line per stage: ran, rc, seconds,
# or skipped and why) and session.tgz (every stage's folder). Exit 0 when at least one stage ran and every stage
# that ran passed. Typical calls: `setup contract main-async` (~370 s), then `bench-trainer bench-kernels`.
#   START_SGLANG (default /tmp/sglb/start_sglang.sh), BENCH_ARGS (default "--steps 7 --warmup 4"), FRESH_ARGS, KERNEL_ARGS.
set -uo pipefail
export OUT_ROOT=${OUT:-/tmp/slime_gpu_out}
DEADLINE_S=${DEADLINE_S:-560}
SUMMARY="$OUT_ROOT/session.log"
mkdir -p "$OUT_ROOT"
: > "$SUMMARY"
export START_SGLANG=${START_SGLANG:-/tmp/sglb/start_sglang.sh}
failed=0

estimate() {
    case $1 in
        setup) echo 40 ;; contract) echo 90 ;; main-async) echo 240 ;; main-colocate) echo 260 ;;
        ray-main) [[ "${RAY_MODES:-colocate,ray-colocate}" == *,* ]] && echo 420 || echo 220 ;;
        bench-trainer) echo 330 ;; bench-kernels) echo 70 ;; bench-fresh) echo 200 ;;
        deepseek) echo 420 ;; glm|glm-flash) echo 300 ;; longtail) echo 200 ;; longtail-sft-bg) echo 5 ;; *) echo -1 ;;
    esac
}

stage() {  # stage NAME: run one stage with OUT=$OUT_ROOT/NAME, bounded by the time left
    local name=$1 need left t0 rc
    need=$(estimate "$name")
    if [ "$need" -lt 0 ]; then echo "$name: unknown stage" | tee -a "$SUMMARY"; failed=1; return; fi
    left=$((DEADLINE_S - SECONDS))
    if [ "$left" -lt "$need" ]; then echo "$name: skipped (${left}s left, needs ~${need}s)" | tee -a "$SUMMARY"; return; fi
    mkdir -p "$OUT_ROOT/$name"
    t0=$SECONDS
    ran=$((ran + 1))
    timeout -k 10 "$((left - 5))" bash -c "$(declare -f run_stage); run_stage $name $left" > "$OUT_ROOT/$name/stage.log" 2>&1
    rc=$?
    tail -n 15 "$OUT_ROOT/$name/stage.log"
    [ "$rc" -eq 0 ] || failed=1
    echo "$name: rc=$rc in $((SECONDS - t0))s$([ "$rc" -eq 124 ] && echo ' (killed at the deadline)')" | tee -a "$SUMMARY"
}

run_stage() {  # run_stage NAME LEFT_S, in its own shell (bounded by the caller's timeout)
    local name=$1 left=$2 rc
    export OUT="$OUT_ROOT/$name"
    [ -f /tmp/slime-env.sh ] && source /tmp/slime-env.sh
    case $name in
        setup) bash scripts/gpu/setup_env.sh "${SGL_PARTS:-/tmp/parts}" ;;
        contract) bash scripts/gpu/sglang_contract.sh 30100; rc=$?; python3 scripts/gpu/stop_port.py 30100; return $rc ;;
        # the train process's limit leaves room for the script's start-up, its 40 s kill grace and summary
        main-async) SLIME_MEGATRON_COMPILE=0 STEPS=${STEPS:-15} ASYNC_LIMIT=$((left - 90)) FIRST_MODE_EXTRA=0 \
            bash scripts/gpu/main_job_sglang.sh async ;;
        main-colocate) SLIME_MEGATRON_COMPILE=0 STEPS=${STEPS:-15} COLOCATE_LIMIT=$((left - 90)) FIRST_MODE_EXTRA=0 \
            bash scripts/gpu/main_job_sglang.sh colocate ;;
        ray-main) bash scripts/gpu/install_ray.sh || return 1
            local modes=${RAY_MODES:-colocate,ray-colocate} n=1
            [[ "$modes" == *,* ]] && n=2
            SLIME_MEGATRON_COMPILE=0 STEPS=${STEPS:-15} COLOCATE_LIMIT=$(((left - 60) / n)) RAY_LIMIT=$(((left - 60) / n)) \
                FIRST_MODE_EXTRA=0 bash scripts/gpu/main_job_sglang.sh "$modes" ;;
        bench-trainer) BENCH_LIMIT=$((left - 20)) bash scripts/gpu/bench_trainer.sh ${BENCH_ARGS:---steps 7 --warmup 4} ;;
        bench-fresh) BENCH_LIMIT=$((left - 20)) bash scripts/gpu/bench_trainer.sh --fresh-data \
            ${FRESH_ARGS:---shapes qwen2-1.5b --backends transformers,megatron,megatron+varlen_attention} ;;
        deepseek) RL_LIMIT=${RL_LIMIT:-330} bash scripts/gpu/deepseek_shape.sh "${DEEPSEEK_PARTS:-make,rl,replay}" ;;
        glm) bash scripts/gpu/glm_shape.sh make,rl,replay ;;
        glm-flash) bash scripts/gpu/glm_flash_shape.sh make,rl,replay ;;
        longtail) DEADLINE_S=$((left - 15)) bash scripts/gpu/bench_learning_longtail.sh
            local rc=$?  # the runs' metrics beside the table: why a target was missed is in them
            (cd /tmp/slime_gpu/longtail 2>/dev/null && find runs sweep -name metrics.jsonl -o -name summary.json \
                -o -name learning.json -o -name '*.log' -o -name flags -o -name 'best_*' -o -name sft.log 2>/dev/null | tar czf "$OUT/runs.tgz" -T -)
            cp /tmp/slime_gpu/longtail/sft.log "$OUT/" 2>/dev/null
            return $rc ;;
        longtail-sft-bg) mkdir -p /tmp/slime_gpu
            OUT=/tmp/slime_gpu/sft_bg SFT_ONLY=1 setsid nohup bash scripts/gpu/bench_learning_longtail.sh \
                > /tmp/slime_gpu/sft_bg.log 2>&1 < /dev/null &
            sleep 3; cat /tmp/slime_gpu/sft_bg.log ;;
        bench-kernels)
            python3 -c "import megatron.core" 2>/dev/null \
                || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
                || return 1
            PYTHONPATH=/tmp/site:$PWD timeout $((left - 10)) python3 scripts/gpu/bench_kernels.py ${KERNEL_ARGS:-} ;;
    esac
}

ran=0
for s in "$@"; do stage "$s"; done
if compgen -G "$OUT_ROOT/*/" >/dev/null; then
    (cd "$OUT_ROOT" && tar czf /tmp/session.tgz -- */) && mv /tmp/session.tgz "$OUT_ROOT/" \
        && find "$OUT_ROOT" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
fi
[ "$ran" -gt 0 ] || { failed=1; echo "device_session: no stage ran" | tee -a "$SUMMARY"; }
echo "device_session: $([ "$failed" = 0 ] && echo PASSED || echo FAILED)" | tee -a "$SUMMARY"
exit "$failed"
