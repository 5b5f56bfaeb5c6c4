#!/usr/bin/env bash
# The one prepared GPU command: the kernel check, then the training check, into one folder. Under 6 minutes in
# all (each step is bounded by its timeout: kernel tests 100 s, benchmark 80 s, profile 45 s, training 120 s, plus
# the install; on an H200 the whole took 108 s). OUTDIR gets env.log, pytest_gpu.log, bench.log, kernels_bench.csv,
# profile.log, kernels_profile.json, train_check.log, train_check.json and train_check.csv: every log, figure and
# CSV of both checks.
#
#   kernels/gpu_all.sh OUTDIR     (PYTHON, WHEELS: as in gpu_env.sh)
#
# Exit status: 0 when both checks pass, 1 otherwise (the second runs even when the first fails).
set -uo pipefail

OUT=${1:?usage: kernels/gpu_all.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
status=0
bash "$HERE/gpu_check.sh" "$OUT" || status=1
bash "$HERE/gpu_train_check.sh" "$OUT" || status=1
echo "gpu_all: exit status $status (everything in $OUT)"
exit $status
