"""F7: quality against total parameters in the claims study: test perplexity (full split) of every model of one
dataset, the homogeneous MoE width sweep as a connected line, MoHGE and the dense model marked.

Inputs: s1 (S1_models.csv of mohge_studies.claims.analysis). Outputs: png, pdf.
Params: dataset (default "shakespeare", else the first in S1), metric (default "test_ppl").
Each marker is the mean over the model's n seeds (n in the legend) with its 95% t-CI (error bar, n >= 2);
models of equal size are spread a little along x so that none hides another.
Models absent from S1 are skipped, and so are the control arms declared after the results (the lr sweep, the gate,
homogeneous-width and no-balance-loss variants: figure F12 draws their tests), so that every marker stays legible.
"""

import re

import mohge_studies.analysis.plotstyle as ps

SWEEP = re.compile(r"moe(_equal|\+w\d+)?")  # the homogeneous MoE at each width (study.sweep_widths)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot test perplexity against total parameters (F7)."""
    metric = params["metric"]
    s1, ds = ps.study_rows(ps.read_csv(inputs.get("s1")), params["dataset"])
    if s1.empty or metric not in s1 or s1[metric].isna().all():
        ps.placeholder_figure(outputs, "F7: quality against total parameters", f"no {metric} in S1 yet")
        return
    s1 = s1[~s1["model"].map(ps.control_arm)]
    s1 = s1.dropna(subset=[metric]).sort_values(["total_params", "model"])
    div, unit = ps.param_scale(s1["total_params"])
    # models of equal size (MoHGE, its variants, the equal-parameter MoE) side by side, not on top of each other
    span = (s1["total_params"].max() - s1["total_params"].min()) / div or 1.0
    rank = s1.groupby("total_params").cumcount()
    count = s1.groupby("total_params")["model"].transform("size")
    s1 = s1.assign(x=s1["total_params"] / div + (rank - (count - 1) / 2) * 0.02 * span)
    fig, ax = ps.plt.subplots(figsize=(ps.WIDTH_1COL * 1.6, 3.0))
    sweep = s1[s1["model"].astype(str).str.fullmatch(SWEEP.pattern)]
    if len(sweep) > 1:
        ax.plot(sweep["x"], sweep[metric], color=ps.FAMILY_COLORS["moe"], lw=1, ls="-", zorder=1)
    for _, r in s1.iterrows():
        model = str(r["model"])
        st = ps.family_style(model)
        in_sweep = bool(SWEEP.fullmatch(model))
        one = s1[s1["model"] == model]
        err = ps.ci_err(one[metric], one[f"{metric}_low"], one[f"{metric}_high"])
        ax.errorbar(
            r["x"],
            r[metric],
            yerr=err,
            fmt=st["marker"],
            color=st["color"],
            mfc="white" if in_sweep and model != "moe" else st.get("markerfacecolor", st["color"]),
            ms=8 if model in ("mohge", "dense") else 6,
            capsize=3,
            lw=1,
            zorder=3,
            label=ps.with_n(ps.family_label(model) + (" (width sweep)" if in_sweep else ""), r["n"]),
        )
    for model in ("mohge", "dense"):
        r = s1[s1["model"] == model]
        if not r.empty:
            ax.annotate(
                ps.family_label(model),
                (r["x"].iloc[0], r[metric].iloc[0]),
                xytext=(0, -9),
                ha="center",
                va="top",
                textcoords="offset points",
                fontsize=8,
                fontweight="bold",
                bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1},
                color=ps.family_style(model)["color"],
            )
    ps.min_span(ax, "y")
    split = {"val_ppl": "val", "test_ppl": "test"}.get(metric, metric)
    ax.set_xlabel(f"total parameters{f' ({unit})' if unit else ''} (equal sizes drawn slightly apart)")
    ax.set_ylabel(f"perplexity, full {split} split (lower is better)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    ax.set_title(f"{ds}: quality vs total parameters\nmean over n seeds, error bars: 95% CI (n ≥ 2)", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
