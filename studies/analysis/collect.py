"""Collect every run's small summaries into the CSVs that the tables and figures read.

    mohge collect --results results --runs RUN ... --traced RUN ... --presets mohge-3b moe-3b --out results

Reads, under ``--results``: ``runs/<run>/{config,summary,metrics,params,trace}.json``, ``runs/<run>/train_log.jsonl``,
``params/preset-<name>.json`` and ``utilization/<run>/{summary,analytic,comparison,measured}.csv``; writes
``runs.csv``, ``curves.csv``, ``groups_by_level.csv``, ``params.csv``, ``utilization_summary.csv`` and
``utilization_ranks.csv`` (schemas in the module's functions; ``configs/README.md`` lists them). A missing
input file is an error that names it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mohge.config.sections import group_aux_active
from mohge.config.sizes import COMPONENTS, swiglu_params
from mohge.core.atomic import atomic_path
from mohge.core.cli import setup_logging, user_errors
from mohge.core.knobs import ConfigError

log = logging.getLogger("mohge.collect")
# lm-eval metrics carried into runs.csv: accuracies, and bits per byte for the rolling-perplexity task
TASK_METRICS = ("acc", "acc_norm", "exact_match", "bits_per_byte", "n_samples")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"missing input {path}")
    return json.loads(path.read_text())


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g", lineterminator="\n")


def model_name(cfg: dict) -> str:
    """The family, qualified by the variant when the run has one ("mohge+renorm"): what tables group by."""
    return f"{cfg['family']}+{cfg['variant']}" if cfg.get("variant") else cfg["family"]


def run_row(results: Path, run: str) -> dict:
    """One row of runs.csv: identity, parameters, held-out quality, every lm-eval metric, speed."""
    d = results / "runs" / run
    cfg, summary, metrics = (
        _read_json(d / "config.json"),
        _read_json(d / "summary.json"),
        _read_json(d / "metrics.json"),
    )
    params = _read_json(d / "params.json")
    row = {
        "run": run,
        "dataset": cfg["dataset"],
        "family": model_name(cfg),
        "seed": cfg["train"]["seed"],
        "total_params": params["total_sum"],
        "activated_params": measured_activated(cfg, params, d / "train_log.jsonl"),
        "activated_params_uniform": params["activated_sum"],
        "routed_params": params["total"]["routed_experts"],
        # held-out quality on the FULL val and test splits (metrics.json); the trainer's own val_ppl is only a
        # fixed head of the val split, kept in summary.json for monitoring
        "val_loss": metrics.get("val", {}).get("loss", summary.get("val_loss")),
        "val_ppl": metrics.get("val", {}).get("ppl", summary.get("val_ppl")),
        "test_loss": metrics.get("test", {}).get("loss"),
        "test_ppl": metrics.get("test", {}).get("ppl"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "train_seconds": summary.get("train_time_s", summary.get("wall_time_s")),
    }
    for task, values in sorted(metrics.get("tasks", {}).items()):
        for metric, value in sorted(values.items()):
            if metric in TASK_METRICS and isinstance(value, int | float):
                row[f"task:{task}:{metric}"] = value
    if facts := metrics.get(
        "facts"
    ):  # the capacity endpoint (facts source, mohge.evaluate.bits_stored): those runs only
        row["bits_stored"], row["fact_recall"], row["data_bits"] = (
            facts["bits_stored"],
            facts["recall"],
            facts["total_bits"],
        )
        row["total_params_non_embedding"] = params["total_non_embedding"]
    return row


def measured_activated(cfg: dict, params: dict, log_path: Path) -> float:
    """Activated parameters per token under the routing the model learned: the uniform-routing count with its
    routed-expert part replaced by 3*D*(activated width per token) of each MoE layer in the last log row.
    Falls back to the uniform count for models without routed experts or without a logged width."""
    rows = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.is_file() else []
    widths = next((r["activated_expert_width"] for r in reversed(rows) if r.get("activated_expert_width")), None)
    if not widths:
        return params["activated_sum"]
    routed = sum(swiglu_params(cfg["model"]["d_model"], w) for w in widths)
    return params["activated_sum"] - params["activated"]["routed_experts"] + routed


def curve_rows(results: Path, run: str) -> list[dict]:
    """Rows of curves.csv: per logged step the losses, mean routed-slot width (mean over MoE layers), lr, and the
    expert load where the log row holds it: ``expert_load`` (the worst MoE layer's max/mean of routed slots),
    ``unused_experts`` (summed over MoE layers), ``rank_flops`` (the worst layer's per-rank FLOP max/mean at EP
    ``rank_flops_ep``); NaN where the log has no load columns."""
    d = results / "runs" / run
    cfg = _read_json(d / "config.json")
    path = d / "train_log.jsonl"
    if not path.is_file():
        raise ConfigError(f"missing input {path}")
    steps = cfg["train"]["steps"]
    frac = cfg["loss"]["group_aux_start_frac"]
    start = next((s for s in range(steps) if group_aux_active(s, steps, frac)), math.nan)
    ident = {"run": run, "dataset": cfg["dataset"], "family": model_name(cfg), "seed": cfg["train"]["seed"]}
    ident["group_aux_start"] = start if cfg["family"] == "mohge" else math.nan
    rows = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        widths = r.get("mean_expert_width")
        aux = r.get("aux", {})
        rows.append(
            {
                **ident,
                "step": r["step"],
                "loss": r.get("loss", math.nan),
                "lm_loss": r.get("lm_loss", math.nan),
                "group_aux": aux.get("group_aux", math.nan),
                "expert_aux": aux.get("expert_aux", aux.get("hmoe_penalty", math.nan)),
                "mean_width": sum(widths) / len(widths) if widths else math.nan,
                "lr": r.get("lr", math.nan),
                "val_loss": r.get("val_loss", math.nan),
                "expert_load": max(r["expert_load"]) if r.get("expert_load") else math.nan,
                "unused_experts": sum(r["unused_experts"]) if r.get("unused_experts") else math.nan,
                "rank_flops": max(r["rank_flops"]) if r.get("rank_flops") else math.nan,
                "rank_flops_ep": r.get("rank_flops_ep", math.nan),
            }
        )
    return rows


def group_rows(results: Path, run: str) -> list[dict]:
    """Rows of groups_by_level.csv: routed slots per expert group (width class), per layer and level."""
    d = results / "runs" / run
    cfg, trace = _read_json(d / "config.json"), _read_json(d / "trace.json")
    widths, n = trace["expert_widths"], trace["experts_per_group"]
    ident = {"run": run, "dataset": cfg["dataset"], "family": model_name(cfg), "seed": cfg["train"]["seed"]}
    per_level: dict[tuple, list[int]] = {}
    over_layers: dict[str, list[int]] = {}
    for layer in trace["layers"]:
        levels = {"all": layer["counts"], **layer.get("counts_by_level", {})}
        for level, counts in levels.items():
            groups = [sum(counts[g * n : (g + 1) * n]) for g in range(len(widths))]
            per_level[(layer["layer"], level)] = groups
            prev = over_layers.get(level, [0] * len(widths))
            over_layers[level] = [a + b for a, b in zip(prev, groups, strict=True)]
    per_level.update({("all", level): groups for level, groups in over_layers.items()})
    rows = []
    for (layer, level), groups in per_level.items():
        total = sum(groups)
        for g, slots in enumerate(groups):
            rows.append(
                {
                    **ident,
                    "layer": layer,
                    "level": level,
                    "group": g,
                    "width": widths[g],
                    "slots": slots,
                    "share": slots / total if total else math.nan,
                }
            )
    return rows


def param_rows(name: str, family: str, counts: dict) -> list[dict]:
    rows = [
        {
            "config": name,
            "family": family,
            "component": c,
            "total": counts["total"][c],
            "activated": counts["activated"][c],
        }
        for c in COMPONENTS
    ]
    rows.append(
        {
            "config": name,
            "family": family,
            "component": "total",
            "total": counts["total_sum"],
            "activated": counts["activated_sum"],
        }
    )
    rows.append(
        {
            "config": name,
            "family": family,
            "component": "non_embedding",
            "total": counts["total_non_embedding"],
            "activated": counts["activated_non_embedding"],
        }
    )
    return rows


def utilization_frames(results: Path, traced: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """utilization_summary.csv (analytic and measured imbalance) and utilization_ranks.csv (per-rank loads)."""
    summaries, ranks = [], []
    for run in traced:
        d = results / "utilization" / run
        s = pd.read_csv(d / "summary.csv")
        summaries.append(
            pd.DataFrame(
                {
                    "source": run,
                    "strategy": s["strategy"],
                    "ep_size": s["ep_size"],
                    "layer": s["layer"].astype(str),
                    "max_over_mean": s["max_over_mean"],
                    "cv": s["cv"],
                    "kind": "analytic",
                }
            )
        )
        comp = d / "comparison.csv"
        if comp.is_file():
            c = pd.read_csv(comp)
            summaries.append(
                pd.DataFrame(
                    {
                        "source": run,
                        "strategy": c["strategy"],
                        "ep_size": c["ep_size"],
                        "layer": c["layer"].astype(str),
                        "max_over_mean": c["measured_max_over_mean"],
                        "cv": c["measured_cv"],
                        "kind": "measured",
                    }
                )
            )
        a = pd.read_csv(d / "analytic.csv")
        ranks.append(
            a.assign(source=run)[["source", "strategy", "ep_size", "layer", "rank", "flops", "params", "tokens"]]
        )
    return pd.concat(summaries, ignore_index=True), pd.concat(ranks, ignore_index=True)


def collect(results: Path, runs: Sequence[str], traced: Sequence[str], presets: Sequence[str], out: Path) -> None:
    runs_df = pd.DataFrame([run_row(results, r) for r in runs])
    curves = pd.DataFrame([row for r in runs for row in curve_rows(results, r)])
    groups = pd.DataFrame([row for r in traced for row in group_rows(results, r)])
    prow = []
    seen = set()
    for r in runs:
        cfg = _read_json(results / "runs" / r / "config.json")
        key = f"{cfg['dataset']}-{model_name(cfg)}"
        if key not in seen:  # parameters do not depend on the seed
            seen.add(key)
            prow += param_rows(key, model_name(cfg), _read_json(results / "runs" / r / "params.json"))
    for p in presets:
        family = p.split("-")[0]
        prow += param_rows(f"preset-{p}", family, _read_json(results / "params" / f"preset-{p}.json"))
    util_summary, util_ranks = utilization_frames(results, traced)
    for name, df in (
        ("runs.csv", runs_df),
        ("curves.csv", curves),
        ("groups_by_level.csv", groups),
        ("params.csv", pd.DataFrame(prow)),
        ("utilization_summary.csv", util_summary),
        ("utilization_ranks.csv", util_ranks),
    ):
        _write_csv(df, out / name)
        log.info("wrote %s (%d rows)", out / name, len(df))


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge collect", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=Path("results"), help="the results folder to read")
    ap.add_argument("--runs", nargs="+", required=True, help="runs to collect")
    ap.add_argument("--traced", nargs="*", default=[], help="runs with routing traces and utilization results")
    ap.add_argument("--presets", nargs="*", default=[], help="parameter-count presets (results/params/preset-*.json)")
    ap.add_argument("--out", type=Path, default=Path("results"), help="where the CSVs go")
    args = ap.parse_args(argv)
    setup_logging()
    collect(args.results, args.runs, args.traced, args.presets, args.out)
    return 0
