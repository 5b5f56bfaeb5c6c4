#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with this package (editable) and every extra the artifact uses
# (".[all,test]"), each at the version of constraints.txt, the stack the committed results were made with.
# Re-running it is safe. Usage: bash setup.sh   (PYTHON=python3.11 bash setup.sh)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY' || { echo "setup.sh: Python >= 3.11 is required (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned in constraints.txt (2.13.0): on a machine without CUDA pip takes the CPU build.
# pip byte-compiles what it installs one file at a time; here it installs the files and compileall compiles them on
# every core (measured: 71-77 s of pip alone against 34 s + 23 s on 2 cores). A module written for a newer Python
# than this one does not compile (torch ships one); pip skips such files too, so compileall's status is not checked.
.venv/bin/python -m pip install --quiet --no-compile -c constraints.txt -e ".[all,test]"
.venv/bin/python -m compileall -qq -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
.venv/bin/python -c "import mohge, mohge.kernels, torch, triton, snakemake, lm_eval; print('mohge', mohge.__version__, '| torch', torch.__version__, '| triton', triton.__version__)"
echo "set-up done: activate with 'source .venv/bin/activate'"
