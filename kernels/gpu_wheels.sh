#!/usr/bin/env bash
# The wheels the GPU image lacks for kernels/gpu_all.sh's workflow steps, fetched here (a machine whose pip reaches
# an index) for the image's Python 3.12 on x86-64, into DIR (default .whl, which .gitignore ignores; carry it):
#
#   kernels/gpu_wheels.sh [DIR]
#
# The image (its package list: the device notes of this workplace) has torch, triton, numpy, pandas, scipy,
# matplotlib, tokenizers, safetensors, pyyaml, jinja2, requests, psutil, tqdm, huggingface-hub, pyarrow, fsspec,
# xxhash, scikit-learn, sacrebleu and nvidia-ml-py; the workflow needs, besides them, snakemake and lm-eval and what
# they import. kernels/gpu_wheels.txt lists them: what the GPU studies' tiny CPU runs (tests/workflow/test_gpu_study.py)
# import that is not in the image, plus the rest of snakemake's declared requirements; versions are this checkout's
# pins (the environment the tests pass in). Compiled ones (immutables, rpds-py, pydantic-core, sqlalchemy, greenlet) come as
# cp312 manylinux wheels. gpu_all.sh installs DIR with `pip install --no-index --no-deps --target`.
set -euo pipefail

DIR=${1:-.whl}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mapfile -t PACKAGES < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/gpu_wheels.txt" | grep -v '^$')
mkdir -p "$DIR"
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34; do platforms+=(--platform "manylinux_${n}_x86_64"); done
for pkg in "${PACKAGES[@]}"; do
    # a wheel for cp312 on x86-64 where the index has one; else (a pure-Python sdist) a wheel built here from it
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
        -d "$DIR" "$pkg" 2>/dev/null ||
        "$PY" -m pip wheel --quiet --no-deps -w "$DIR" "$pkg"
done
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
