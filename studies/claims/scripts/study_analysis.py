"""Snakemake glue: a study's pre-declared analysis (mohge_studies.claims.analysis.run_analysis) into
results/<study>/study/.

The config arrives as canonical JSON (keys sorted: rule study_analysis), so the order its keys were merged in
never reruns the job; what the analysis prints, warnings included (scipy's), goes to the job's log."""

import contextlib
import json
import traceback
from pathlib import Path

from mohge_studies.claims.analysis import run_analysis

snakemake = globals()["snakemake"]
with open(snakemake.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
        run_analysis(
            Path(snakemake.input.runs).parent,
            json.loads(snakemake.params.cfg),
            Path(snakemake.output.S1_models_csv).parent,
        )
    except Exception:
        traceback.print_exc()
        raise
