"""F13: validation perplexity against activated forward FLOPs per token, at the trained routing and at every knob
point each model was served at (fewer groups per token, the widest groups barred, a lower top-k; no retraining).

Inputs: rows (inference.csv). Outputs: png, pdf.
One panel per dataset; one line per model (family, mean over its n runs at each point), its points labelled by the
served routing; the trained routing is the filled marker. The legend gives n runs and the validation tokens.
"""

import mohge.analysis.plotstyle as ps

SHORT = {"group_topk": "Kg", "bar_widest": "bar", "topk": "K"}


def short(point: str) -> str:
    if point == "trained":
        return ""
    key, _, value = point.partition("=")
    return f"{SHORT.get(key, key)}={value}"


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot quality against activated FLOPs per token along the cost knobs (F13)."""
    df = ps.read_csv(inputs.get("rows"))
    if df.empty or not {"val_ppl", "flops_per_token"} <= set(df.columns):
        ps.placeholder_figure(outputs, "Quality against inference cost", "no inference records yet")
        return
    t = (
        df.groupby(["dataset", "family", "point"])
        .agg(
            val_ppl=("val_ppl", "mean"),
            flops=("flops_per_token", "mean"),
            n=("run", "nunique"),
            n_tokens=("n_tokens", "first"),
        )
        .reset_index()
    )
    datasets = sorted(t["dataset"].unique())
    fig, axes = ps.panels(len(datasets), ncols=2, height=3.0, width=ps.WIDTH_2COL * 1.2)
    styles = ps.line_styles(t["family"].unique())
    for ax, ds in zip(axes, datasets, strict=True):
        d = t[t["dataset"] == ds]
        div, unit = ps.param_scale(d["flops"])
        for fam in ps.ordered(d["family"], ps.FAMILIES):
            g = d[d["family"] == fam].sort_values("flops")
            st = styles[str(fam)]
            n, ntok = int(g["n"].max()), int(g["n_tokens"].max())
            ax.plot(
                g["flops"] / div,
                g["val_ppl"],
                "-",
                color=st["color"],
                lw=1,
                label=f"{ps.study_label(fam)} (n={n}, {ntok} tokens)",
            )
            for r in g.itertuples():
                trained = r.point == "trained"
                ax.plot(
                    r.flops / div,
                    r.val_ppl,
                    st["marker"],
                    color=st["color"],
                    ms=5,
                    mfc=st["color"] if trained else "white",
                )
                if not trained:
                    ax.annotate(
                        short(r.point),
                        (r.flops / div, r.val_ppl),
                        xytext=(3, 3),
                        textcoords="offset points",
                        fontsize=6,
                        color=st["color"],
                    )
        ax.set_xlabel(f"activated forward FLOPs per token ({unit})" if unit else "activated forward FLOPs per token")
        ax.set_ylabel("validation perplexity\n(lower is better)")
        ax.set_title(f"{ds}: quality vs cost, served routing")
        ax.legend(fontsize=6, frameon=False)
    fig.suptitle("Quality against inference cost: filled = trained routing, open = a cheaper served routing")
    fig.tight_layout()
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
