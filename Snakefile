# MoHGE artifact: corpus -> tokenizer -> training (families x seeds) -> lm-eval -> parameter counts ->
# routing traces -> per-GPU utilization -> tables -> figures.  `snakemake --cores all` runs the default;
# `--configfile configs/smoke.yaml` the 3-minute smoke run; `--profile workflow/profiles/slurm
# --configfile configs/paper.yaml` the release-scale runs on a SLURM cluster; `snakemake --cores 1 figures`
# redraws every committed study's tables and figures from its committed results/<study>/*.csv alone.
# Each config writes under results/<study>/, figures/<study>/, work/<study>/ and logs/<study>/; a study's own
# config, analysis, rules, scripts and captions live in its folder studies/<study>/ (studies/__init__.py lists them).
from snakemake.utils import min_version

min_version("9.0")


configfile: workflow.source_path("configs/config.yaml")


include: "workflow/rules/common.smk"


if not FROM_RESULTS:

    include: "workflow/rules/data.smk"
    include: "workflow/rules/train.smk"
    include: "workflow/rules/eval.smk"
    include: "workflow/rules/analysis.smk"


# each declared analysis's rules, from its study's folder (mohge_studies.DESIGNS: studies/<folder>/rules.smk)
for _rules in DESIGN_RULES:

    include: _rules


include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        PLAN.all_targets(),
