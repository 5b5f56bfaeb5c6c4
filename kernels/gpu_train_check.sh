#!/usr/bin/env bash
# GPU check of training (beside gpu_check.sh, which checks the kernels): 20 bf16 steps of a small MoHGE with the
# Triton and the torch expert backends and through FSDP2, loss parity, tokens/s and MFU. About 1-2 minutes on an
# H200 (Triton compiles in the first steps), bounded by a timeout to under 6. Writes env.log, train_check.log,
# train_check.json and train_check.csv into OUTDIR (copy the CSV to results/bench/ to keep it).
#
#   kernels/gpu_train_check.sh OUTDIR      (from any directory; PYTHON overrides the interpreter, default python3)
#
# Needs torch, triton, numpy and pyyaml, not an install of mohge: the same throwaway import layout as
# gpu_check.sh ($LAYOUT/mohge = a copy of src/mohge, $LAYOUT/mohge/kernels -> kernels/). Exit status: 0 when the
# losses agree (python -m mohge.train.distributed.gpu_check), 1 otherwise.
set -euo pipefail

OUT=${1:?usage: kernels/gpu_train_check.sh OUTDIR}
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
    "$PY" -c 'import torch, triton, yaml
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())' || true
} 2>&1 | tee "$OUT/env.log"

status=0
timeout 330 "$PY" -m mohge.train.distributed.gpu_check --out "$OUT" --steps 20 2>&1 | tee "$OUT/train_check.log" || status=1
echo "gpu_train_check: exit status $status (logs, JSON and CSV in $OUT)"
exit $status
