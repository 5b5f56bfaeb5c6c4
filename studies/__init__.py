"""mohge_studies: the paper's studies beside the library, and what runs them.

The library (``mohge``: core, config, model, kernels, data, train, evaluate) names no study; this package holds
what the studies add on top of it, installed from the same checkout (pyproject.toml maps it to ``studies/``):

  config    the workflow config: what a config file plans (``mohge runs``), parameter counts (``mohge params``)
  workflow  what the Snakemake workflow plans from a config (runs, committed runs, targets, settings, job sizes)
  analysis  the utilization study and its timing harness, result tables, the claims, the sizing, the verdicts
  bench     benchmarks (``mohge bench``): every figure a ratio against a reference measured in the same run
  design    a declared analysis as the workflow reads it (:class:`~mohge_studies.design.Design`)

and one folder a study (below: :data:`STUDIES`), holding its ``config.yaml``; a study that declares an analysis of
its own (:data:`DESIGNS`) also holds the analysis, the ``rules.smk`` that makes its tables and figures, their
scripts and captions, and its tests. Adding a study is its folder and a line here.

The layer rule of the library goes on here: ``config`` may import the library's core and config; ``analysis`` the
library and ``config``; ``bench`` those and ``analysis``; ``workflow`` and the studies' folders sit at the top
(workflow/rules/common.smk imports them). This ``__init__`` imports nothing but the standard library, so every layer
may read the registry. Nothing in ``mohge`` imports this package: the ``mohge`` command reaches its commands by module
name (mohge.cli) (tests/unit/test_layout.py checks every import).
"""

from __future__ import annotations

import os

# study (results/<study>/, figures/<study>/) -> its folder here, which holds its config.yaml; configs/ holds the
# default study's (config.yaml, under every other), the smoke run's and the release-scale recipe's
STUDIES = {
    "ablations": "ablations",
    "capacity": "capacity",
    "claims": "claims",
    "frontier": "frontier",
    "gpu": "gpu",
    "gpu_capacity": "gpu_capacity",
}
# a declared analysis (a config's ``analysis.design``) -> the folder whose package's ``DESIGN`` makes it
DESIGNS = {
    "claims": "claims",
    "capacity": "capacity",
}


def config_file(study: str, checkout: str = ".") -> str | None:
    """The config file of a registered ``study`` in ``checkout`` (None for a study registered nowhere here)."""
    return os.path.join(checkout, "studies", STUDIES[study], "config.yaml") if study in STUDIES else None


def config_files(checkout: str = ".") -> list[str]:
    """Every registered study's config file in ``checkout``, by study name."""
    return [os.path.join(checkout, "studies", STUDIES[s], "config.yaml") for s in sorted(STUDIES)]
