"""mohge_studies: the paper's studies beside the library, and what runs them.

The library (``mohge``: core, config, model, kernels, data, train, evaluate) names no study; this package holds
what the studies add on top of it, installed from the same checkout (pyproject.toml maps it to ``studies/``):

  config    the workflow config: what a config file plans (``mohge runs``), parameter counts (``mohge params``)
  workflow  what the Snakemake workflow plans from a config (runs, committed runs, targets, settings, job sizes)
  analysis  the utilization study and its timing harness, result tables, the claims, the sizing, the verdicts
  bench     benchmarks (``mohge bench``): every figure a ratio against a reference measured in the same run

The layer rule of the library goes on here: ``config`` may import the library's core and config; ``analysis`` the
library and ``config``; ``bench`` those and ``analysis``; ``workflow`` sits at the top (workflow/rules/common.smk
imports it). Nothing in ``mohge`` imports this package: the ``mohge`` command reaches its commands by module name
(mohge.cli), and says so in one line where the package's extras are not installed (tests/unit/test_layout.py checks
every import).
"""
