#!/usr/bin/env bash
# GPU check of the Triton expert kernels: the GPU tests, then the benchmark. About 2-4 minutes on an H200,
# bounded by timeouts to under 6. Writes env.log, pytest_gpu.log, bench.log and kernels_bench.csv into OUTDIR.
#
#   kernels/gpu_check.sh OUTDIR            (from any directory; PYTHON overrides the interpreter, default python3)
#
# Needs torch, triton, numpy and pytest, not an install of mohge: kernels/ becomes mohge.kernels only through
# pyproject's package-dir mapping, so the script builds a throwaway import layout
#   $LAYOUT/mohge          a copy of src/mohge
#   $LAYOUT/mohge/kernels  a symlink to kernels/
# and puts $LAYOUT first on PYTHONPATH. Exit status: 0 when both steps pass, 1 otherwise.
set -euo pipefail

OUT=${1:?usage: kernels/gpu_check.sh OUTDIR}
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

LAYOUT=$(mktemp -d)
trap 'rm -rf "$LAYOUT"' EXIT
cp -r "$ROOT/src/mohge" "$LAYOUT/mohge"
rm -rf "$LAYOUT/mohge/kernels"
ln -s "$ROOT/kernels" "$LAYOUT/mohge/kernels"
export PYTHONPATH="$LAYOUT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
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
