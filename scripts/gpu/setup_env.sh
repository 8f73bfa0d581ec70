#!/usr/bin/env bash
# On the GPU machine, from the repository root: THE environment in which the project runs next to SGLang 0.5.17
# (Python 3.12, the image's torch 2.11, SGLang's transformers 5.12.1 and tokenizers 0.22.2, megatron-core).
#
#   bash scripts/gpu/setup_env.sh [PARTS_DIR...]          (default PARTS_DIR: .sgl)
#   source /tmp/slime-env.sh                               (in each later command of the same machine)
#
# 1. SGLang's site -> /tmp/sgl-site, unpacked once from sgl-site-cp312.tar.xz.part* (../shared/gpu/sglang/).
#    Parts found in the PARTS_DIRs are staged in /tmp/sgl-parts first, so the parts can come in over two
#    calls (the tree plus all parts exceed one call's 64 MiB): a call that stages an incomplete set exits 3.
#    Skipped when /tmp/sgl-site/.complete exists (start_sglang.sh uses the same marker and directory).
# 2. /tmp/site <- .whl/*.whl (scripts/gpu/fetch_wheels.sh) and this project as a wheel (.whl/project/ if
#    carried, else built here from the tree with .whl/build's setuptools), by pip install --no-index --no-deps
#    --target.
# 3. Checks, from outside the tree (so `slime` is the installed wheel): imports and versions of torch,
#    transformers, tokenizers, sglang, megatron.core, slime; every requirement of slime[megatron,test] is met;
#    sglang's torch and transformers pins are met; `pip check` over PYTHONPATH's distributions, where a
#    problem that names one of /tmp/site's distributions fails the check. SGLang's site is a partial install
#    (54 of its dependencies): its own missing or mismatched requirements are listed, not failed.
# 4. Writes /tmp/slime-env.sh: PYTHONPATH=$PWD:/tmp/site:/tmp/sgl-site (the carried tree's code first, so an
#    edited file needs no reinstall), HF offline, NVLink multicast off.
#
# Results: $OUT/setup_env.json (versions, checks, pip check lines by kind) and $OUT/setup_env.log; the last
# line says "setup_env: PASSED" or "setup_env: FAILED". Exit 0: passed; 1: built, a check failed; 2: not built;
# 3: parts staged, more needed. About 30 s on a fresh machine, 10 s after.
# SLIME_SITE, SGL_SITE, SGL_PARTS_STAGE, SLIME_ENV_FILE move /tmp/site, /tmp/sgl-site, /tmp/sgl-parts, /tmp/slime-env.sh.
set -uo pipefail
REPO=$PWD
OUT=$(mkdir -p "${OUT:-/tmp/slime_gpu_out}" && cd "${OUT:-/tmp/slime_gpu_out}" && pwd)  # absolute: the checks run elsewhere
SGL_SITE_SHA256=${SGL_SITE_SHA256:-9d185b8b2f3f753e9fbd5713b4c4691a36672a5f0acffca54f35db670372dda7}
SITE=${SLIME_SITE:-/tmp/site} SGL=${SGL_SITE:-/tmp/sgl-site} STAGE=${SGL_PARTS_STAGE:-/tmp/sgl-parts} ENV_FILE=${SLIME_ENV_FILE:-/tmp/slime-env.sh}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
fail() { echo "setup_env: FAILED: $*"; exit 2; }  # 2: no environment; 1: built, a check failed

main() {
# 1. SGLang's site
if [ ! -f "$SGL"/.complete ]; then
    mkdir -p "$STAGE"
    for dir in "${@:-.sgl}"; do
        for f in "$dir"/sgl-site-cp312.tar.xz.part*; do [ -f "$f" ] && cp "$f" "$STAGE"/; done
        [ -f "$dir/sgl-site-cp312.tar.xz.sha256" ] && SGL_SITE_SHA256=$(cut -d' ' -f1 "$dir/sgl-site-cp312.tar.xz.sha256")
    done
    parts=$(ls "$STAGE"/sgl-site-cp312.tar.xz.part* 2>/dev/null | sort -V)
    [ -n "$parts" ] || fail "no sgl-site-cp312.tar.xz.part* in ${*:-.sgl} or $STAGE, and no $SGL"
    if [ "$(cat $parts | sha256sum | cut -d' ' -f1)" != "$SGL_SITE_SHA256" ]; then
        echo "setup_env: staged $(echo $parts | wc -w) part(s) in $STAGE ($(cd "$STAGE" && echo *)); their join" \
             "does not match sha256 $SGL_SITE_SHA256: carry the missing parts in the next call (exit 3)"
        exit 3
    fi
    rm -rf "$SGL" && mkdir -p "$SGL"
    cat $parts | tar -xJf - -C "$SGL" || fail "could not unpack the SGLang site"
    touch "$SGL"/.complete
    echo "setup_env: SGLang site unpacked to $SGL"
fi

# 2. the carried wheels and the project's own
ls .whl/*.whl >/dev/null 2>&1 || fail "no .whl/*.whl: run scripts/gpu/fetch_wheels.sh on a machine with PyPI and carry .whl"
project=$(ls .whl/project/slime-*.whl 2>/dev/null | head -1)
if [ -z "$project" ]; then
    build=$(mktemp -d)
    cp -r pyproject.toml README.md slime "$build/"  # a copy: the tree gets no build/ or egg-info
    python3 -m pip wheel -q --no-index --find-links .whl/build --no-deps -w "$SITE.wheel" "$build" || fail "could not build the project wheel"
    rm -rf "$build"
    project=$(ls -t "$SITE.wheel"/slime-*.whl | head -1)
fi
rm -rf "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl "$project" \
    || fail "pip install --target $SITE"

# 3. checks, from an empty directory: the installed slime, not the tree's
cat > "$ENV_FILE" <<EOF
export PYTHONPATH=$REPO:$SITE:$SGL${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
EOF
cd "$(mktemp -d)"
PYTHONPATH=$SITE:$SGL python3 -m pip check > "$STAGE.pip-check.txt" 2>&1
PYTHONPATH=$SITE:$SGL timeout 300 python3 - "$OUT/setup_env.json" "$STAGE.pip-check.txt" "$SITE" "$SGL" <<'EOF'
import importlib, importlib.metadata as md, json, os, re, sys, warnings

from packaging.requirements import Requirement

out_path, pip_check_path, site, sgl_site = sys.argv[1:5]
result, problems = {"python": sys.version.split()[0]}, []

versions = {}
for name, module in [("torch", "torch"), ("transformers", "transformers"), ("tokenizers", "tokenizers"),
                     ("sglang", "sglang"), ("megatron-core", "megatron.core"), ("slime", "slime")]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(module)
        versions[name] = {"version": md.version(name), "file": mod.__file__}
    except Exception as exc:  # noqa: BLE001 - every failure is reported
        versions[name] = {"error": f"{type(exc).__name__}: {exc}"}
        problems.append(f"import {module}: {exc}")
result["versions"] = versions
try:
    import torch
    from slime.hf_compat import CACHE_KWARG
    import slime.servers.embedded.runner, slime.train.megatron.trainer  # noqa: F401  (engine; megatron backend)
    result["cuda"] = {"available": torch.cuda.is_available(), "devices": torch.cuda.device_count()}
    result["hf_cache_kwarg"] = CACHE_KWARG
except Exception as exc:  # noqa: BLE001
    problems.append(f"import slime's engine / megatron backend: {type(exc).__name__}: {exc}")
if not versions["slime"].get("file", "").startswith(site + "/"):
    problems.append(f"slime was not imported from {site}: {versions['slime']}")


def unmet(dist: str, extras: tuple[str, ...] = ("",), only: set[str] | None = None, skip: frozenset[str] = frozenset()) -> list[str]:
    """Requirements of installed ``dist`` (with ``extras``) that the environment does not meet."""
    bad = []
    for text in md.requires(dist) or []:
        req = Requirement(text)
        if (only is not None and req.name.lower() not in only) or req.name.lower() in skip:
            continue
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            bad.append(f"{dist} needs {req}: not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            bad.append(f"{dist} needs {req}: have {have}")
    return bad


# the test extra's linters are not carried (no test on the device lints; tests/test_tooling.py skips without them)
result["slime_requirements_unmet"] = unmet("slime", ("", "megatron", "test"), skip=frozenset({"ruff", "mypy", "types-pyyaml"}))
result["sglang_pins_unmet"] = unmet("sglang", only={"torch", "transformers", "tokenizers"})
problems += result["slime_requirements_unmet"] + result["sglang_pins_unmet"]

ours = {re.sub(r"[-_.]+", "-", d.split("-")[0]).lower() for d in os.listdir(site) if d.endswith(".dist-info")}
sgl = {re.sub(r"[-_.]+", "-", d.split("-")[0]).lower() for d in os.listdir(sgl_site) if d.endswith(".dist-info")}
kinds = {"ours": [], "sglang_site": [], "image": []}
for line in open(pip_check_path).read().splitlines():
    m = re.match(r"(\S+) \S+ (?:requires|has requirement) ([A-Za-z0-9_.\-]+)", line)
    if not m:
        continue
    who, what = (re.sub(r"[-_.]+", "-", x).lower() for x in m.groups())
    kind = "ours" if who in ours or what in ours else "sglang_site" if who in sgl else "image"
    kinds[kind].append(line)
result["pip_check"] = kinds
problems += [f"pip check: {line}" for line in kinds["ours"]]
result["problems"] = problems
result["passed"] = not problems
json.dump(result, open(out_path, "w"), indent=1)

for name, v in versions.items():
    print(f"  {name:14s} {v.get('version', v.get('error'))}")
print(f"  cuda           {result.get('cuda')}   transformers' cache kwarg: {result.get('hf_cache_kwarg')}")
print(f"  pip check: {len(kinds['ours'])} about {site}'s distributions, {len(kinds['sglang_site'])} about SGLang's partial site "
      f"(not failed), {len(kinds['image'])} among the image's own packages (not failed)")
for line in kinds["sglang_site"] + kinds["image"]:
    print(f"    (not failed) {line}")
for p in problems:
    print(f"  PROBLEM: {p}")
sys.exit(0 if result["passed"] else 1)
EOF
rc=$?
cd "$REPO"
echo "setup_env: $([ $rc -eq 0 ] && echo PASSED || echo FAILED)  (source $ENV_FILE; details in $OUT/setup_env.json)"
return $rc
}

main "$@" 2>&1 | tee -a "$OUT/setup_env.log"
exit "${PIPESTATUS[0]}"
