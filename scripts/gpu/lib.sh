# Shared by the GPU scripts (source it after setting LOG): the project's extra wheels and a logged, bounded step.
#
#   install_wheels        .whl/*.whl -> /tmp/site (no index, no deps); PYTHONPATH=/tmp/site:$PWD. Exits 1 on failure.
#   run LIMIT_S CMD...    run CMD under `timeout LIMIT_S`, its output and rc appended to $LOG; a failure sets status=1.
status=0

install_wheels() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
}

run() {
    local limit=$1; shift
    echo "=== $(date +%T) $*" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== rc=$rc" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || status=1
}
