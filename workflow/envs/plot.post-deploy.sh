#!/usr/bin/env bash
# Snakemake runs this once inside a freshly made conda env (--sdm conda): it installs this checkout's mohge package
# (mohge and mohge.kernels) into the env, editable and without dependencies (the env file pins those), so jobs import
# the package because it is installed and run the code of the checkout. workflow/rules/common.smk sets
# MOHGE_CHECKOUT to the checkout that holds the workflow.
set -euo pipefail
checkout="${MOHGE_CHECKOUT:?MOHGE_CHECKOUT is unset: this script is run by Snakemake for workflow/rules/common.smk}"
python -m pip install --quiet --no-deps --editable "$checkout"
python -c "import mohge.kernels" 2>/dev/null || python -c "import mohge"  # the plot env has no torch: mohge is enough
