# MoHGE artifact: corpus -> tokenizer -> training (families x seeds) -> lm-eval -> parameter counts ->
# routing traces -> per-GPU utilization -> tables -> figures.  `snakemake --cores all` runs the default;
# `--configfile configs/smoke.yaml` the 3-minute smoke run; `--profile workflow/profiles/slurm
# --configfile configs/paper.yaml` the release-scale runs on a SLURM cluster.
import os

from snakemake.utils import min_version, validate

min_version("9.0")


# The default config and the presets are read from the checkout, so `-d DIR` runs another config
# (e.g. configs/ablations.yaml) into its own folder without touching results/ here.
configfile: os.path.join(workflow.basedir, "configs", "config.yaml")


validate(config, "workflow/schemas/config.schema.json")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        all_tables(),
        all_figures(),
