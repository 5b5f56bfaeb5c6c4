"""F5: mean activated expert width over training for MoHGE (and HMoE), with the step where the group loss starts.

Inputs: curves (curves.csv; columns mean_width and group_aux_start). Outputs: png, pdf.
Params: families (default ["mohge", "hmoe"]), smooth (as in plot_curves).
"""

import mohge_studies.analysis.plotstyle as ps


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the mean activated expert width over training (F5)."""
    families = params.get("families") or ["mohge", "hmoe"]
    df = ps.read_csv(inputs.get("curves"))
    if not df.empty and "mean_width" in df:
        df = df[ps.in_families(df["family"], families) & df["mean_width"].notna()]
    if df.empty or "mean_width" not in df:
        ps.placeholder_figure(outputs, "Mean activated expert width", "no expert-width curves recorded yet")
        return
    datasets = sorted(df["dataset"].unique())
    fig, axes = ps.panels(len(datasets))
    for ax, ds in zip(axes, datasets, strict=True):
        d = df[df["dataset"] == ds]
        ends = ps.curve_panel(ax, d, "mean_width", int(params.get("smooth", 0)), families)
        if "group_aux_start" in d:
            for fam, g in d.dropna(subset=["group_aux_start"]).groupby("family"):
                start = g["group_aux_start"].median()
                ax.axvline(start, color=ps.family_style(fam)["color"], ls="--", lw=0.9)
                ax.annotate(
                    f"group loss on\n(step {start:g})",
                    (start, 1),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -3),
                    textcoords="offset points",
                    va="top",
                    fontsize=7,
                    bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1},
                )
        ps.label_ends(ax, ends, min_gap=0.075)  # 7.5 pt labels: no line touches the next
        ax.set_title(ds)
        ax.set_xlabel("training step")
        ax.set_ylabel("mean activated expert width\n(hidden units per routed slot)")
    fig.suptitle(
        "Width of the experts tokens are routed to\nmean over the n seeds at each line end (band: 95% CI where n ≥ 2)",
        fontsize=8.5,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
