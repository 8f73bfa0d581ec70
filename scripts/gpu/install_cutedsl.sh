#!/usr/bin/env bash
# On the GPU machine, after setup_env.sh: install the CuTe DSL wheels (liger-kernel's SM90 kernel, for
# --logprob-impl liger on H100/H200) from the parts that `SLIME_FETCH_CUTEDSL=1 scripts/gpu/fetch_wheels.sh`
# wrote to .cutedsl/ (cutedsl.tar.partNN + cutedsl.tar.sha256), carried over several device calls:
#
#   bash scripts/gpu/install_cutedsl.sh [PARTS_DIR]      (default .cutedsl)
#
# Each call stages the parts it finds in /tmp/cutedsl-parts; once their join matches the sha256 it unpacks
# and pip-installs them into /tmp/site (--no-index --no-deps) and checks `import cutlass`. Exit 0: installed
# (or already); 3: parts staged, more needed; 1: failed. Last line: "install_cutedsl: PASSED|FAILED|PARTIAL".
set -uo pipefail
DIR=${1:-.cutedsl} STAGE=/tmp/cutedsl-parts SITE=${SLIME_SITE:-/tmp/site}
mkdir -p "$STAGE"
[ -f "$SITE/.cutedsl-complete" ] && { echo "install_cutedsl: PASSED (already installed)"; exit 0; }
for f in "$DIR"/cutedsl.tar.part* "$DIR"/cutedsl.tar.sha256; do [ -f "$f" ] && cp "$f" "$STAGE"/; done
[ -f "$STAGE/cutedsl.tar.sha256" ] || { echo "install_cutedsl: PARTIAL: no cutedsl.tar.sha256 yet (carry it)"; exit 3; }
parts=$(ls "$STAGE"/cutedsl.tar.part* 2>/dev/null | sort -V)
if [ -z "$parts" ] || [ "$(cat $parts | sha256sum | cut -d' ' -f1)" != "$(cat "$STAGE/cutedsl.tar.sha256")" ]; then
    echo "install_cutedsl: PARTIAL: staged $(cd "$STAGE" && echo *); carry the missing parts in the next call"
    exit 3
fi
tmp=$(mktemp -d)
cat $parts | tar -xf - -C "$tmp" || { echo "install_cutedsl: FAILED: could not unpack"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$tmp"/wheels/*.whl \
    || { echo "install_cutedsl: FAILED: pip install"; exit 1; }
rm -rf "$tmp"
PYTHONPATH="$SITE:${PYTHONPATH:-}" python3 -c "import cutlass, tvm_ffi; print('cutlass', cutlass.__version__ if hasattr(cutlass, '__version__') else '?')" \
    || { echo "install_cutedsl: FAILED: import cutlass"; exit 1; }
touch "$SITE/.cutedsl-complete"
echo "install_cutedsl: PASSED"
