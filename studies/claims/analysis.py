"""The claims study's pre-declared analysis (studies/claims/config.yaml; design and tests in docs/study.md).

Reads the collected CSVs of one study root and writes its tables. Every test is paired by seed (seed s fixes the
data order of every model) and works on log-perplexity, so a difference is a ratio of perplexities:

    d_s = log ppl_A(s) - log ppl_B(s),   ratio = exp(mean d),   95 % CI = exp(t-interval of mean d)

* Q1, parity: TOST equivalence of MoHGE and the reference MoE at margin m: both one-sided t tests
  H0: mean d <= -log(1+m) and H0: mean d >= +log(1+m) must reject at alpha (:func:`mohge.core.stats.compare`, as
  every interval and test here).
* Q1, non-inferiority (the test that matches "same quality with fewer parameters"): the upper TOST leg alone,
  H0: mean d >= +log(1+m); and the two-sided paired t test of the difference (added after the results).
* Q1b, the MoHGE package: one-sided paired t test of MoHGE against the equal-parameter MoE, H1: mean d < 0. It
  changes router, gate function, auxiliary losses and widths at once, so it tests the package, not heterogeneity.
* Power (declared after the results): from each test's paired sd and n, the power at the declared effect (a ratio of
  exactly 1 for TOST and non-inferiority, a difference of the margin for the other tests) and the minimum
  detectable effect at 80 % power (noncentral t; TOST by integrating over the sd's chi distribution). Never the
  "observed power" at the observed effect.
* Sensitivity: two-sided paired t tests between neighbouring widths of the homogeneous MoE sweep; Q1 is decidable
  only if the equal-parameter width and the reference width separate at alpha. Where they do not, every Q1 row (the
  declared TOST and the post-hoc tests) decides "not decidable (gate)", whatever its own test gave (``test_result``):
  the gate blocks a verdict either way, as the capacity study's gate does (:func:`gate_q1`).
* Multiplicity: ``p_holm``, Holm's adjustment within a family (``family``): per metric, the pre-declared tests of S2
  are one family, its post-hoc tests another (:func:`add_holm`).
* Q2, balance: per-rank expert-FLOP max/mean r >= 1 of each placement (layer "all" of utilization_summary.csv)
  over the seeds of each model: geometric mean and the exponentiated t interval of mean log r, its lower end
  truncated at 1 (r >= 1 always, so intersecting the interval with [1, inf) keeps its coverage); the same for a
  trace with the same group loads spread evenly inside each group (the all-size allocation's own premise,
  docs/method.md §placement). Decided at EP 4, where experts per rank (E / EP) is a multiple of G, the
  allocation's guarantee. FLOP-LPT is fit on the very trace it is scored on: an in-sample oracle, not a placement.
* Unused experts: per layer, the experts that receive under 1 % of a uniform share of the routed slots on the
  test split (from each run's trace.json), mean over seeds.
* Q3, difficulty: mean routed expert width per difficulty level (from groups_by_level.csv), per seed, then mean
  and CI over seeds; the paired easy - hard difference per seed.
* The arms declared after the results (:mod:`mohge_studies.claims.controls`): S8 the controls of Q1b and its
  restatement, S9 Q3's alpha_G = 0 control and dose-response, S10 the token-level Q3 record of the traces.

    mohge study --results results/claims --config configs/config.yaml studies/claims/config.yaml --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from mohge_studies.analysis.tasks import TASK_METRIC, reportable_tasks
from mohge_studies.analysis.utilization import analyze
from mohge_studies.config.runs import AnalysisConfig, UtilizationConfig

from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError
from mohge.core.stats import compare, holm, ratio_interval, t_interval
from mohge.evaluate.traces import Trace, TraceLayer, load_trace

from .controls import (
    bias_balance,
    control_tests,
    graded_datasets,
    paired_log_diffs,
    planned_models,
    q3_dose,
    token_q3,
)

LEVELS = ("easy", "medium", "hard")
# the columns of S4 and S5, also when a study has no graded dataset or no reportable task (an empty table, not a
# file without a header)
DIFFICULTY_COLUMNS = [
    "dataset", "model", "n",
    *(f"{lv}{sfx}" for lv in LEVELS for sfx in ("", "_low", "_high")),
    "easy_minus_hard", "emh_low", "emh_high", "activated_params", "test_ppl", "test_ppl_low", "test_ppl_high",
]  # fmt: skip
DECISION_COLUMNS = [
    "dataset", "model", "trace", "ep_size", "n", "all_size", "all_size_low", "all_size_high", "contiguous",
    "contiguous_low", "contiguous_high", "bar", "below_contiguous", "below_bar", "decision",
]  # fmt: skip
UNUSED_COLUMNS = ["dataset", "model", "layer", "n", "num_experts", "unused", "unused_low", "unused_high"]
UNUSED_COLUMNS += ["unused_groups"]
TASK_COLUMNS = ["dataset", "task", "metric", "model", "n", "mean", "ci_low", "ci_high", "reported"]


def quality_tests(runs: pd.DataFrame, analysis: dict) -> pd.DataFrame:
    """Q1, Q1b and the sensitivity tests, on the primary metric and on the other perplexity."""
    a = AnalysisConfig.from_dict(analysis, "analysis")
    alpha, margin, ref, equal, primary = (
        a.alpha,
        a.equivalence_margin,
        a.reference_family,
        a.equal_family,
        a.primary_metric,
    )
    metrics = [primary, *(m for m in ("test_ppl", "val_ppl") if m != primary)]
    sweep = sweep_widths(runs)
    # (question, A, B, test, role): the tests declared before the runs and those added after the results were read
    # (the test that matches the claim, the difference, dense against the MoEs)
    pre, post = "pre-declared", POST_HOC
    plan = [
        ("Q1 parity", "mohge", ref, "tost", pre),
        ("Q1 non-inferiority", "mohge", ref, "noninferiority", post),
        ("Q1 difference", "mohge", ref, "two-sided", post),
        ("Q1b MoHGE package", "mohge", equal, "less", pre),
    ]
    plan += [("sensitivity", a, b, "two-sided", pre) for a, b in zip(sweep, sweep[1:], strict=False)]
    plan += [("dense vs MoHGE", "dense", "mohge", "two-sided", pre)]
    plan += [("dense vs reference MoE", "dense", ref, "two-sided", post)]
    plan += [("dense vs equal-parameter MoE", "dense", equal, "two-sided", post)]
    rows = []
    for metric in metrics:
        for question, a, b, test, role in plan:
            d = paired_log_diffs(runs, metric, a, b)
            row = {"question": question, "role": role, "metric": metric, "A": a, "B": b, "test": test}
            rows.append({**row, **compare(d, test, alpha, margin)})
    table = pd.DataFrame(rows)
    return gate_q1(add_holm(table, ["metric", "role"], "S2"), equal, ref, alpha)


POST_HOC = "post hoc (added after the results)"
GATED = "not decidable (gate)"


def add_holm(table: pd.DataFrame, by: list[str], name: str) -> pd.DataFrame:
    """``p_holm`` beside ``p``: Holm's adjustment (:func:`mohge.core.stats.holm`) within each family, the rows that
    share the values of ``by`` (S2: one metric and one role, so the pre-declared tests of the primary endpoint are one
    family and the post-hoc tests another); ``family`` names it and counts its tests."""
    table = table.copy()
    table["p_holm"], table["family"] = math.nan, ""
    for key, g in table.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        m = int(g["p"].notna().sum())
        table.loc[g.index, "p_holm"] = holm(g["p"].to_numpy())
        table.loc[g.index, "family"] = f"{name} {', '.join(map(str, key))}: {m} tests"
    cols = list(table.columns)
    cols.insert(cols.index("p") + 1, cols.pop(cols.index("p_holm")))
    return table[cols]


def gate_q1(table: pd.DataFrame, equal: str, ref: str, alpha: float) -> pd.DataFrame:
    """The declared gate of Q1 (docs/study.md "Tests"): Q1 is decidable only if the equal-parameter and the reference
    MoE separate at ``alpha`` (two-sided, nominal p), per metric. Where they do not, every Q1 row (the declared TOST
    and the post-hoc non-inferiority and difference) decides "not decidable (gate)", whichever way its own test went:
    the gate blocks a verdict for the claim and against it alike. ``test_result`` keeps each row's own test outcome."""
    table = table.assign(test_result=table["decision"])
    for _, g in table.groupby("metric", sort=False):
        sens = g[(g["question"] == "sensitivity") & g["A"].isin([equal, ref]) & g["B"].isin([equal, ref])]
        if len(sens) and sens["p"].iloc[0] < alpha:
            continue
        q1 = g.index[g["question"].str.startswith("Q1 ")]
        table.loc[q1, "decision"] = GATED
    return table


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


ORACLES = {"flop_lpt": "in-sample oracle: fit on the trace it is scored on"}
# the all-size placement of a trace made even inside groups: balanced by the allocation's construction wherever the
# experts per rank are a multiple of G, so its number checks the code and is no evidence about trained routing
IDENTITY = "check of the code (identity)"


def balance(util: pd.DataFrame, runs: pd.DataFrame, alpha: float = 0.05, col: str = "max_over_mean") -> pd.DataFrame:
    """Q2: per model x strategy x EP size, over seeds, the step's max/mean expert FLOPs: geometric mean and its
    interval on the log scale, truncated at 1 (:func:`ratio_interval`), and the arithmetic mean."""
    u = util[(util["layer"].astype(str) == "all")].copy()
    u["dataset"] = u["source"].map(runs.set_index("run")["dataset"])
    u["model"] = u["source"].map(runs.set_index("run")["family"])
    rows = []
    keys = ["dataset", "model", "strategy", "ep_size"]
    for (ds, model, strategy, ep), g in u.dropna(subset=["model"]).groupby(keys):
        gmean, lo, hi = ratio_interval(g[col].to_numpy(), alpha)
        rows.append(
            {
                "dataset": ds,
                "model": model,
                "strategy": strategy,
                "ep_size": int(ep),
                "n": len(g),
                "max_over_mean": gmean,
                "ci_low": lo,
                "ci_high": hi,
                "arith_mean": float(g[col].mean()),
                "note": ORACLES.get(strategy, ""),
            }
        )
    return pd.DataFrame(rows)


def balance_decision(s3: pd.DataFrame, dataset: str, ep: int = 4, bar: float = 1.10) -> pd.DataFrame:
    """Q2's pre-declared bar, read at EP ``ep``: per model and trace, "all-size balances" holds where all-size's
    interval lies below contiguous placement's (upper end below its lower end) and below ``bar``. The trace made even
    inside groups is balanced by construction there: its row decides IDENTITY, a check of the code."""
    d = s3[(s3["dataset"] == dataset) & (s3["ep_size"] == ep)]
    rows = []
    for (model, trace), g in d.groupby(["model", "trace"], sort=False):
        by = g.set_index("strategy")
        if not {"all_size", "contiguous"} <= set(by.index):
            continue
        a, c = by.loc["all_size"], by.loc["contiguous"]
        below_c, below_bar = bool(a["ci_high"] < c["ci_low"]), bool(a["ci_high"] < bar)
        rows.append(
            {
                "dataset": dataset, "model": model, "trace": trace, "ep_size": ep, "n": int(a["n"]),
                "all_size": a["max_over_mean"], "all_size_low": a["ci_low"], "all_size_high": a["ci_high"],
                "contiguous": c["max_over_mean"], "contiguous_low": c["ci_low"], "contiguous_high": c["ci_high"],
                "bar": bar, "below_contiguous": below_c, "below_bar": below_bar,
                "decision": IDENTITY if trace == "even_within_groups" else
                ("all-size balances" if below_c and below_bar else "bar not met"),
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def unused_experts(results: Path, runs: pd.DataFrame, share: float = 0.01, alpha: float = 0.05) -> pd.DataFrame:
    """Per model and MoE layer (and "all": the mean over its MoE layers), the experts that receive fewer than
    ``share`` of a uniform share (total routed slots / E) on the traced split: mean and t interval over seeds
    (truncated at 0), from each run's trace.json; beside them the mean number of groups (where a model has several)
    whose routed slots are under ``share`` of an even share."""
    per = []
    for r in runs.itertuples(index=False):
        path = results / "runs" / str(r.run) / "trace.json"
        trace = load_trace(path) if path.is_file() else None
        if trace is None or trace.num_experts < 2:
            continue
        counts = {str(lay.layer): np.asarray(lay.counts, dtype=np.float64) for lay in trace.layers}
        unused = {k: int((c < share * c.sum() / len(c)).sum()) for k, c in counts.items()}
        unused["all"] = float(np.mean(list(unused.values())))
        n = trace.experts_per_group  # groups: n consecutive experts of router order (nan with a single group)
        grouped = {k: c.reshape(-1, n).sum(1) for k, c in counts.items()} if len(trace.expert_widths) > 1 else {}
        groups = {k: int((g < share * g.sum() / len(g)).sum()) for k, g in grouped.items()}
        groups["all"] = float(np.mean(list(groups.values()))) if groups else math.nan
        per += [
            {"dataset": r.dataset, "model": r.family, "layer": k, "num_experts": trace.num_experts, "unused": v,
             "unused_groups": groups.get(k, math.nan)}
            for k, v in unused.items()
        ]  # fmt: skip
    rows = []
    if per:
        df = pd.DataFrame(per)
        for (ds, model, layer), g in df.groupby(["dataset", "model", "layer"], sort=False):
            mean, lo, hi = t_interval(g["unused"].to_numpy(), alpha)
            rows.append(
                {
                    "dataset": ds, "model": model, "layer": layer, "n": len(g), "num_experts": g["num_experts"].iloc[0],
                    "unused": mean, "unused_low": max(lo, 0.0) if lo == lo else lo, "unused_high": hi,
                    "unused_groups": g["unused_groups"].mean(),
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=UNUSED_COLUMNS)


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
    """``stem``.csv, ``stem``.md and ``stem``.html (what `snakemake --report` shows inline), each whole or not."""
    from mohge.core.atomic import write_text_atomic

    stem.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(stem.with_suffix(".csv"), df.to_csv(index=False, float_format="%.6g"))
    write_text_atomic(stem.with_suffix(".md"), df.to_markdown(index=False, floatfmt=floatfmt) + "\n")
    page = df.to_html(index=False, float_format=lambda v: format(v, floatfmt), na_rep="", border=0)
    write_text_atomic(
        stem.with_suffix(".html"),
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{stem.name}'
        f"</title></head><body>\n<p><b>{stem.name}</b></p>\n{page}\n</body></html>\n",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mohge study", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="the study's results root (runs.csv, ...)")
    p.add_argument("--config", nargs="+", required=True, help="workflow config files, merged in order")
    p.add_argument("--out", type=Path, required=True, help="folder for the study tables")
    return p


def run_analysis(results: Path, config: dict, out: Path) -> list[str]:
    """Every table of the study whose merged workflow ``config`` and collected CSVs are given (S1-S11); returns the
    tables' names, in the order written."""
    written: list[str] = []

    def table(df: pd.DataFrame, name: str) -> None:
        write_table(df, out / name)
        written.append(name)

    analysis = config.get("analysis") or {}
    declared = AnalysisConfig.from_dict(analysis, "analysis")
    alpha = declared.alpha
    runs = pd.read_csv(results / "runs.csv")
    unused = unused_experts(results, runs, alpha=alpha)
    s1 = model_summary(runs, alpha)
    every = unused[unused["layer"] == "all"].set_index(["dataset", "model"])["unused"]
    s1["unused_experts"] = [every.get((ds, m), math.nan) for ds, m in zip(s1["dataset"], s1["model"], strict=True)]
    table(s1, "S1_models")
    main_dataset = config["experiments"][0]["dataset"]  # Q1 runs on the first experiment's dataset
    table(quality_tests(runs[runs["dataset"] == main_dataset], analysis), "S2_tests")
    util = pd.read_csv(results / "utilization_summary.csv")
    trained = balance(util, runs, alpha)
    u = UtilizationConfig.from_dict(config.get("utilization") or {}, "utilization")
    even = balanced_trace_summary(results, runs["run"], list(u.strategies), list(u.ep_sizes))
    tables = [trained.assign(trace="trained")]
    if len(even):
        even_table = balance(even, runs, alpha).assign(trace="even_within_groups")
        even_table.loc[even_table["strategy"] == "all_size", "note"] = IDENTITY
        tables.append(even_table)
    s3 = pd.concat(tables, ignore_index=True)
    table(s3, "S3_balance")
    ep, bar = declared.balance_ep, declared.balance_bar
    decision = balance_decision(s3, main_dataset, ep, bar)
    table(decision, "S6_balance_decision")
    table(unused, "S7_unused_experts")
    groups = pd.read_csv(results / "groups_by_level.csv")
    table(difficulty(groups, runs, alpha), "S4_difficulty")
    table(task_table(runs, alpha), "S5_tasks")
    # the arms declared after the results: reported where they ran, "declared, not run" where not
    planned = planned_models(config)
    table(control_tests(runs, config, planned), "S8_controls")
    table(q3_dose(mean_width_by_level(groups), runs, config, planned), "S9_q3_dose")
    graded = graded_datasets(planned) | set(groups.loc[groups["level"].isin(LEVELS), "dataset"])
    table(token_q3(results, runs, graded, alpha, planned), "S10_token_q3")
    table(bias_balance(runs, util, unused, config, planned), "S11_bias_balance")
    return written


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    from mohge_studies.config.runs import merge_config

    from mohge.config import load_yaml_or_json

    args = build_parser().parse_args(argv)
    config: dict = {}
    for path in args.config:
        config = merge_config(config, load_yaml_or_json(path))
    for name in ("runs.csv", "utilization_summary.csv", "groups_by_level.csv"):
        if not (args.results / name).is_file():
            raise ConfigError(f"--results {args.results}: {name} is missing (run the study's collect step first)")
    tables = run_analysis(args.results, config, args.out)
    named = f"{tables[0]} ... {tables[-1]}"
    print(f"{len(tables)} tables ({named}) of {args.results} written to {args.out} (csv, md, html)")
    return 0
