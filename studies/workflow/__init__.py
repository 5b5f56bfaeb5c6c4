"""The Snakemake workflow's logic, as Python the tests reach without Snakemake: what one config plans.

Owns:
  `checkout`   what the workflow reads of its checkout: the files git tracks, the config files in configs/ that
               name a study, the targets on Snakemake's command line, the committed studies and kernel benchmark
  `targets`    the files of a study: its tables, figures, study outputs, inference records, a run's results
  `settings`   what a study's tables and figures take from its config (read through the typed sections)
  `resources`  SLURM sizes and launchers of the jobs, functions of the config's `cluster` section and the run
  `plan`       :class:`WorkflowPlan`: the validated runs of a config, its committed runs, what the rules make
  `slot`       the next runs of a study for one GPU slot (`mohge slot`; kernels/gpu_all.sh's ladder step)

workflow/rules/common.smk builds one :class:`WorkflowPlan` and keeps only validation messages, wildcard
constraints and thin input functions that call it.

May import: the library (``mohge``) and the other subpackages here (it sits at the top); nothing imports it.
"""

from .plan import WorkflowPlan, check_configfiles, validated_runs

__all__ = ["WorkflowPlan", "check_configfiles", "validated_runs"]
