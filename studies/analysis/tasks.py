"""Which local lm-eval tasks a study reports: each task's declared metric and chance level, and the rule that keeps a
task only where its metric leaves both chance and ceiling (the tables T1 of every study and S5 of the claims study).
"""

from __future__ import annotations

import pandas as pd

from mohge.core.stats import p_binomial_h0_le

# The metric each local task is scored by (what its YAML's metric_list declares first) and its chance level.
TASK_METRIC = {
    "mohge_cloze": ("acc", 0.25),
    "mohge_hellaswag": ("acc_norm", 0.25),
    "mohge_graded_easy": ("acc", 0.25),
    "mohge_graded_medium": ("acc", 0.25),
    "mohge_graded_hard": ("acc", 0.25),
}


def reportable_tasks(runs: pd.DataFrame, docs: dict[str, int], alpha: float = 0.05) -> dict[str, str]:
    """task -> why it is (not) reported: pooled over the study's runs, the task's declared metric must be above
    chance (one-sided binomial test at alpha) and below ceiling (pooled score < 0.99)."""
    out = {}
    for task, (metric, chance) in TASK_METRIC.items():
        col = f"task:{task}:{metric}"
        if col not in runs or runs[col].isna().all() or not docs.get(task):
            continue
        scores = runs[col].dropna()
        k = int(round(float(scores.sum()) * docs[task]))
        n = docs[task] * len(scores)
        p = p_binomial_h0_le(k, n, chance)
        pooled = k / n
        if p >= alpha:
            out[task] = f"not reported: at chance ({pooled:.3f} vs {chance:.2f}, p = {p:.2g})"
        elif pooled >= 0.99:
            out[task] = f"not reported: at ceiling ({pooled:.3f})"
        else:
            out[task] = f"reported: {metric} {pooled:.3f} (chance {chance:.2f})"
    return out
