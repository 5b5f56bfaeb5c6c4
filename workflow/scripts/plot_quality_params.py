"""F2: quality against size: perplexity on the full test split, the primary endpoint (lower is better), against
total and activated parameters (activated: under the routing each model learned, mean over seeds).

Inputs: runs (runs.csv). Outputs: png, pdf. Params: metric (default "test_ppl"; the rule passes the study's
primary metric), logx (default false).
One marker per family (mean over its n seeds, error bar: 95% CI where n >= 2), one row of two panels per dataset.
Axes span at least 4% of their centre: a panel whose models differ by less than that says so instead of
magnifying a difference far below the noise.
"""

import mohge_studies.analysis.plotstyle as ps

AXES = {"total_params": "total parameters", "activated_params": "activated params/token, learned routing"}


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot quality against total and activated parameters (F2)."""
    metric = params["metric"]
    df = ps.read_csv(inputs.get("runs"))
    if df.empty or not {metric, *AXES} <= set(df.columns) or df[metric].isna().all():
        ps.placeholder_figure(outputs, "Quality against parameters", f"no {metric} recorded yet")
        return
    df = df.dropna(subset=[metric])
    t = ps.summarise(df, ["dataset", "family"], [metric])
    sizes = df.groupby(["dataset", "family"]).agg({"total_params": "first", "activated_params": "mean"}).reset_index()
    t = t.merge(sizes, on=["dataset", "family"])
    datasets = sorted(t["dataset"].unique())
    fig, axes = ps.panels(2 * len(datasets), ncols=2, height=2.7, width=ps.WIDTH_2COL * 1.3)
    styles = ps.line_styles(t["family"].unique())  # variants of one family in their own shade
    for i, ds in enumerate(datasets):
        d = t[t["dataset"] == ds]
        for k, (ax, (col, name)) in enumerate(zip(axes[2 * i : 2 * i + 2], AXES.items(), strict=True)):
            div, unit = ps.param_scale(d[col])
            for fam in ps.ordered(d["family"], ps.FAMILIES):
                r = d[d["family"] == fam].iloc[0]
                st = ps.family_style(fam)
                color = styles[str(fam)]["color"]
                yerr = 0 if r[f"{metric}_ci95"] != r[f"{metric}_ci95"] else r[f"{metric}_ci95"]
                ax.errorbar(
                    r[col] / div,
                    r[f"{metric}_mean"],
                    yerr=yerr,
                    fmt=styles[str(fam)]["marker"],
                    color=color,
                    mfc=st.get("markerfacecolor", color),
                    ms=6,
                    capsize=3,
                    lw=1,
                    label=f"{ps.study_label(fam)} (n={r['n']})",
                )
            if params.get("logx"):
                ax.set_xscale("log")
            else:
                ps.min_span(ax, "x")
            if ps.min_span(ax, "y"):
                spread = d[f"{metric}_mean"].max() - d[f"{metric}_mean"].min()
                ax.text(
                    0.02,
                    0.02,
                    f"all means within {spread:.2g} ppl",
                    transform=ax.transAxes,
                    fontsize=7,
                    color="#444444",
                )
            if k == 1:  # one legend per dataset, right of its row: no label sits on a marker or an error bar
                ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=6.5, frameon=False)
            ax.set_xlabel(f"{name} ({unit})" if unit else name)
            split = {"val_ppl": "val", "test_ppl": "test"}.get(metric, metric)
            ax.set_ylabel(f"perplexity, full {split} split\n(lower is better)")
            ax.set_title(f"{ds}: quality vs {name.split()[0]} size")
    fig.suptitle(
        f"Quality against model size: mean over n seeds ({ps.n_text(t['n'])}; the legend gives n), "
        "error bars: 95% CI where n ≥ 2",
        fontsize=8.5,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
