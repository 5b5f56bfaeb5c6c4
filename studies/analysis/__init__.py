"""Analysis of trained runs and traces shared by the studies: the per-GPU utilization study, the result tables, the
sizing, the verdicts (each study's own analysis lives in its folder: studies/<study>/).

Owns:
  `utilization`  expert placement -> per-rank load, analytic and measured (``mohge utilization``)
  `ep_timing`    the torchrun harness that times each rank's expert compute for the utilization study
  `collect`      the per-run summaries gathered into the study's tables (``mohge collect``)
  `tasks`        which local lm-eval tasks a study reports (declared metric, chance, ceiling)
  `idle`         unused experts and width classes per logged training step, from the training logs (F15, C3)
  `sizing`       per-GPU memory, whether it fits, days to finish of a cluster config before it runs (``mohge sizing``)
  `plotstyle`    the figures' and tables' shared style and writers (matplotlib, pandas; workflow/scripts use it)

Every interval and test comes from mohge.core.stats (the evaluation's token-level record needs them too, so they
live below both).

May import: the library (core, config, model, data, train, evaluate, mohge.kernels) and mohge_studies.config; never
bench, the workflow or a study's folder.
"""
