#!/usr/bin/env bash
# GPU check of the Triton expert kernels: the GPU tests, the benchmark, then where the time goes (kernels or host).
# Bounded by timeouts to 3.75 minutes (with gpu_train_check.sh, under 6: kernels/gpu_all.sh runs both). Writes
# env.log, pytest_gpu.log, bench.log, kernels_bench.csv, profile.log and kernels_profile.json into OUTDIR.
#
#   kernels/gpu_check.sh OUTDIR            (from any directory; PYTHON overrides the interpreter, default python3)
#
# Needs a CUDA torch, triton, numpy and pytest; installs this checkout into the interpreter's environment
# (gpu_env.sh says how, and how pytest comes from WHEELS=DIR where it is missing). Exit status: 0 when both
# steps pass, 1 otherwise.
set -euo pipefail

OUT=${1:?usage: kernels/gpu_check.sh OUTDIR}
# shellcheck source=kernels/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
gpu_install gpu_check pytest || exit 1
cd "$ROOT"
write_env_log

status=0
# --confcutdir: only tests/kernels' own setup applies, so the check needs nothing beyond the packages above.
timeout 100 "$PY" -m pytest -m gpu tests/kernels -q -p no:cacheprovider --confcutdir=tests/kernels \
    2>&1 | tee "$OUT/pytest_gpu.log" || status=1
timeout 80 "$PY" -m mohge.kernels.bench --out "$OUT/kernels_bench.csv" \
    2>&1 | tee "$OUT/bench.log" || status=1
timeout 45 "$PY" -m mohge.kernels.gpu_profile --out "$OUT/kernels_profile.json" \
    2>&1 | tee "$OUT/profile.log" || status=1
echo "gpu_check: exit status $status (logs and CSV in $OUT)"
exit $status
