#!/usr/bin/env bash
# Install Ray 2.60.0 (cp312) into /tmp/site on the GPU machine from its parts (docs/gpu_session.md, "Ray"):
# the wheel (79 MB) is larger than one call carries, so it travels as .ray/1 .ray/2 .ray/3 over three calls,
# each call copying its part to $RAY_PARTS (default /tmp/rayparts). Ray's dependencies come from the SGLang
# site where it has them; the few it lacks are installed from the small wheels beside part 3 (never over a
# module the site already has: /tmp/site comes first on PYTHONPATH).
set -euo pipefail
PARTS=${RAY_PARTS:-/tmp/rayparts}
WHL=/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
if ! PYTHONPATH=/tmp/site:/tmp/sgl-site python3 -c "import ray" 2>/dev/null; then
    [ -f "$WHL" ] || cat "$PARTS"/ray.part* > "$WHL"
    (cd /tmp && sha256sum -c "$PARTS/ray.sha256")
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHL"
    for mod in click:click msgpack:msgpack filelock:filelock jsonschema:jsonschema referencing:referencing \
               rpds:rpds_py attrs:attrs jsonschema_specifications:jsonschema_specifications; do
        if ! PYTHONPATH=/tmp/site:/tmp/sgl-site python3 -c "import ${mod%%:*}" 2>/dev/null; then
            python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$PARTS/${mod##*:}"-*.whl
        fi
    done
fi
PYTHONPATH=/tmp/site:/tmp/sgl-site python3 -c "import ray; print('ray', ray.__version__)"
