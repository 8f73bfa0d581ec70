#!/usr/bin/env bash
# Run HERE (a machine with PyPI): fill .whl/ with the wheels the GPU machine lacks, for CPython 3.12 on
# x86-64 Linux. The GPU machine's image has torch 2.11, triton, numpy, sympy, pytest, hypothesis, psutil...;
# SGLang 0.5.17's site (../shared/gpu/sglang) brings transformers 5.12.1, tokenizers 0.22.2, msgspec,
# jsonschema. What neither has travels as these wheels (pip download --no-deps: every need is named):
#
#   .whl/                     megatron-core $MEGATRON_VERSION, math-verify + latex2sympy2_extended + the
#                             antlr4 runtime latex2sympy2_extended accepts, rank-bm25, pytest-asyncio, and
#                             msgspec (the version SGLang's site has, for scripts that run without that site)
#   .whl/mcore-X/             megatron-core X alone, for each other X in $MEGATRON_VERSIONS
#                             (scripts/gpu/megatron_versions.sh tests these and .whl's own)
#   .whl/build/               setuptools, which scripts/gpu/setup_env.sh builds the project's wheel with there
#                             (offline, in pip's isolated build environment: the image's setuptools may be
#                             older than the 77 that reads pyproject's `license = "Apache-2.0"`)
#   .whl/project/             with --project: this project as a wheel, built here (20 MB, mostly the demo
#                             checkpoints), used there instead of building one
#
#   .whl/ also gets liger-kernel 0.8.5 (pure Python; --logprob-impl liger; the image has triton).
#   .cutedsl/                 with SLIME_FETCH_CUTEDSL=1: the CuTe DSL that liger's SM90 (H100/H200) kernel imports:
#                             nvidia-cutlass-dsl, nvidia-cutlass-dsl-libs-base, nvidia-cutlass-dsl-libs-cu13 (92 MB
#                             alone) and apache-tvm-ffi, as one tar cut into 28 MiB cutedsl.tar.partNN (+ .sha256;
#                             CUTEDSL_PART_MB: the tracked tree is ~33 MB and a call carries 64 MiB in all).
#                             Carry .cutedsl/ one part per call (put each part in its own carried folder), each
#                             call running `bash scripts/gpu/install_cutedsl.sh .cutedsl`, which stages
#                             the parts in /tmp/cutedsl-parts and installs into /tmp/site once their join matches
#                             the sha256 (exit 3 until then), as setup_env.sh does with SGLang's parts.
#
#   MEGATRON_VERSIONS="0.16.1 0.17.1 0.18.2" bash scripts/gpu/fetch_wheels.sh [--project]
#   SLIME_FETCH_CUTEDSL=1 bash scripts/gpu/fetch_wheels.sh
#
# Carry ".whl" in the device call. Earlier contents of .whl/ are replaced. Prints each file and the total size.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MEGATRON_VERSION=${MEGATRON_VERSION:-0.19.2}
MEGATRON_VERSIONS=${MEGATRON_VERSIONS:-}
WHEELS=(
    "megatron-core==$MEGATRON_VERSION"
    math-verify==0.9.0
    latex2sympy2_extended==1.11.0      # math-verify 0.9.0 pins it
    antlr4-python3-runtime==4.13.2     # latex2sympy2_extended 1.11.0: >=4.9.3,<=4.13.2
    rank-bm25==0.2.2
    pytest-asyncio==1.5.0              # needs pytest>=8.4 (the image's)
    msgspec==0.23.0                    # = SGLang 0.5.17's site
    liger-kernel==0.8.5                # --logprob-impl liger (py3-none-any)
)
CUTEDSL_WHEELS=(                       # liger-kernel[cutedsl] 0.8.5 on CUDA 13 (the image's torch 2.11)
    nvidia-cutlass-dsl==${CUTLASS_DSL_VERSION:-4.8.1}
    nvidia-cutlass-dsl-libs-base==${CUTLASS_DSL_VERSION:-4.8.1}
    nvidia-cutlass-dsl-libs-cu13==${CUTLASS_DSL_VERSION:-4.8.1}
    apache-tvm-ffi==${TVM_FFI_VERSION:-0.1.15.post2}
)

download() {  # download DEST SPEC...: cp312 manylinux x86-64 wheels, no dependencies
    local dest=$1; shift
    local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
        "${plat[@]}" -d "$dest" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
    local spec
    for spec in "$@"; do  # pip's exit status is lost in the pipe: check that each wheel is there
        local name=${spec%%==*}
        ls "$dest" | grep -qi "^${name//-/[-_]}-${spec##*==}-" || { echo "fetch_wheels: no wheel for $spec" >&2; exit 1; }
    done
}

rm -rf .whl
mkdir -p .whl
download .whl "${WHEELS[@]}"
download .whl/build setuptools==84.2.1
for v in $MEGATRON_VERSIONS; do
    [ "$v" = "$MEGATRON_VERSION" ] && continue  # it is in .whl/ already
    download ".whl/mcore-$v" "megatron-core==$v"
done
if [[ " $* " == *" --project "* ]]; then
    tmp=$(mktemp -d)
    cp -r pyproject.toml README.md slime "$tmp/"  # build from a copy: no build/ or egg-info in the tree
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl/project "$tmp" 2>&1 | grep -v "is ignored: it is neither" || true
    rm -rf "$tmp"
    ls .whl/project/slime-*.whl >/dev/null || { echo "fetch_wheels: project wheel not built" >&2; exit 1; }
fi
if [ "${SLIME_FETCH_CUTEDSL:-0}" = 1 ]; then
    rm -rf .cutedsl && mkdir -p .cutedsl/wheels
    download .cutedsl/wheels "${CUTEDSL_WHEELS[@]}"
    tar -cf - -C .cutedsl wheels | split -b "${CUTEDSL_PART_MB:-28}M" -d - .cutedsl/cutedsl.tar.part
    cat .cutedsl/cutedsl.tar.part* | sha256sum | cut -d' ' -f1 > .cutedsl/cutedsl.tar.sha256
    rm -rf .cutedsl/wheels
    ls -l .cutedsl
fi
find .whl -type f -name '*.whl' -printf '%8k KB  %p\n' | sort -k3
echo "total: $(du -sh .whl | cut -f1)"
