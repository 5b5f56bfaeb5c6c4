"""The capacity study: does MoHGE store as much as a standard MoE with about 20 % fewer total parameters, where total
parameters bind? (docs/study.md, "The capacity study"; its larger ladder on one GPU: studies/gpu_capacity/.)

Here:
  config.yaml   the study's workflow config, its analysis declared before its runs
  analysis.py   the declared tests (the gate, claim 1, the sweep's fit, heterogeneity, unused experts, the selection,
                the best shot, the decomposition): tables C1-C6
  rules.smk     rule capacity_analysis, for every study whose config declares ``analysis.design: capacity``
  scripts/      capacity_analysis.py (the rule's script: the tables and figure C1), pilot.py and pilot_table.py (the
                pilot that fixed the regime, run by hand)
  captions/     the report's caption of figure C1
  tests/        the analysis on synthetic runs with known effects and on the committed results

``DESIGN`` is what the generic workflow reads (:class:`mohge_studies.design.Design`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mohge_studies.config.runs import BEST_SHOT, SELECTION, plan
from mohge_studies.design import Design
from mohge_studies.workflow import settings as study_settings
from mohge_studies.workflow.targets import FIGURE_FORMATS, TABLE_FORMATS, expand

TABLES = ["C1_models", "C2_tests", "C3_unused", "C4_selection", "C5_best_shot", "C6_decomposition"]
FIGURE = "C1_bits_params"


def outputs(study: str) -> list[str]:
    """C1-C6 in every format and the bits-stored figure of ``study``."""
    return expand("results/{study}/study/{table}.{ext}", study=study, table=TABLES, ext=TABLE_FORMATS) + expand(
        "figures/{study}/{fig}.{ext}", study=study, fig=FIGURE, ext=FIGURE_FORMATS
    )


def settings(config: dict) -> dict[str, Any]:
    """What scripts/capacity_analysis.py takes from a capacity study's config: the declared analysis,
    the main dataset and the MoHGE arms on it ("mohge", "mohge+<variant>"; selection and best-shot runs left out),
    the family, lr and gate of every selection run it plans (run -> {"family", "lr", "gate_mode"}) and the seeds it
    plans for each best-shot model (``declared``: "<family>+<variant>" -> seeds)."""
    a, main = study_settings.analysis(config), study_settings.main_dataset(config)
    arms = ["mohge"] + [
        f"mohge+{v}"
        for e in config["experiments"]
        if e["dataset"] == main and "mohge" in e["families"]
        for v in (e.get("variants") or {})
        if not v.startswith((SELECTION, BEST_SHOT))
    ]
    planned = plan(config, preflight=False)
    selection = {
        name: {"family": cfg.family, "lr": cfg.train.lr, "gate_mode": cfg.model.router.gate_mode}
        for name, cfg in planned.items()
        if cfg.variant.startswith(SELECTION)
    }
    declared = Counter(f"{c.family}+{c.variant}" for c in planned.values() if c.variant.startswith(BEST_SHOT))
    return {
        "reference": a.reference_family,
        "equal": a.equal_family,
        "selection": selection,
        "declared": dict(declared),
        "sweep": list(a.sweep),
        "mohge": list(dict.fromkeys(arms)),
        "dataset": main,
        "quarter": a.quarter_dataset,
        "alpha": a.alpha,
        "margin": a.equivalence_margin,
        "gate_ratio": a.gate_ratio,
        "gate_slope": a.gate_slope,
        "unused_share": a.unused_share,
        "gates": list(a.gates),
    }


DESIGN = Design("capacity", outputs, settings)
