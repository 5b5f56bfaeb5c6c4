#!/usr/bin/env bash
# GPU check of the Triton expert kernels: the GPU tests, then the benchmark. About 2-4 minutes on an H200,
# bounded by timeouts to under 6. Writes env.log, pytest_gpu.log, bench.log and kernels_bench.csv into OUTDIR.
#
#   kernels/gpu_check.sh OUTDIR            (from any directory; PYTHON overrides the interpreter, default python3)
#
# Needs torch, triton, numpy and pytest, and mohge installed in that interpreter's environment (setup.sh does it).
# When the interpreter does not import this checkout's mohge.kernels, the script installs the checkout there,
# editable and without dependencies or network (pip install --no-deps --no-build-isolation -e; setuptools maps
# kernels/ to mohge.kernels, so no PYTHONPATH is involved). Exit status: 0 when both steps pass, 1 otherwise.
set -euo pipefail

OUT=${1:?usage: kernels/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1

# Does $PY import mohge.kernels from this checkout? (find_spec locates it without importing torch.)
imports_checkout() {
    (cd / && "$1" -c 'import importlib.util as u, pathlib, sys
s = u.find_spec("mohge.kernels")
sys.exit(s is None or pathlib.Path(s.origin).resolve().parent != pathlib.Path(sys.argv[1]).resolve())' \
        "$ROOT/kernels") 2>/dev/null
}
if ! imports_checkout "$PY"; then
    echo "gpu_check: installing $ROOT into $("$PY" -c 'import sys; print(sys.prefix)') (editable, --no-deps)"
    if ! "$PY" -m pip install --quiet --no-deps --no-build-isolation --no-index -e "$ROOT" || ! imports_checkout "$PY"; then
        echo "gpu_check: could not install $ROOT offline (pip needs setuptools >= 70.1, or wheel);" \
            "install it yourself: $PY -m pip install --no-deps -e $ROOT" >&2
        exit 1
    fi
fi
cd "$ROOT"

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    "$PY" -c 'import mohge.kernels as k, numpy, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)
print("cuda", torch.cuda.is_available(), "mohge.kernels from", k.__file__)'
} 2>&1 | tee "$OUT/env.log"

status=0
# --confcutdir: only tests/kernels' own setup applies, so the check needs nothing beyond the packages above.
timeout 210 "$PY" -m pytest -m gpu tests/kernels -q -p no:cacheprovider --confcutdir=tests/kernels \
    2>&1 | tee "$OUT/pytest_gpu.log" || status=1
timeout 140 "$PY" -m mohge.kernels.bench --out "$OUT/kernels_bench.csv" \
    2>&1 | tee "$OUT/bench.log" || status=1
echo "gpu_check: exit status $status (logs and CSV in $OUT)"
exit $status
