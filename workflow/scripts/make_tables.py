"""Tables T1 (main comparison), T2 (parameters by component), T3 (per-GPU load balance): CSV, Markdown, LaTeX.

Inputs (each optional; a table is written when its input and one of its outputs are named):
  runs (runs.csv) -> T1, params (params.csv) -> T2, util or utilization (utilization_summary.csv) -> T3.
Outputs: keys starting with the table (case-insensitive) and ending in _csv, _md or _tex: t1_csv, T1_main_md, ...
Params: source (T3: a routing trace; T3 pools the traces of every seed of that trace's model; default: every
model, one row block each), task_docs (T1: documents per lm-eval task, an int for every task or a dict per task;
used where runs.csv has no task:<task>:n_samples column), alpha (T1: the level of the chance and ceiling tests;
the study's analysis.alpha, which rules/figures.smk passes), heldout_batches (T1: the study's eval.heldout_batches, the
val/test loss batches its evaluations read; 0 or absent: the whole splits).
Reporting rules: means over seeds carry a 95% Student-t interval ("± —" with one seed); activated
parameters are reported beside every comparison, one definition per column; a task is reported only where its
declared metric leaves both chance and ceiling (mohge_studies.analysis.tasks.reportable_tasks), the others are
listed in a note with the reason; a cell is bold only when its row wins a test (n >= 2 and a 95% CI disjoint from
every other row).
"""

import re
from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd
from mohge_studies.analysis.plotstyle import fmt_params, fmt_pm, table_key, write_table
from mohge_studies.analysis.tasks import TASK_METRIC, reportable_tasks

COMPONENTS = ("embeddings", "lm_head", "attention", "norms", "routers", "routed_experts", "shared_experts")
COMPONENTS += ("dense_ffn", "total", "non_embedding")
BOLD_RULE = (
    "Bold: the row wins a test, i.e. it has n ≥ 2 seeds and its 95% CI is disjoint from every other row's "
    "interval (a single-seed row counts as its point value); single-seed rows are never bold."
)
ACTIVATED = {
    "activated_params": "Activated (learned routing)",
    "activated_params_uniform": "Activated (uniform routing)",
}


def bold_winner(display, mean: pd.Series, ci: pd.Series, n: pd.Series, col: str, lower: bool, groups) -> None:
    """Bold the best mean of ``col`` within each group only when it wins (see BOLD_RULE): disjoint 95% CIs
    are a conservative test; the paired tests of the study are in S2."""
    half = ci.where(n >= 2, 0.0).fillna(0.0)
    lo, hi = mean - half, mean + half
    for _, idx in mean.groupby(groups).groups.items():
        v = mean[idx].dropna()
        if len(v) < 2:
            continue
        best = v.idxmin() if lower else v.idxmax()
        if n[best] < 2 or ci[best] != ci[best]:
            continue
        others = [i for i in v.index if i != best]
        if (hi[best] < lo[others].min()) if lower else (lo[best] > hi[others].max()):
            display.loc[best, col] = f"**{display.loc[best, col]}**"


def task_docs(runs: pd.DataFrame, param) -> dict[str, int]:
    """Documents per task: runs.csv's task:<task>:n_samples where collected, else the task_docs param."""
    docs = {}
    for task in TASK_METRIC:
        col = f"task:{task}:n_samples"
        if col in runs and runs[col].notna().any():
            docs[task] = int(runs[col].min())
        elif isinstance(param, dict) and param.get(task):
            docs[task] = int(param[task])
        elif isinstance(param, int | float) and param > 0:
            docs[task] = int(param)
    return docs


def task_columns(runs: pd.DataFrame, params: dict) -> tuple[list[str], list[str]]:
    """(the task metric columns T1 reports, a note per omitted task with its reason)."""
    docs = task_docs(runs, params.get("task_docs"))
    verdict = reportable_tasks(runs, docs, params["alpha"])
    cols, notes = [], []
    for task, (metric, _) in TASK_METRIC.items():
        col = f"task:{task}:{metric}"
        if col not in runs or runs[col].isna().all():
            continue
        if task not in verdict:
            notes.append(f"{task} ({metric}): not reported: number of documents unknown (param task_docs)")
        elif verdict[task].startswith("reported"):
            cols.append(col)
        else:
            notes.append(f"{task} ({metric}): {verdict[task]}, pooled over all runs")
    if "task:mohge_ppl:bits_per_byte" in runs:
        cols.append("task:mohge_ppl:bits_per_byte")  # a perplexity: no chance level or ceiling
    return cols, notes


def loss_scope(heldout_batches: int) -> tuple[str, str]:
    """(T1's words for the val/test splits the perplexities are read on, its perplexity columns' qualifier)."""
    if not heldout_batches:
        return "the full val and test splits", "full split"
    return (
        f"the first {heldout_batches} evaluation batches of the val and test splits",
        f"first {heldout_batches} batches",
    )


def table_main(runs: pd.DataFrame, outputs: dict, params: dict) -> None:
    """T1: one row per (dataset, family), families in the paper's order."""
    tasks, notes = task_columns(runs, params)
    splits, scope = loss_scope(int(params.get("heldout_batches") or 0))
    metrics = [c for c in ("val_ppl", "test_ppl", *tasks, "tokens_per_s") if c in runs.columns]
    runs = runs.assign(_f=runs["family"].map({f: i for i, f in enumerate(ps.FAMILIES)}).fillna(len(ps.FAMILIES)))
    runs = runs.sort_values([c for c in ("dataset", "_f", "family", "seed") if c in runs], kind="stable")
    t = ps.summarise(runs, ["dataset", "family"], metrics).rename(columns={"n": "n_seeds"})
    sizes = [c for c in ("total_params", *ACTIVATED) if c in runs]
    # parameter counts: total and uniform-routing counts are fixed per model; learned routing is the seed mean
    agg = {c: "mean" if c == "activated_params" else "first" for c in sizes}
    first = runs.groupby(["dataset", "family"], sort=False).agg(agg).reset_index()
    t = t.merge(first, on=["dataset", "family"], how="left")
    t = t[["dataset", "family", "n_seeds", *sizes, *t.columns[3 : len(t.columns) - len(sizes)]]]
    d = pd.DataFrame({"Dataset": t["dataset"], "Model": t["family"].map(ps.family_label), "Seeds": t["n_seeds"]})
    for c in sizes:
        d["Total params" if c == "total_params" else ACTIVATED[c]] = t[c].map(fmt_params)
    for m in metrics:
        mean, ci = t[f"{m}_mean"], t[f"{m}_ci95"]
        if m.startswith("task:"):
            _, task, metric = m.split(":", 2)
            lower = "perplexity" in metric or "bits_per" in metric  # lower is better for these
            pct = not lower and bool(mean.dropna().between(0, 1).all())
            col = f"{task.removeprefix('mohge_')} {metric}{' (%)' if pct else ''} {'↓' if lower else '↑'}"
            d[col] = [fmt_pm(a, b, 1 if pct else 3, 100 if pct else 1) for a, b in zip(mean, ci, strict=True)]
            bold_winner(d, mean, ci, t["n_seeds"], col, lower=lower, groups=t["dataset"])
        elif m == "tokens_per_s":
            d["Tokens/s"] = [fmt_pm(a, b, 0) for a, b in zip(mean, ci, strict=True)]
        else:
            col = {"val_ppl": f"Val PPL ({scope}) ↓", "test_ppl": f"Test PPL ({scope}) ↓"}[m]
            d[col] = [fmt_pm(a, b, 2) for a, b in zip(mean, ci, strict=True)]
            bold_winner(d, mean, ci, t["n_seeds"], col, lower=True, groups=t["dataset"])
    notes = [
        "Activated (learned routing): parameters per token under the routing each model learned (mean over seeds); "
        "Activated (uniform routing): the same count if every expert slot were equally likely (T2's definition).",
        BOLD_RULE,
        *(f"Omitted task {n}." for n in notes),
    ]
    caption = f"Main comparison: mean ± 95% CI over n seeds (Student t); perplexity on {splits}."
    write_table(t, d, outputs, "t1", caption, left=2, notes=notes)


def table_params(params: pd.DataFrame, outputs: dict) -> None:
    """T2: one row per model and count (total, activated under uniform routing), one column per component; then, for
    each MoHGE / MoE pair of one dataset or preset, the relative difference of each count in %."""
    fam_rank = {f: i for i, f in enumerate(ps.FAMILIES)}
    cfgs = params.drop_duplicates("config")[["config", "family"]]
    cfgs = cfgs.assign(key=[c.replace(f, "*", 1) for c, f in zip(cfgs["config"], cfgs["family"], strict=True)])
    cfgs = cfgs.assign(_k=cfgs["key"].map({k: i for i, k in enumerate(dict.fromkeys(cfgs["key"]))}))
    cfgs = cfgs.assign(_f=cfgs["family"].map(fam_rank).fillna(len(fam_rank))).sort_values(["_k", "_f"])
    order = ps.ordered(params["component"], COMPONENTS)
    counts = {"total": "total", "activated": "activated (uniform routing)"}
    wide = {
        what: params.drop_duplicates(["component", "config"])
        .pivot(index="config", columns="component", values=what)
        .reindex(index=cfgs["config"], columns=order)
        for what in counts
    }
    rows, shown = [], []
    for c in cfgs["config"]:
        for what, label in counts.items():
            rows.append({"model": c, "count": what, **wide[what].loc[c].to_dict()})
            shown.append({"Model": c, "Count": label, **{k: fmt_params(v) for k, v in wide[what].loc[c].items()}})
    for key, g in cfgs.groupby("key", sort=False):
        by_fam = dict(zip(g["family"], g["config"], strict=True))
        if not {"mohge", "moe"} <= set(by_fam):
            continue
        key = re.sub(r"-+", "-", key.replace("*", "")).strip("-_") or "all"  # "preset-*-3b" -> "preset-3b"
        for what, label in counts.items():
            a, b = wide[what].loc[by_fam["mohge"]], wide[what].loc[by_fam["moe"]]
            rel = ((a - b) / b.where(b != 0) * 100).astype(float)
            rows.append({"model": f"mohge_vs_moe:{key}", "count": f"{what}_rel_diff_pct", **rel.to_dict()})
            cells = {k: "—" if x != x else f"{x:+.1f}%" for k, x in rel.items()}
            shown.append({"Model": f"MoHGE vs MoE ({key})", "Count": f"{label}, Δ", **cells})
    t = pd.DataFrame(rows, columns=["model", "count", *order])
    d = pd.DataFrame(shown, columns=["Model", "Count", *order])
    d = d.rename(columns=lambda c: c.replace("non_", "non-").replace("_", " "))
    caption = "Parameters by component, per model: the total count, then the count a token activates under uniform"
    caption += " routing; last, MoHGE against the MoE of the same data or preset."
    notes = [
        "Activated (uniform routing): every expert slot equally likely, so a MoHGE token activates the mean group "
        "width; T1 also reports the count under the routing each model learned."
    ]
    write_table(t, d, outputs, "t2", caption, left=2, notes=notes)


def model_of(source: pd.Series) -> pd.Series:
    """The model a routing trace comes from: the run name without its seed ("shakespeare-mohge-s2")."""
    return source.astype(str).str.replace(r"-s\d+$", "", regex=True)


def table_load(util: pd.DataFrame, outputs: dict, source: str | None) -> None:
    """T3: (model, strategy, EP size) rows; max/mean and CV of per-GPU FLOPs over the model's traces (one per
    seed), analytic and (if any) measured: mean ± 95% CI with n traces."""
    util = util.assign(layer=ps.as_level(util["layer"]), model=model_of(util["source"]))
    if source:
        util = util[util["model"] == model_of(pd.Series([source])).iloc[0]]
    parts = []
    for kind in ps.ordered(util["kind"], ("analytic", "measured")):
        u = util[util["kind"] == kind]
        u = u[u["layer"] == "all"] if (u["layer"] == "all").any() else u  # else: mean over layers
        u = u.groupby(["model", "strategy", "ep_size", "source"], as_index=False)[["max_over_mean", "cv"]].mean()
        s = ps.summarise(u, ["model", "strategy", "ep_size"], ["max_over_mean", "cv"])
        parts.append(s.set_index(["model", "strategy", "ep_size"]).add_prefix(f"{kind}_"))
    t = pd.concat(parts, axis=1).reset_index()
    t = t.assign(_s=t["strategy"].map({s: i for i, s in enumerate(ps.STRATEGIES)}).fillna(len(ps.STRATEGIES)))
    t = t.sort_values(["model", "_s", "strategy", "ep_size"]).drop(columns="_s").reset_index(drop=True)
    d = pd.DataFrame({"Model (traces)": t["model"], "Strategy": t["strategy"].map(ps.strategy_label)})
    d["EP"] = t["ep_size"].astype(int)
    for kind in ps.ordered(util["kind"], ("analytic", "measured")):
        n = t[f"{kind}_n"].fillna(0).astype(int)
        d[f"n ({kind})"] = n
        for stat, name in (("max_over_mean", "max/mean"), ("cv", "CV")):
            mean, ci = t[f"{kind}_{stat}_mean"], t[f"{kind}_{stat}_ci95"]
            col = f"{name} ({kind}) ↓"
            d[col] = [fmt_pm(a, b, 3) for a, b in zip(mean, ci, strict=True)]
            bold_winner(d, mean, ci, n, col, lower=True, groups=t["model"] + ":" + t["ep_size"].astype(str))
    caption = "Per-GPU load: max/mean and CV of expert FLOPs over EP ranks (layer 'all'), mean ± 95% CI over traces."
    notes = [
        "One routing trace per trained seed; n traces per cell (with n = 1 no interval and no winner).",
        BOLD_RULE.replace("seeds", "traces").replace("single-seed", "single-trace"),
    ]
    write_table(t, d, outputs, "t3", caption, left=2, notes=notes)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Write tables T1, T2, T3 as CSV, Markdown and LaTeX."""
    inputs = {"utilization": inputs.get("util"), **inputs}
    builds = {"t1": "runs", "t2": "params", "t3": "utilization"}
    for prefix, key in builds.items():
        if not (inputs.get(key) and any(table_key(k, prefix) for k in outputs)):
            continue
        df = ps.read_csv(inputs[key])
        if df.empty:
            write_table(df, df, outputs, prefix, f"no rows in {Path(inputs[key]).name}")
        elif prefix == "t1":
            table_main(df, outputs, params)
        elif prefix == "t2":
            table_params(df, outputs)
        else:
            table_load(df, outputs, params.get("source"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
