"""F1: training curves, LM loss against step for each family: mean over seeds, 95% CI band, validation points.

Inputs: curves (curves.csv). Outputs: png, pdf. Params: smooth (logged points in the trailing moving average;
0 = about 2% of a run), families (default: all present), logy (default false).
"""

import mohge_studies.analysis.plotstyle as ps


def whole(ax, d, y: str, families) -> None:
    """An inset with every step of each family's mean curve: the main axes clip the first steps (near ln V)."""
    inset = ax.inset_axes([0.56, 0.56, 0.4, 0.4])
    for fam, g in d.groupby("family"):
        if families and fam not in families:
            continue
        mean = g.groupby("step")[y].mean()
        inset.plot(mean.index, mean.to_numpy(), color=ps.family_style(fam)["color"], lw=0.8)
    inset.set_title("all steps", fontsize=6, pad=2)
    inset.tick_params(labelsize=5, length=2, pad=1)
    inset.grid(False)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the training curves (F1)."""
    df = ps.read_csv(inputs.get("curves"))
    y = "lm_loss" if "lm_loss" in df and df["lm_loss"].notna().any() else "loss"
    if df.empty or y not in df or df[y].isna().all():
        ps.placeholder_figure(outputs, "Training curves", "no training curves recorded yet")
        return
    datasets = sorted(df["dataset"].unique())
    fig, axes = ps.panels(len(datasets))
    for ax, ds in zip(axes, datasets, strict=True):
        d = df[df["dataset"] == ds]
        ends = ps.curve_panel(ax, d, y, int(params.get("smooth", 0)), params.get("families"))
        if "val_loss" in d and d["val_loss"].notna().any():
            for fam, v in d[d["val_loss"].notna()].groupby("family"):
                if params.get("families") and fam not in params["families"]:
                    continue
                band = ps.mean_band(v, "step", "val_loss")
                st = ps.family_style(fam)
                yerr = band["hi"] - band["mean"]
                ax.errorbar(
                    band["step"],
                    band["mean"],
                    yerr=yerr.fillna(0),
                    fmt=st["marker"],
                    color=st["color"],
                    mfc="white",
                    ms=4,
                    capsize=2,
                    lw=0.8,
                    zorder=3,
                )
        # The first steps sit near ln(vocab): the axes clip them so the differences at the end stay visible, and
        # an inset shows every step.
        late = d[d["step"] >= 0.1 * d["step"].max()]
        late = late[[c for c in (y, "val_loss") if c in late]].stack().dropna()
        if late.notna().any():
            ax.set_ylim(late.min() - 0.05 * (late.max() - late.min()), late.quantile(0.99))
            whole(ax, d, y, params.get("families"))
        if params.get("logy"):
            ax.set_yscale("log")
        ps.label_ends(ax, ends, min_gap=0.075)  # 7.5 pt labels: no line touches the next
        ax.set_title(f"{ds}")
        ax.set_xlabel("training step")
        ax.set_ylabel("LM loss (nats/token)")
    note = "lines: training loss, mean over the n seeds at each line end\n(band: 95% CI where n ≥ 2)"
    if "val_loss" in df and df["val_loss"].notna().any():
        note += "; open markers: validation loss"
    fig.suptitle(f"Training curves\n{note}", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
