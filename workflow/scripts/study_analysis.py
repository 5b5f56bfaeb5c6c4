"""Snakemake glue: a study's pre-declared analysis (mohge.analysis.study.run_analysis) into results/<study>/study/."""

from pathlib import Path

from mohge.analysis.study import run_analysis

snakemake = globals()["snakemake"]
run_analysis(Path(snakemake.input.runs).parent, snakemake.params.cfg, Path(snakemake.output.S1_models_csv).parent)
