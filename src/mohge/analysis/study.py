"""The claims study's pre-declared analysis (configs/study.yaml; design and tests in docs/study.md).

Reads the collected CSVs of one study root and writes its tables. Every test is paired by seed (seed s fixes the
data order of every model) and works on log-perplexity, so a difference is a ratio of perplexities:

    d_s = log ppl_A(s) - log ppl_B(s),   ratio = exp(mean d),   95 % CI = exp(t-interval of mean d)

* Q1, parity: TOST equivalence of MoHGE and the reference MoE at margin m: both one-sided t tests
  H0: mean d <= -log(1+m) and H0: mean d >= +log(1+m) must reject at alpha (scipy.stats.ttest_1samp).
* Q1b, heterogeneity: one-sided paired t test of MoHGE against the iso-parameter MoE, H1: mean d < 0.
* Sensitivity: two-sided paired t tests between neighbouring widths of the homogeneous MoE sweep; Q1 is decidable
  only if the iso-parameter width and the reference width separate at alpha.
* Q2, balance: per-rank expert-FLOP max/mean of each placement (layer "all" of utilization_summary.csv), mean and
  95 % t-CI over the seeds of each model; the same for a trace with the same group loads spread evenly inside each
  group (the all-size allocation's own premise, docs/method.md §placement).
* Q3, difficulty: mean routed expert width per difficulty level (from groups_by_level.csv), per seed, then mean
  and CI over seeds; the paired easy - hard difference per seed.

    python -m mohge.study --results results/claims --config configs/config.yaml configs/study.yaml --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from mohge.core.cli import user_errors
from mohge.evaluate.traces import Trace, TraceLayer, load_trace

from .utilization import analyze

# The metric each local task is scored by (what its YAML's metric_list declares first) and its chance level.
TASK_METRIC = {
    "mohge_cloze": ("acc", 0.25),
    "mohge_hellaswag": ("acc_norm", 0.25),
    "mohge_graded_easy": ("acc", 0.25),
    "mohge_graded_medium": ("acc", 0.25),
    "mohge_graded_hard": ("acc", 0.25),
}
LEVELS = ("easy", "medium", "hard")
# the columns of S4 and S5, also when a study has no graded dataset or no reportable task (an empty table, not a
# file without a header)
DIFFICULTY_COLUMNS = [
    "dataset", "model", "n",
    *(f"{lv}{sfx}" for lv in LEVELS for sfx in ("", "_low", "_high")),
    "easy_minus_hard", "emh_low", "emh_high", "activated_params", "test_ppl", "test_ppl_low", "test_ppl_high",
]  # fmt: skip
TASK_COLUMNS = ["dataset", "task", "metric", "model", "n", "mean", "ci_low", "ci_high", "reported"]


def t_interval(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean; (mean, nan, nan) for fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    lo, hi = stats.t.interval(1 - alpha, len(x) - 1, loc=mean, scale=stats.sem(x))
    return mean, float(lo), float(hi)


def paired_log_diffs(runs: pd.DataFrame, metric: str, a: str, b: str) -> pd.Series:
    """log metric(a) - log metric(b) per seed, over the seeds both models have (index: seed)."""
    wide = runs[runs["family"].isin([a, b])].pivot_table(index="seed", columns="family", values=metric)
    if a not in wide or b not in wide:
        return pd.Series(dtype=np.float64)
    wide = wide.dropna(subset=[a, b])
    return np.log(wide[a]) - np.log(wide[b])


def compare(d: pd.Series, test: str, alpha: float, margin: float = 0.0) -> dict:
    """One paired comparison: n, the ratio and its CI, and the test's p-value and decision.

    ``test``: "tost" (equivalence within +-margin), "less" (one-sided, A lower), "two-sided"."""
    n = len(d)
    row = {"n": n, "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "decision": "n < 2"}
    if n < 2:
        return row
    mean, lo, hi = t_interval(d.to_numpy(), alpha)
    row.update(ratio=math.exp(mean), ci_low=math.exp(lo), ci_high=math.exp(hi))
    if test == "tost":
        bound = math.log1p(margin)
        p_low = stats.ttest_1samp(d, -bound, alternative="greater").pvalue
        p_high = stats.ttest_1samp(d, bound, alternative="less").pvalue
        row["p"] = float(max(p_low, p_high))
        row["decision"] = f"equivalent within ±{margin:.0%}" if row["p"] < alpha else "equivalence not shown"
    elif test == "less":
        row["p"] = float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
        row["decision"] = "A lower" if row["p"] < alpha else "A not shown lower"
    else:
        row["p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
        row["decision"] = "differ" if row["p"] < alpha else "not separated"
    return row


def quality_tests(runs: pd.DataFrame, analysis: dict) -> pd.DataFrame:
    """Q1, Q1b and the sensitivity tests, on the primary metric and on the other perplexity."""
    alpha, margin = analysis.get("alpha", 0.05), analysis.get("equivalence_margin", 0.03)
    ref, iso = analysis.get("reference_family", "moe"), analysis.get("iso_family", "moe_equal")
    primary = analysis.get("primary_metric", "test_ppl")
    metrics = [primary, *(m for m in ("test_ppl", "val_ppl") if m != primary)]
    sweep = sweep_widths(runs)
    plan = [("Q1 parity", "mohge", ref, "tost"), ("Q1b heterogeneity", "mohge", iso, "less")]
    plan += [("sensitivity", a, b, "two-sided") for a, b in zip(sweep, sweep[1:], strict=False)]
    plan += [("dense vs MoHGE", "dense", "mohge", "two-sided")]
    rows = []
    for metric in metrics:
        for question, a, b, test in plan:
            d = paired_log_diffs(runs, metric, a, b)
            rows.append(
                {
                    "question": question,
                    "metric": metric,
                    "A": a,
                    "B": b,
                    "test": test,
                    **compare(d, test, alpha, margin),
                }
            )
    return pd.DataFrame(rows)


def sweep_widths(runs: pd.DataFrame) -> list[str]:
    """The homogeneous-MoE families of the width sweep, narrowest first (by routed parameters)."""
    moe = runs[runs["family"].str.fullmatch(r"moe(_equal|\+w\d+)?")]
    order = moe.groupby("family")["routed_params"].first().sort_values()
    return list(order.index)


def model_summary(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per model: n seeds, parameters (total; activated under learned and under uniform routing) and the mean
    and 95 % CI over seeds of both perplexities."""
    rows = []
    for (ds, fam), g in runs.groupby(["dataset", "family"], sort=False):
        row = {
            "dataset": ds,
            "model": fam,
            "n": len(g),
            "total_params": g["total_params"].iloc[0],
            "activated_learned": g["activated_params"].mean(),
            "activated_uniform": g["activated_params_uniform"].iloc[0],
        }
        for metric in ("test_ppl", "val_ppl"):
            mean, lo, hi = t_interval(g[metric].to_numpy(), alpha)
            row.update({metric: mean, f"{metric}_low": lo, f"{metric}_high": hi})
        rows.append(row)
    return pd.DataFrame(rows)


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
        p = stats.binomtest(k, n, chance, alternative="greater").pvalue
        pooled = k / n
        if p >= alpha:
            out[task] = f"not reported: at chance ({pooled:.3f} vs {chance:.2f}, p = {p:.2g})"
        elif pooled >= 0.99:
            out[task] = f"not reported: at ceiling ({pooled:.3f})"
        else:
            out[task] = f"reported: {metric} {pooled:.3f} (chance {chance:.2f})"
    return out


def task_table(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per dataset, model and task: the declared metric's mean and CI over seeds, and whether the task is reported
    (:func:`reportable_tasks`, decided per dataset over all its runs; documents from task:<task>:n_samples)."""
    rows = []
    for ds, d in runs.groupby("dataset"):
        docs = {
            t: int(d[f"task:{t}:n_samples"].max())
            for t in TASK_METRIC
            if f"task:{t}:n_samples" in d and d[f"task:{t}:n_samples"].notna().any()
        }
        why = reportable_tasks(d, docs, alpha)
        for task, verdict in why.items():
            metric = TASK_METRIC[task][0]
            for fam, g in d.groupby("family", sort=False):
                mean, lo, hi = t_interval(g[f"task:{task}:{metric}"].dropna().to_numpy(), alpha)
                rows.append(
                    {
                        "dataset": ds,
                        "task": task,
                        "metric": metric,
                        "model": fam,
                        "n": len(g),
                        "mean": mean,
                        "ci_low": lo,
                        "ci_high": hi,
                        "reported": verdict,
                    }
                )
    return pd.DataFrame(rows, columns=TASK_COLUMNS)


def balance(util: pd.DataFrame, runs: pd.DataFrame, alpha: float = 0.05, col: str = "max_over_mean") -> pd.DataFrame:
    """Q2: per model x strategy x EP size, the mean and CI over seeds of the step's max/mean expert FLOPs."""
    u = util[(util["layer"].astype(str) == "all")].copy()
    u["dataset"] = u["source"].map(runs.set_index("run")["dataset"])
    u["model"] = u["source"].map(runs.set_index("run")["family"])
    rows = []
    keys = ["dataset", "model", "strategy", "ep_size"]
    for (ds, model, strategy, ep), g in u.dropna(subset=["model"]).groupby(keys):
        mean, lo, hi = t_interval(g[col].to_numpy(), alpha)
        rows.append(
            {
                "dataset": ds,
                "model": model,
                "strategy": strategy,
                "ep_size": int(ep),
                "n": len(g),
                "max_over_mean": mean,
                "ci_low": lo,
                "ci_high": hi,
            }
        )
    return pd.DataFrame(rows)


def even_within_groups(trace: Trace) -> Trace:
    """The same trace with every group's routed slots spread evenly over its experts (the remainder to the first
    experts): the intra-group balance that the all-size allocation assumes (docs/method.md §placement)."""
    n = trace.experts_per_group
    layers = []
    for lay in trace.layers:
        counts = []
        for g in range(len(trace.expert_widths)):
            total = sum(lay.counts[g * n : (g + 1) * n])
            counts += [total // n + (1 if e < total % n else 0) for e in range(n)]
        layers.append(TraceLayer(lay.layer, counts))
    return dataclasses.replace(trace, layers=layers)


def balanced_trace_summary(results: Path, runs: Sequence[str], strategies, ep_sizes) -> pd.DataFrame:
    """utilization_summary-style rows (layer "all") of each run's trace made even within groups."""
    rows = []
    for run in runs:
        path = results / "runs" / run / "trace.json"
        trace = load_trace(path) if path.is_file() else None
        if trace is not None and len(trace.expert_widths) > 1:  # one group: already even, nothing to learn
            _, summary = analyze(even_within_groups(trace), strategies, ep_sizes)
            rows += [{**r, "source": run} for r in summary if str(r["layer"]) == "all"]
    return pd.DataFrame(rows)


def mean_width_by_level(groups: pd.DataFrame) -> pd.DataFrame:
    """Per run and level: the mean width of the expert slots the tokens of that level were routed to (all layers)."""
    g = groups[(groups["layer"].astype(str) == "all") & (groups["level"].isin(LEVELS))]
    g = g.assign(ws=g["width"] * g["slots"])
    per = g.groupby(["run", "dataset", "family", "seed", "level"], as_index=False)[["ws", "slots"]].sum()
    per["mean_width"] = per["ws"] / per["slots"]
    return per.drop(columns=["ws"])


def difficulty(groups: pd.DataFrame, runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Q3: per model, the mean routed width per level (mean, CI over seeds), the paired easy - hard difference,
    the mean activated width and the perplexity."""
    per = mean_width_by_level(groups)
    rows = []
    for (ds, fam), g in per.groupby(["dataset", "family"]):
        wide = g.pivot_table(index="seed", columns="level", values="mean_width")
        row = {"dataset": ds, "model": fam, "n": len(wide)}
        for level in LEVELS:
            if level in wide:
                row[level], row[f"{level}_low"], row[f"{level}_high"] = t_interval(wide[level].dropna(), alpha)
        if {"easy", "hard"} <= set(wide):
            d = (wide["easy"] - wide["hard"]).dropna()
            row["easy_minus_hard"], row["emh_low"], row["emh_high"] = t_interval(d, alpha)
        r = runs[(runs["dataset"] == ds) & (runs["family"] == fam)]
        row["activated_params"] = r["activated_params"].mean()
        row["test_ppl"], row["test_ppl_low"], row["test_ppl_high"] = t_interval(r["test_ppl"], alpha)
        rows.append(row)
    return pd.DataFrame(rows, columns=DIFFICULTY_COLUMNS)


def write_table(df: pd.DataFrame, stem: Path, floatfmt: str = ".4g") -> None:
    """``stem``.csv and ``stem``.md, both whole or not at all."""
    from mohge.core.atomic import write_text_atomic

    stem.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(stem.with_suffix(".csv"), df.to_csv(index=False, float_format="%.6g"))
    write_text_atomic(stem.with_suffix(".md"), df.to_markdown(index=False, floatfmt=floatfmt) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mohge.study", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="the study's results root (runs.csv, ...)")
    p.add_argument("--config", nargs="+", required=True, help="workflow config files, merged in order")
    p.add_argument("--out", type=Path, required=True, help="folder for the study tables")
    return p


def run_analysis(results: Path, config: dict, out: Path) -> None:
    """Every table of the study whose merged workflow ``config`` and collected CSVs are given (S1-S4)."""
    analysis = config.get("analysis") or {}
    alpha = analysis.get("alpha", 0.05)
    runs = pd.read_csv(results / "runs.csv")
    write_table(model_summary(runs, alpha), out / "S1_models")
    main_dataset = config["experiments"][0]["dataset"]  # Q1 runs on the first experiment's dataset
    write_table(quality_tests(runs[runs["dataset"] == main_dataset], analysis), out / "S2_tests")
    trained = balance(pd.read_csv(results / "utilization_summary.csv"), runs, alpha)
    u = config.get("utilization") or {}
    even = balanced_trace_summary(
        results, runs["run"], u.get("strategies", ["contiguous", "all_size"]), u.get("ep_sizes", [2, 4, 8])
    )
    tables = [trained.assign(trace="trained")]
    if len(even):
        tables.append(balance(even, runs, alpha).assign(trace="even_within_groups"))
    write_table(pd.concat(tables, ignore_index=True), out / "S3_balance")
    write_table(difficulty(pd.read_csv(results / "groups_by_level.csv"), runs, alpha), out / "S4_difficulty")
    write_table(task_table(runs, alpha), out / "S5_tasks")


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    from mohge.config import load_yaml_or_json
    from mohge.config.runs import merge_config

    args = build_parser().parse_args(argv)
    config: dict = {}
    for path in args.config:
        config = merge_config(config, load_yaml_or_json(path))
    for name in ("runs.csv", "utilization_summary.csv", "groups_by_level.csv"):
        if not (args.results / name).is_file():
            raise ValueError(f"--results {args.results}: {name} is missing (run the study's collect step first)")
    run_analysis(args.results, config, args.out)
    return 0
