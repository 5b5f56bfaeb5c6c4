"""The files of a study the rules make and `all` asks for: tables T1-T3, figures F1-F6, F14 and F15, T4/F13 and a
run's results (a declared analysis's tables and figures are its design's: mohge_studies.design)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

TABLES = ["T1_main", "T2_params", "T3_balance"]
TABLE_FORMATS = ["csv", "md", "tex", "html"]
FIGURES = ["F1_curves", "F2_quality_params", "F3_groups_by_level", "F4_gpu_load", "F5_width", "F14_load", "F15_idle"]
FIGURE_FORMATS = ["png", "pdf"]
PER_RUN = ("config.json", "summary.json", "train_log.jsonl", "metrics.json", "params.json")


def expand(pattern: str, **values: Iterable) -> list[str]:
    """``pattern`` formatted with every combination of ``values``, the first key varying slowest (Snakemake's
    ``expand``)."""
    keys = list(values)
    lists = [[v] if isinstance(v, str) else list(v) for v in values.values()]
    return [pattern.format(**dict(zip(keys, combo, strict=True))) for combo in itertools.product(*lists)]


def tables(study: str) -> list[str]:
    """T1-T3 of ``study`` in every format."""
    return expand("results/{study}/tables/{table}.{ext}", study=study, table=TABLES, ext=TABLE_FORMATS)


def figures(study: str, kernels: bool) -> list[str]:
    """F1-F5, F14 and F15 of ``study``, and F6 when its kernel benchmark holds a GPU measurement (``kernels``)."""
    figs = FIGURES + (["F6_kernels"] if kernels else [])
    return expand("figures/{study}/{fig}.{ext}", study=study, fig=figs, ext=FIGURE_FORMATS)


def inference_outputs(study: str, frontier_test: bool = False) -> list[str]:
    """T4 and F13 of ``study``, and T5_frontier when its config declares a served-frontier test."""
    tables = ["T4_inference", "T5_frontier"] if frontier_test else ["T4_inference"]
    return expand("results/{study}/tables/{table}.{ext}", study=study, table=tables, ext=["csv", "md"]) + expand(
        "figures/{study}/F13_inference.{ext}", study=study, ext=FIGURE_FORMATS
    )


def per_run_results(res: str, run: str, traced: Collection[str]) -> list[str]:
    """What a finished run leaves under the results root ``res``: the files collect, the study tables and the
    figures read (the routing summary and its utilization tables only for a traced run)."""
    files = [f"{res}/runs/{run}/{name}" for name in PER_RUN]
    if run in traced:
        files += [f"{res}/runs/{run}/trace.json"] + [
            f"{res}/utilization/{run}/{name}.csv" for name in ("summary", "analytic")
        ]
    return files
