"""Tables T1 (main comparison), T2 (parameters by component), T3 (per-GPU load balance): CSV, Markdown, LaTeX.

Inputs (each optional; a table is written when its input and one of its outputs are named):
  runs (runs.csv) -> T1, params (params.csv) -> T2, util or utilization (utilization_summary.csv) -> T3.
Outputs: keys starting with the table (case-insensitive) and ending in _csv, _md or _tex: t1_csv, T1_main_md, ...
Params: source (T3: one routing trace; default: the mean over traces).
Means over seeds carry a 95% Student-t interval ("± —" with one seed); the best value per column is in bold.
"""

import re
import sys
from pathlib import Path

import pandas as pd

_smk = globals().get("snakemake")  # set by Snakemake's script: directive
# Snakemake runs a copy of this file (after its preamble: hence no __future__ import here);
# snakemake.scriptdir is the directory of the original, where plotstyle.py lives.
sys.path.insert(0, str(getattr(_smk, "scriptdir", None) or Path(__file__).resolve().parent))
import plotstyle as ps  # noqa: E402

COMPONENTS = ("embeddings", "lm_head", "attention", "norms", "routers", "routed_experts", "shared_experts")
COMPONENTS += ("dense_ffn", "total", "non_embedding")
TEX_SYMBOLS = {"±": r"$\pm$", "—": "---", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "Δ": r"$\Delta$"}


def fmt_pm(mean: float, ci: float, digits: int, scale: float = 1.0) -> str:
    if mean != mean:
        return "—"
    ci_text = "—" if ci != ci else f"{ci * scale:,.{digits}f}"
    return f"{mean * scale:,.{digits}f} ± {ci_text}"


def fmt_params(v: float) -> str:
    if v != v or v == 0:
        return "—" if v != v else "0"
    div, unit = ps.param_scale([v])
    x = v / div
    return f"{x:.{2 if x < 10 else 1 if x < 100 else 0}f}{unit}"


def bold_best(display: pd.DataFrame, values: pd.Series, col: str, lower: bool, groups: pd.Series) -> None:
    """Mark the best mean of ``col`` within each group (e.g. per dataset) in bold, when there is a choice."""
    for _, idx in values.groupby(groups).groups.items():
        v = values[idx].dropna()
        if len(v) > 1:
            best = v.idxmin() if lower else v.idxmax()
            display.loc[best, col] = f"**{display.loc[best, col]}**"


def tex(s: str) -> str:
    """Escape LaTeX specials, typeset the symbols, and turn Markdown **bold** into \\textbf."""
    s = re.sub(r"([&%$#_{}])", r"\\\1", s)
    for k, v in TEX_SYMBOLS.items():
        s = s.replace(k, v)
    return re.sub(r"\*\*(.+?)\*\*", r"\\textbf{\1}", s)


def table_key(key: str, prefix: str, ext: str = "") -> bool:
    """Whether an output key names table ``prefix`` ('t1') in format ``ext``: 't1_csv', 'T1_main_csv', ..."""
    key = key.lower()
    return key.startswith(prefix) and not key[len(prefix) : len(prefix) + 1].isdigit() and key.endswith(ext)


def write_table(machine, display, outputs: dict, prefix: str, caption: str, left: int = 1) -> None:
    """The machine table as CSV; the display table (strings) as Markdown and as a booktabs LaTeX tabular."""
    paths = {e: Path(p) for k, p in outputs.items() for e in ("csv", "md", "tex") if table_key(k, prefix, f"_{e}")}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    if "csv" in paths:
        machine.to_csv(paths["csv"], index=False)
    head, cells = list(display.columns), display.astype(str).values.tolist()
    align = ["l" if i < left else "r" for i in range(len(head))]
    if "md" in paths:
        rows = [head, [":--" if a == "l" else "--:" for a in align], *cells]
        body = [f"| {' | '.join(r)} |" for r in rows] if cells else ["_No data yet._"]
        paths["md"].write_text("\n".join([f"**{prefix.upper()}.** {caption}", "", *body]) + "\n")
    if "tex" in paths:
        rows = [" & ".join(map(tex, r)) + r" \\" for r in [head, *cells]] if cells else [r"No data yet. \\"]
        lines = [f"% {prefix.upper()}: {caption} (written by make_tables.py; do not edit)"]
        lines += [rf"\begin{{tabular}}{{{''.join(align) if cells else 'l'}}}", r"\toprule", rows[0], r"\midrule"]
        paths["tex"].write_text("\n".join([*lines, *rows[1:], r"\bottomrule", r"\end{tabular}"]) + "\n")


def table_main(runs: pd.DataFrame, outputs: dict) -> None:
    """T1: one row per (dataset, family), families in the paper's order."""
    tasks = [c for c in runs.columns if c.startswith("task:")]
    metrics = [c for c in ("val_ppl", "test_ppl", *tasks, "tokens_per_s") if c in runs.columns]
    runs = runs.assign(_f=runs["family"].map({f: i for i, f in enumerate(ps.FAMILIES)}).fillna(len(ps.FAMILIES)))
    runs = runs.sort_values([c for c in ("dataset", "_f", "family", "seed") if c in runs], kind="stable")
    t = ps.summarise(runs, ["dataset", "family"], metrics).rename(columns={"n": "n_seeds"})
    sizes = [c for c in ("total_params", "activated_params") if c in runs]
    first = runs.groupby(["dataset", "family"], sort=False)[sizes].first().reset_index()
    t = t.merge(first, on=["dataset", "family"], how="left")
    t = t[["dataset", "family", "n_seeds", *sizes, *t.columns[3 : len(t.columns) - len(sizes)]]]
    d = pd.DataFrame({"Dataset": t["dataset"], "Model": t["family"].map(ps.family_label), "Seeds": t["n_seeds"]})
    for c in sizes:
        d["Total params" if c == "total_params" else "Activated"] = t[c].map(fmt_params)
    for m in metrics:
        mean, ci = t[f"{m}_mean"], t[f"{m}_ci95"]
        if m.startswith("task:"):
            _, task, metric = m.split(":", 2)
            lower = "perplexity" in metric or "bits_per" in metric  # lower is better for these
            pct = not lower and bool(mean.dropna().between(0, 1).all())
            col = f"{task.removeprefix('mohge_')} {metric}{' (%)' if pct else ''} {'↓' if lower else '↑'}"
            d[col] = [fmt_pm(a, b, 1 if pct else 3, 100 if pct else 1) for a, b in zip(mean, ci, strict=True)]
            bold_best(d, mean, col, lower=lower, groups=t["dataset"])
        elif m == "tokens_per_s":
            d["Tokens/s"] = [fmt_pm(a, b, 0) for a, b in zip(mean, ci, strict=True)]
        else:
            col = {"val_ppl": "Val PPL ↓", "test_ppl": "Test PPL ↓"}[m]
            d[col] = [fmt_pm(a, b, 2) for a, b in zip(mean, ci, strict=True)]
            bold_best(d, mean, col, lower=True, groups=t["dataset"])
    write_table(t, d, outputs, "t1", "Main comparison: mean ± 95% CI over seeds (Student t).", left=2)


def table_params(params: pd.DataFrame, outputs: dict) -> None:
    """T2: components x configs, totals then activated, then MoHGE vs MoE relative differences."""
    fam_rank = {f: i for i, f in enumerate(ps.FAMILIES)}
    cfgs = params.drop_duplicates("config")[["config", "family"]]
    cfgs = cfgs.assign(key=[c.replace(f, "*", 1) for c, f in zip(cfgs["config"], cfgs["family"], strict=True)])
    cfgs = cfgs.assign(_k=cfgs["key"].map({k: i for i, k in enumerate(dict.fromkeys(cfgs["key"]))}))
    cfgs = cfgs.assign(_f=cfgs["family"].map(fam_rank).fillna(len(fam_rank))).sort_values(["_k", "_f"])
    order = ps.ordered(params["component"], COMPONENTS)
    t = pd.DataFrame({"component": order})
    d = pd.DataFrame({"Component": [c.replace("_", " ") for c in order]})
    for what in ("total", "activated"):
        wide = params.drop_duplicates(["component", "config"]).pivot(index="component", columns="config", values=what)
        wide = wide.reindex(index=order, columns=cfgs["config"])
        for c in cfgs["config"]:
            t[f"{c}:{what}"] = wide[c].values
            d[f"{what.capitalize()}: {c}"] = wide[c].map(fmt_params).values
    for key, g in cfgs.groupby("key", sort=False):
        by_fam = dict(zip(g["family"], g["config"], strict=True))
        key = re.sub(r"-+", "-", key.replace("*", "")).strip("-_") or "all"  # "preset-*-3b" -> "preset-3b"
        if "mohge" in by_fam and "moe" in by_fam:
            for what in ("total", "activated"):
                a, b = t[f"{by_fam['mohge']}:{what}"], t[f"{by_fam['moe']}:{what}"]
                rel = ((a - b) / b.where(b != 0) * 100).astype(float)
                t[f"mohge_vs_moe:{key}:{what}_rel_diff_pct"] = rel
                d[f"Δ {what} MoHGE vs MoE ({key})"] = rel.map(lambda x: "—" if x != x else f"{x:+.1f}%")
    write_table(t, d, outputs, "t2", "Parameters by component (totals, then activated per token).")


def table_load(util: pd.DataFrame, outputs: dict, source: str | None) -> None:
    """T3: (strategy, EP size) rows; max/mean and CV of per-GPU FLOPs, analytic and (if any) measured."""
    util = util.assign(layer=ps.as_level(util["layer"]))
    if source:
        util = util[(util["kind"] != "analytic") | (util["source"] == source)]
    parts = []
    for kind in ps.ordered(util["kind"], ("analytic", "measured")):
        u = util[util["kind"] == kind]
        u = u[u["layer"] == "all"] if (u["layer"] == "all").any() else u  # else: mean over layers
        u = u.groupby(["strategy", "ep_size"])[["max_over_mean", "cv"]].mean()
        parts.append(u.add_prefix(f"{kind}_"))
    t = pd.concat(parts, axis=1).reset_index()
    t = t.assign(_s=t["strategy"].map({s: i for i, s in enumerate(ps.STRATEGIES)}).fillna(len(ps.STRATEGIES)))
    t = t.sort_values(["_s", "strategy", "ep_size"]).drop(columns="_s").reset_index(drop=True)
    d = pd.DataFrame({"Strategy": t["strategy"].map(ps.strategy_label), "EP": t["ep_size"].astype(int)})
    for col in t.columns[2:]:
        kind, stat = col.split("_", 1)
        name = f"{'max/mean' if stat == 'max_over_mean' else 'CV'} ({kind}) ↓"
        d[name] = t[col].map(lambda x: "—" if x != x else f"{x:.3f}")
        bold_best(d, t[col], name, lower=True, groups=t["ep_size"])
    write_table(t, d, outputs, "t3", "Per-GPU load: max/mean and CV of FLOPs over EP ranks (layer 'all').")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Write tables T1, T2, T3 as CSV, Markdown and LaTeX."""
    inputs = {"utilization": inputs.get("util"), **inputs}
    builds = {"t1": ("runs", table_main), "t2": ("params", table_params), "t3": ("utilization", table_load)}
    for prefix, (key, build) in builds.items():
        if inputs.get(key) and any(table_key(k, prefix) for k in outputs):
            df = ps.read_csv(inputs[key])
            if df.empty:
                write_table(df, df, outputs, prefix, f"no rows in {Path(inputs[key]).name}")
            else:
                build(df, outputs, **({"source": params.get("source")} if prefix == "t3" else {}))


if __name__ == "__main__":
    ps.run(main, _smk)
