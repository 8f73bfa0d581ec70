#!/usr/bin/env bash
# Run HERE (a machine with PyPI): can this project, with its megatron and test extras, and SGLang 0.5.17 be
# installed into one environment of the GPU machine's kind (CPython 3.12, x86-64 Linux)? pip's resolver
# answers without installing anything (--dry-run) and, with fast-deps, reads each wheel's metadata by HTTP
# range requests instead of downloading it (this index advertises no PEP 658 metadata: a plain dry run
# fetched torch's 555 MB CUDA wheel). A run moves about 100 MB; the guard below stops pip if a whole
# wheel over 50 MB starts downloading.
#
#   bash scripts/gpu/check_pins.sh [REQUIREMENT...]     e.g.  megatron-core==0.16.1
#
# Extra requirements join the resolve (a version to test, or a known-bad pin to see the check fail).
# Prints the resolved versions of the packages that matter; writes $OUT/check_pins.json (resolved versions,
# requirements, pip's exit status). Exits 0 when pip finds one consistent set, 1 when it reports a conflict.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-/tmp/slime_gpu_out}
SGLANG=${SGLANG:-sglang==0.5.17}
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cp -r pyproject.toml README.md slime "$tmp/"  # build from a copy: no build/ or egg-info in the tree
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp" 2>&1 | grep -v "is ignored: it is neither"
wheel=$(ls "$tmp"/dist/slime-*.whl 2>/dev/null) || { echo "check_pins: the project wheel did not build"; exit 1; }

plat=()
for n in $(seq 17 39); do plat+=(--platform "manylinux_2_${n}_x86_64"); done  # pip matches each tag exactly
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
reqs=("$wheel[megatron,test]" "$SGLANG" "$@")
echo "check_pins: resolving for CPython 3.12 x86-64 Linux: slime[megatron,test] $SGLANG $*"
PYTHONUNBUFFERED=1 "$PY" -m pip install --dry-run --ignore-installed --use-feature=fast-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 "${plat[@]}" --target "$tmp/target" \
    --progress-bar off --report "$tmp/report.json" "${reqs[@]}" > "$tmp/pip.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do  # guard: no whole multi-GB CUDA wheels
    if grep -qE "^ *Downloading .*\(([5-9][0-9]|[0-9]{3,})(\.[0-9]+)? MB\)|GB\)" "$tmp/pip.log"; then
        kill "$pid"; echo "check_pins: pip started downloading a whole large wheel; stopped:"
        grep -E "Downloading" "$tmp/pip.log" | tail -3; exit 1
    fi
    sleep 1
done
wait "$pid"; rc=$?
grep -v "is ignored: it is neither" "$tmp/pip.log" > "$OUT/check_pins.log"

"$PY" - "$tmp/report.json" "$rc" "$OUT/check_pins.json" "${reqs[@]}" <<'EOF'
import json, os, sys
report_path, rc, out, reqs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
versions = {}
if rc == 0 and os.path.exists(report_path):
    report = json.load(open(report_path))
    versions = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}
key = ["slime", "sglang", "torch", "transformers", "tokenizers", "megatron-core", "triton", "numpy", "msgspec", "math-verify"]
result = {"requirements": [os.path.basename(r) for r in reqs], "pip_exit_status": rc, "consistent": rc == 0,
          "num_distributions": len(versions), "versions": {k: versions.get(k) for k in key}, "all_versions": versions}
json.dump(result, open(out, "w"), indent=1)
for k in key:
    print(f"  {k:14s} {versions.get(k, '-')}")
EOF
if [ "$rc" -ne 0 ]; then
    echo "--- pip's conflict report:"
    grep -vE "is ignored: it is neither|^ *(Collecting|Downloading|Obtaining|Using cached|Processing)" "$tmp/pip.log" | tail -25
fi
echo "check_pins: $([ "$rc" -eq 0 ] && echo "PASSED (one consistent set)" || echo "FAILED (pip exit $rc)")  log: $OUT/check_pins.log"
exit $(( rc != 0 ))
