"""The claims study: does MoHGE match a standard MoE with fewer parameters, does the all-size allocation balance the
GPUs, do easy tokens route narrower? (docs/study.md; its one-GPU version: studies/gpu/.)

Here:
  config.yaml   the study's workflow config, its analysis declared before its runs
  analysis.py   the paired tests (TOST, one-sided, the width sweep), balance over seeds and by difficulty, the tasks
                reported: tables S1-S7 (``mohge study``)
  controls.py   the tests of the arms declared after the results: S8-S11
  rules.smk     rules study_analysis, study_tables_tex and the figures F7-F12, for every study whose config declares
                ``analysis.design: claims`` (the default design)
  scripts/      the rules' scripts: the tables S1-S11 and their LaTeX, figures F7-F12
  captions/     the report's captions of those tables and figures
  tests/        the analysis on known data, and every sentence of the prose that quotes a committed table

``DESIGN`` is what the generic workflow reads (:class:`mohge_studies.design.Design`).
"""

from __future__ import annotations

from mohge_studies.design import Design
from mohge_studies.workflow.targets import FIGURE_FORMATS, expand

TABLES = [
    "S1_models",
    "S2_tests",
    "S3_balance",
    "S4_difficulty",
    "S5_tasks",
    "S6_balance_decision",
    "S7_unused_experts",
    "S8_controls",  # the arms declared after the results; S9, S10: Q3's dose and token-level record
    "S9_q3_dose",
    "S10_token_q3",
    "S11_bias_balance",  # balance on trained routing without a loss
]
# S5 (tasks, with the reason each is or is not reported), S6, S7, S9, S10 and S11 stay csv/md
TEX_TABLES = [*TABLES[:4], "S8_controls"]
FIGURES = [
    "F7_study_quality",
    "F8_study_tests",
    "F9_study_balance",
    "F10_study_frontier",
    "F11_study_difficulty",
    "F12_study_controls",  # S8's paired tests (the control arms declared after the results)
]


def outputs(study: str) -> list[str]:
    """S1-S11 (csv, md, html; S1-S4 and S8 also tex) and F7-F12 of ``study``."""
    return (
        expand("results/{study}/study/{table}.{ext}", study=study, table=TABLES, ext=["csv", "md", "html"])
        + expand("results/{study}/study/{table}.tex", study=study, table=TEX_TABLES)
        + expand("figures/{study}/{fig}.{ext}", study=study, fig=FIGURES, ext=FIGURE_FORMATS)
    )


DESIGN = Design("claims", outputs)
