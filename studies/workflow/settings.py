"""What a study's tables and figures take from its config, read through the typed sections
(mohge_studies.config.runs), so every default is the section's own: the routing trace F4/T3 show, F6's benchmark
CSV, the declared analysis."""

from __future__ import annotations

from typing import Any

from mohge_studies.config.runs import (
    AnalysisConfig,
    FiguresConfig,
    InferenceConfig,
    UtilizationConfig,
)

from mohge.config import EvalConfig, RunConfig


def utilization(config: dict) -> UtilizationConfig:
    return UtilizationConfig.from_dict(config.get("utilization") or {}, "utilization")


def analysis(config: dict) -> AnalysisConfig:
    """The config's declared analysis (its defaults when it declares none)."""
    return AnalysisConfig.from_dict(config.get("analysis") or {}, "analysis")


def figures(config: dict) -> FiguresConfig:
    return FiguresConfig.from_dict(config.get("figures") or {}, "figures")


def inference(config: dict) -> InferenceConfig:
    return InferenceConfig.from_dict(config.get("inference") or {}, "inference")


def design(config: dict) -> str | None:
    """The declared analysis's design (claims or capacity), None for a config without an `analysis` section."""
    return analysis(config).design if "analysis" in config else None


def main_dataset(config: dict) -> str:
    """The first experiment's dataset: Q1, F4/T3's trace and the study figures read it."""
    return config["experiments"][0]["dataset"]


def trace_runs(runs: dict[str, RunConfig], util: UtilizationConfig) -> list[str]:
    """Runs whose routing traces feed the utilization study and F3: the first seed of each MoE model, or every
    seed of every MoE model with `utilization.trace_all_seeds` (balance with CIs over seeds); never a run of a
    dataset in `utilization.untraced_datasets`."""
    runs = {r: c for r, c in runs.items() if c.dataset not in util.untraced_datasets}
    if util.trace_all_seeds:
        return sorted(r for r, c in runs.items() if c.family != "dense")
    first: dict[tuple[str, str, str], str] = {}
    for name, c in runs.items():
        key = (c.dataset, c.family, c.variant)
        if c.family != "dense" and (key not in first or c.train.seed < runs[first[key]].train.seed):
            first[key] = name
    return sorted(first.values())


def util_source(runs: dict[str, RunConfig], config: dict) -> str:
    """The routing trace F4 and T3 show: MoHGE on the main dataset (its first seed, the main MoHGE before its
    variants), else the first traced run; "" without one."""
    traced = trace_runs(runs, utilization(config))
    main = main_dataset(config)
    mohge = sorted(
        (r for r in traced if runs[r].family == "mohge" and runs[r].dataset == main),
        key=lambda r: (runs[r].variant != "", runs[r].train.seed, r),
    )
    return (mohge or traced or [""])[0]


def study_param(config: dict, key: str) -> Any:
    """A value the study's figures take from its config: the main dataset, the val/test loss batches of its
    evaluations and the declared analysis."""
    if key == "dataset":
        return main_dataset(config)
    if key == "heldout_batches":
        return EvalConfig.from_dict(config.get("eval") or {}, "eval").heldout_batches
    a = analysis(config)
    return {
        "alpha": a.alpha,
        "metric": a.primary_metric,
        "margin": a.equivalence_margin,
        "reference": a.reference_family,
        "balance_ep": a.balance_ep,
        "balance_bar": a.balance_bar,
        "ep_sizes": list(utilization(config).ep_sizes),
    }[key]


def inference_args(config: dict) -> list[str]:
    """The `inference` section as flags of mohge bench inference (a knob without points is left out)."""
    inf = inference(config)
    args: list[str] = []
    for key in ("group_topk", "bar_widest", "topk"):
        points = getattr(inf.knob_points, key)
        if points:
            args += [f"--{key.replace('_', '-')}", *map(str, points)]
    args += ["--prompt-lengths", *map(str, inf.prompt_lengths)]
    args += ["--batch-sizes", *map(str, inf.batch_sizes)]
    args += ["--decode-tokens", str(inf.decode_tokens), "--reps", str(inf.reps)]
    return args + ["--eval-batches", str(inf.eval_batches)]
