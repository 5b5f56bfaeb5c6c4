"""Idle experts and idle width classes over training, read from every run's training log.

Each row of ``runs/<run>/train_log.jsonl`` holds, per MoE layer and over that logging window of routed slots,
``unused_experts`` (experts with under 1 % of a uniform share, counted by the model as it trains) and
``group_usage`` (the share of routed slots of each width class; for MoHGE its groups, for a homogeneous MoE a
single class). From these :func:`idle_table` builds one tidy row per run, logged step and MoE layer, and
:func:`steps_with_unused` counts, per model and layer, the logged steps at which a layer had any unused expert.
A log that holds ``group_usage`` but not ``unused_experts`` gives rows whose ``unused_experts`` is NaN: not
logged, which is not the same as none.

A width class is unused when its share lies under ``share`` of an even share 1 / C over the C classes of the
layer, the experts' own rule applied to the classes. With one class the count means nothing and is NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

UNUSED_SHARE = 0.01  # the share of a uniform share under which the model counts an expert as unused
COLUMNS = ["run", "model", "dataset", "seed", "step", "layer", "unused_experts", "unused_groups"]
STEP_COLUMNS = ["model", "layer", "n", "steps_with_unused", "logged_steps", "last_unused_step"]


def unused_groups(usage: Sequence[float], share: float = UNUSED_SHARE) -> float:
    """Width classes whose share of routed slots ``usage`` lies under ``share`` / C (C classes); NaN for C < 2."""
    if len(usage) < 2:
        return math.nan
    return float(sum(u < share / len(usage) for u in usage))


def log_rows(path: Path, share: float = UNUSED_SHARE) -> list[dict]:
    """Per logged step and MoE layer of one training log: ``step``, ``layer``, ``unused_experts`` as the model
    logged it (NaN where the row does not hold it) and ``unused_groups`` from ``group_usage`` (NaN likewise). A
    row that holds neither gives nothing."""
    rows = []
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        unused, usage = r.get("unused_experts") or [], r.get("group_usage") or []
        for layer in range(max(len(unused), len(usage))):
            count = float(unused[layer]) if unused else math.nan
            groups = unused_groups(usage[layer], share) if usage else math.nan
            rows.append({"step": r["step"], "layer": layer, "unused_experts": count, "unused_groups": groups})
    return rows


def idle_table(logs: Sequence[Path], runs: pd.DataFrame, share: float = UNUSED_SHARE) -> pd.DataFrame:
    """One row per run, logged step and MoE layer (``COLUMNS``) from the training logs ``logs``
    (``<results>/runs/<run>/train_log.jsonl``); runs.csv's rows ``runs`` name each run's model (its ``family``),
    dataset and seed, and a log of a run they do not hold is left out."""
    ident = runs.set_index("run")[["family", "dataset", "seed"]].to_dict("index") if len(runs) else {}
    rows = []
    for path in logs:
        run = Path(path).parent.name
        if run not in ident:
            continue
        who = {"run": run, "model": ident[run]["family"], "dataset": ident[run]["dataset"], "seed": ident[run]["seed"]}
        rows += [{**who, **r} for r in log_rows(Path(path), share)]
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({"step": "int64", "layer": "int64", "unused_experts": "float64", "unused_groups": "float64"})


def steps_with_unused(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and MoE layer of an :func:`idle_table`, over the runs whose logs hold ``unused_experts``: ``n``
    runs, ``steps_with_unused`` (the logged steps at which the layer had at least one unused expert, mean over the
    runs), ``logged_steps`` (logged steps per run, mean over the runs) and ``last_unused_step`` (the last such step
    in any run; NaN where there is none). A model none of whose logs hold the count has no row."""
    table = table[table["unused_experts"].notna()]
    idle = table["unused_experts"] > 0
    per_run = table.assign(idle=idle, idle_step=table["step"].where(idle))
    per_run = per_run.groupby(["model", "layer", "run"], as_index=False).agg(
        steps_with_unused=("idle", "sum"), logged_steps=("step", "nunique"), last_unused_step=("idle_step", "max")
    )
    out = per_run.groupby(["model", "layer"], as_index=False).agg(
        n=("run", "nunique"),
        steps_with_unused=("steps_with_unused", "mean"),
        logged_steps=("logged_steps", "mean"),
        last_unused_step=("last_unused_step", "max"),
    )
    return out[STEP_COLUMNS]


def over_training(table: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, model and logged step of an :func:`idle_table`: ``n`` runs, and ``unused_experts`` and
    ``unused_groups`` per MoE layer, each the mean over the layers and then over the runs that log it (NaN where
    none does)."""
    keys = ["dataset", "model", "step"]
    per_run = table.groupby([*keys, "run"], as_index=False)[["unused_experts", "unused_groups"]].mean()
    out = per_run.groupby(keys, as_index=False).agg(
        n=("run", "nunique"), unused_experts=("unused_experts", "mean"), unused_groups=("unused_groups", "mean")
    )
    return out.sort_values(keys, ignore_index=True)
