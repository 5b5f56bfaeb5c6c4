"""Analysis of trained runs and traces: the per-GPU utilization study, the result tables, the claims, the sizing.

Owns:
  `utilization`  expert placement -> per-rank load, analytic and measured (``mohge utilization``)
  `ep_timing`    the torchrun harness that times each rank's expert compute for the utilization study
  `collect`      the per-run summaries gathered into the study's tables (``mohge collect``)
  `study`        the paired tests and the claims of docs/study.md (``mohge study``)
  `controls`     the tests of the arms declared after the claims study's results (S8-S10 of ``mohge.study``)
  `capacity`     the capacity study's declared tests, tables C1-C5 and its figure (rule capacity_analysis)
  `idle`         unused experts and width classes per logged training step, from the training logs (F15, C3)
  `sizing`       per-GPU memory, whether it fits, days to finish of a cluster config before it runs (``mohge sizing``)
  `plotstyle`    the figures' and tables' shared style and writers (matplotlib, pandas; workflow/scripts use it)

Every interval and test comes from mohge.core.stats (the evaluation's token-level record needs them too, so they
live below both).

May import: core, config, model, data, train, evaluate and mohge.kernels; never bench.
"""
