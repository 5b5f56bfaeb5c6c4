# Sourced by gpu_check.sh and gpu_train_check.sh (not run): the interpreter, this checkout installed into it, and
# env.log. What a bare GPU box needs:
#
#   always there    a CUDA build of torch, triton, numpy (never installed here: they come with the GPU image)
#   the checkout    installed by gpu_install: pip install --no-deps --no-build-isolation --no-index -e ROOT
#                   (no network; pip needs setuptools >= 70.1, or wheel, as any image with pip has)
#   pure Python     what the caller names (gpu_check.sh: pytest, with iniconfig, pluggy, packaging); when one
#                   is missing it is installed offline from WHEELS=DIR, a folder of wheels made elsewhere with
#                   `pip download pytest -d DIR`; without WHEELS the check stops, naming the missing packages
#
# mohge.kernels and `python -m mohge.distributed.gpu_check` import nothing beyond torch, triton and numpy
# (tests/unit/test_gpu_check_imports.py holds them to it), so nothing else is needed.
# Sets PY (PYTHON or python3), ROOT (the checkout) and OUT (made absolute); exports PYTHONUNBUFFERED and
# PYTEST_DISABLE_PLUGIN_AUTOLOAD (the image's pytest plugins are not ours).

PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

# Does $PY import mohge.kernels from this checkout? (find_spec locates it without importing torch.)
imports_checkout() {
    (cd / && "$PY" -c 'import importlib.util as u, pathlib, sys
s = u.find_spec("mohge.kernels")
sys.exit(s is None or pathlib.Path(s.origin).resolve().parent != pathlib.Path(sys.argv[1]).resolve())' \
        "$ROOT/kernels") 2>/dev/null
}

# gpu_install NAME [PACKAGE ...]: check torch/triton/numpy, install the missing pure-Python PACKAGEs from $WHEELS,
# install the checkout; returns 1 with one line on stderr naming what is missing.
gpu_install() {
    local name=$1 missing=() p
    shift
    for p in torch triton numpy; do
        "$PY" -c "import $p" 2>/dev/null || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "$name: $PY cannot import ${missing[*]}: this check runs on an image with a CUDA torch, triton and numpy" >&2
        return 1
    fi
    for p in "$@"; do
        "$PY" -c "import $p" 2>/dev/null || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ -z "${WHEELS:-}" ]; then
            echo "$name: missing ${missing[*]}; set WHEELS=DIR to a folder of their wheels (pip download ${missing[*]} -d DIR)" >&2
            return 1
        fi
        echo "$name: installing ${missing[*]} from $WHEELS (offline)"
        "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "${missing[@]}" || return 1
    fi
    if ! imports_checkout; then
        echo "$name: installing $ROOT into $("$PY" -c 'import sys; print(sys.prefix)') (editable, --no-deps, offline)"
        if ! "$PY" -m pip install --quiet --no-deps --no-build-isolation --no-index -e "$ROOT" || ! imports_checkout; then
            echo "$name: could not install $ROOT offline (pip needs setuptools >= 70.1, or wheel)" >&2
            return 1
        fi
    fi
}

# write_env_log: the GPU, the driver and the versions, into OUT/env.log (and on the screen).
write_env_log() {
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
        "$PY" -c 'import mohge.kernels as k, numpy, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("mohge.kernels from", k.__file__)'
    } 2>&1 | tee "$OUT/env.log"
}
