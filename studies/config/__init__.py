"""The workflow config of a study, above the library's run config: what a config file plans.

Owns:
  `runs`          the experiment plan: the workflow config -> resolved runs (one ``mohge.config.RunConfig`` each),
                  its sections (utilization, analysis, figures, cluster, inference) and JSON schema (``mohge runs``)
  `param_report`  total and activated parameters of a model config or of a run a workflow config plans
                  (``mohge params``)

May import: the library's :mod:`mohge.core` and :mod:`mohge.config` only (the lowest layer here).
"""
