"""F14: expert load over training, per model (mean over seeds, 95% CI band): the worst MoE layer's max/mean of routed
slots, the unused experts summed over MoE layers (under 1% of a uniform share), and the worst layer's per-rank FLOP
max/mean under the run's expert-parallel placement, from each logged training step (mohge.train's load columns).

Inputs: curves (curves.csv). Outputs: png, pdf. Params: smooth (logged points in the trailing moving average;
0 = about 2% of a run), families (default: all present).
"""

import mohge_studies.analysis.plotstyle as ps

PANELS = (  # column of curves.csv, y-axis label, the ideal it is read against
    ("expert_load", "expert load, max/mean\n(worst MoE layer)", 1.0),
    ("unused_experts", "unused experts\n(all MoE layers)", 0.0),
    ("rank_flops", "per-rank FLOPs, max/mean\n(worst layer, EP {ep})", 1.0),
)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot expert load over training steps (F14)."""
    df = ps.read_csv(inputs.get("curves"))
    have = [c for c, _, _ in PANELS if c in df and df[c].notna().any()]
    if df.empty or not have:
        ps.placeholder_figure(outputs, "Expert load over training", "these runs' logs hold no load columns")
        return
    df = df[df[have].notna().any(axis=1)]
    datasets = sorted(df["dataset"].unique())
    fig, axes = ps.panels(len(datasets) * len(PANELS), ncols=len(PANELS), height=2.4, width=ps.WIDTH_2COL * 1.45)
    for i, ds in enumerate(datasets):
        d = df[df["dataset"] == ds]
        for ax, (col, label, ideal) in zip(axes[i * len(PANELS) :], PANELS, strict=False):
            ep = d["rank_flops_ep"].dropna()
            ax.set_ylabel(label.format(ep=int(ep.iloc[0]) if len(ep) else "?"), fontsize=8)
            ax.set_xlabel("training step")
            if col == PANELS[0][0]:
                ax.set_title(ds, fontsize=8.5, loc="left")
            if col not in d or d[col].isna().all():
                ps.placeholder(ax, "not logged")
                continue
            ax.axhline(ideal, color="black", lw=0.6, ls=":")
            ends = ps.curve_panel(ax, d, col, int(params.get("smooth", 0)), params.get("families"))
            ps.label_ends(ax, ends, min_gap=0.075)
    note = "lines: mean over the n seeds at each line end (band: 95% CI where n ≥ 2); dotted: perfect balance"
    fig.suptitle(f"Expert load over training\n{note}", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
