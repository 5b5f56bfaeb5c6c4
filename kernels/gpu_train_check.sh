#!/usr/bin/env bash
# GPU check of training (beside gpu_check.sh, which checks the kernels): 20 bf16 steps of a small MoHGE with the
# Triton and the torch expert backends and through FSDP2, loss parity, tokens/s and MFU. Bounded by a timeout to
# 2 minutes (Triton compiles in the first steps). Writes env.log, train_check.log, train_check.json and
# train_check.csv into OUTDIR (copy the CSV to results/bench/ to keep it).
#
#   kernels/gpu_train_check.sh OUTDIR      (from any directory; PYTHON overrides the interpreter, default python3)
#
# Needs a CUDA torch, triton and numpy, nothing else; installs this checkout into the interpreter's environment
# (gpu_env.sh). Exit status: 0 when the losses agree (python -m mohge.train.distributed.gpu_check), 1 otherwise.
set -euo pipefail

OUT=${1:?usage: kernels/gpu_train_check.sh OUTDIR}
# shellcheck source=kernels/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
gpu_install gpu_train_check || exit 1
cd "$ROOT"
write_env_log

status=0
timeout 120 "$PY" -m mohge.train.distributed.gpu_check --out "$OUT" --steps 20 2>&1 | tee "$OUT/train_check.log" || status=1
echo "gpu_train_check: exit status $status (logs, JSON and CSV in $OUT)"
exit $status
