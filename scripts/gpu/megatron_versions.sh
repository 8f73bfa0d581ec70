#!/usr/bin/env bash
# On the GPU machine, from the repository root: the megatron GPU parity check (tests/gpu/megatron_logprob_parity.py:
# bf16 and fp32 logprobs vs transformers, one train step, save_hf round trip) once per megatron-core version,
# each in the one GPU environment (scripts/gpu/setup_env.sh: SGLang 0.5.17's transformers 5.12.1 on the path).
#
#   bash scripts/gpu/megatron_versions.sh [PARTS_DIR...]      (PARTS_DIR: as setup_env.sh; default .sgl)
#
# Versions, newest first: .whl's own megatron-core (installed in /tmp/site by setup_env.sh) and one per carried
# .whl/mcore-X/ folder (MEGATRON_VERSIONS="0.16.1 0.17.1 0.18.2" bash scripts/gpu/fetch_wheels.sh makes them),
# each installed into its own /tmp/mcore-X and put first on PYTHONPATH; the loaded megatron.core is checked. SLIME_MEGATRON_COMPILE=0: eager kernels, so no version spends its time in torch.compile
# (the compiled path is megatron_checks.sh's). Each run is bounded by VERSION_LIMIT_S (default 75) and the whole
# script by DEADLINE_S (default 330, counted from the start, setup included): a version that would start past
# the deadline is recorded as skipped. Results: $OUT/megatron_versions.json ({version: passed, rc, wall_s, the
# loaded megatron.core, the parity checks and diffs}), $OUT/megatron_versions.log and setup_env.sh's
# $OUT/setup_env.json and setup_env.log; the last line is
# "megatron_versions: PASSED" (every version passed) or "megatron_versions: FAILED".
set -uo pipefail
START=$(date +%s)
OUT=${OUT:-/tmp/slime_gpu_out}
VERSION_LIMIT_S=${VERSION_LIMIT_S:-75}
DEADLINE_S=${DEADLINE_S:-330}
mkdir -p "$OUT"
LOG="$OUT/megatron_versions.log"

OUT="$OUT" bash scripts/gpu/setup_env.sh "$@" > /dev/null 2>&1  # its own $OUT/setup_env.{json,log}
setup_rc=$?
tail -4 "$OUT/setup_env.log" | tee -a "$LOG"
# 1: the environment is there but one of its checks failed: the versions still run, the result is FAILED
[ "$setup_rc" -le 1 ] || { echo "megatron_versions: FAILED (setup_env.sh exit $setup_rc)" | tee -a "$LOG"; exit 1; }
source "${SLIME_ENV_FILE:-/tmp/slime-env.sh}"
export PYTHONUNBUFFERED=1 SLIME_MEGATRON_COMPILE=0
BASE_PYTHONPATH=$PYTHONPATH

SITE=${SLIME_SITE:-/tmp/site}
default=$(python3 -c "import importlib.metadata as md; print(md.version('megatron-core'))" 2>/dev/null)  # .whl's, in $SITE
versions=$( (ls -d .whl/mcore-*/ 2>/dev/null | sed 's#.whl/mcore-##; s#/##'; echo "$default") | grep . | sort -ruV)
[ -n "$versions" ] || { echo "megatron_versions: FAILED (no megatron-core in .whl/)" | tee -a "$LOG"; exit 1; }
RUNS=/tmp/mcore-runs
rm -rf "$RUNS"; mkdir -p "$RUNS"
# the parity check's random checkpoints, made once, outside the versions' time limits
timeout 120 python3 -c "import sys, torch; sys.path.insert(0, 'tests/gpu'); import megatron_common as m
m.make_hf_dir('/tmp/slime_gpu/small_bf16', m.SMALL, dtype=torch.bfloat16); m.make_hf_dir('/tmp/slime_gpu/small_fp32', m.SMALL, dtype=torch.float32)" >> "$LOG" 2>&1 \
    || echo "=== could not make the random checkpoints first; each run makes them itself" | tee -a "$LOG"
for v in $versions; do
    elapsed=$(( $(date +%s) - START ))
    if [ $(( elapsed + 40 )) -gt "$DEADLINE_S" ]; then
        echo "=== megatron-core $v: skipped (${elapsed}s of ${DEADLINE_S}s used)" | tee -a "$LOG"
        echo '{"skipped": true}' > "$RUNS/$v.json"
        continue
    fi
    limit=$(( DEADLINE_S - elapsed < VERSION_LIMIT_S ? DEADLINE_S - elapsed : VERSION_LIMIT_S ))
    if [ "$v" = "$default" ]; then  # already in $SITE
        home=$SITE
        export PYTHONPATH=$BASE_PYTHONPATH
    else
        home=/tmp/mcore-$v
        rm -rf "$home"
        if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$home" ".whl/mcore-$v"/*.whl >> "$LOG" 2>&1; then
            echo "=== megatron-core $v: pip install failed" | tee -a "$LOG"
            echo '{"rc": -1, "install_failed": true}' > "$RUNS/$v.json"
            continue
        fi
        export PYTHONPATH="$home:$BASE_PYTHONPATH"
    fi
    loaded=$(timeout 60 python3 -c "import megatron.core as m; print(m.__version__, m.__file__)" 2>/dev/null | tail -1)
    mkdir -p "$RUNS/$v"
    echo "=== $(date +%T) megatron-core $v (loaded: $loaded), limit ${limit}s" | tee -a "$LOG"
    t0=$(date +%s)
    OUT="$RUNS/$v" timeout "$limit" python3 tests/gpu/megatron_logprob_parity.py >> "$LOG" 2>&1
    rc=$?
    echo "=== megatron-core $v: rc=$rc after $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
    printf '{"rc": %d, "wall_s": %d, "loaded": "%s", "expected": "%s"}\n' "$rc" "$(( $(date +%s) - t0 ))" "$loaded" "$v $home/" > "$RUNS/$v.json"
done
export PYTHONPATH=$BASE_PYTHONPATH

python3 - "$RUNS" "$OUT/megatron_versions.json" "$setup_rc" $versions <<'EOF' | tee -a "$LOG"
import json, os, sys

runs, out, setup_rc, versions = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
summary = {}
for v in versions:
    run = json.load(open(os.path.join(runs, f"{v}.json")))
    parity_path = os.path.join(runs, v, "megatron_parity.json")
    parity = json.load(open(parity_path)) if os.path.exists(parity_path) else None
    loaded_ok = "expected" in run and run.get("loaded", "").startswith(run["expected"])  # that version, from its folder
    passed = bool(not run.get("skipped") and run["rc"] == 0 and parity and parity.get("passed") and loaded_ok)
    summary[v] = {"passed": passed, **run, "loaded_ok": loaded_ok,
                  "parity": {k: parity.get(k) for k in ("checks", "bf16", "fp32", "saved_after_step", "train_step", "wall_s")} if parity else None}
    print(f"  megatron-core {v}: {'passed' if passed else 'skipped' if run.get('skipped') else 'FAILED'}"
          + (f"  bf16 mean |diff| {parity['bf16']['mean_abs_diff']:.2e}, fp32 {parity['fp32']['mean_abs_diff']:.2e}" if parity else ""))
json.dump({"setup_env_passed": setup_rc == 0, "versions": summary,
           "all_passed": setup_rc == 0 and all(s["passed"] for s in summary.values())}, open(out, "w"), indent=1)
EOF
ok=$(python3 -c "import json; print(int(json.load(open('$OUT/megatron_versions.json'))['all_passed']))")
echo "megatron_versions: $([ "$ok" = 1 ] && echo PASSED || echo FAILED) ($(( $(date +%s) - START ))s)" | tee -a "$LOG"
[ "$ok" = 1 ]
