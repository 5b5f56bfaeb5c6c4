"""F13: validation perplexity against activated forward FLOPs per token, at the trained routing and at every knob
point each model was served at (fewer groups per token, the widest groups barred, a lower top-k; no retraining).

Inputs: rows (inference.csv). Outputs: png, pdf.
One panel per dataset. Per model (family, colour and marker): its trained routing as a filled marker, and one line per
knob from there to its cheapest point (line style per knob, the cheapest point labelled); every point is the mean over
the model's n runs with its 95 % Student-t interval where n >= 2. The legend gives n runs and the validation tokens.
"""

import matplotlib.lines as mlines
import mohge_studies.analysis.plotstyle as ps
import pandas as pd

SHORT = {"group_topk": "Kg", "bar_widest": "bar", "topk": "K"}
KNOBS = {  # knob (the keys of a served point) -> line style, legend label
    "topk": ("-", "top-k lowered"),
    "group_topk,topk": ("--", "groups K_g lowered, K scaled"),
    "group_topk": (":", "groups K_g lowered alone"),
    "bar_widest": ("-.", "widest groups barred"),
}


def knob(point: str) -> str:
    """The knob a served point turns ("topk", "group_topk,topk", ...); "" for the trained routing."""
    return "" if point == "trained" else ",".join(part.partition("=")[0] for part in point.split(","))


def short(point: str) -> str:
    """A point's label: "K=1", "Kg=2,K=2", "bar=4"."""
    if point == "trained":
        return ""
    return ",".join(f"{SHORT.get(k, k)}={v}" for k, _, v in (part.partition("=") for part in point.split(",")))


def summarise(df):
    """One row per (dataset, family, point): mean perplexity with its 95 % half-width, mean FLOPs, n, tokens."""
    rows = []
    for (ds, fam, point), g in df.groupby(["dataset", "family", "point"]):
        mean, hw, n = ps.mean_ci(g["val_ppl"])
        rows.append({"dataset": ds, "family": fam, "point": point, "knob": knob(point), "val_ppl": mean, "hw": hw,
                     "n": n, "flops": g["flops_per_token"].mean(), "n_tokens": int(g["n_tokens"].max())})  # fmt: skip
    return pd.DataFrame(rows)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot quality against activated FLOPs per token along the cost knobs (F13)."""
    df = ps.read_csv(inputs.get("rows"))
    if df.empty or not {"val_ppl", "flops_per_token"} <= set(df.columns):
        ps.placeholder_figure(outputs, "Quality against inference cost", "no inference records yet")
        return
    t = summarise(df)
    datasets = sorted(t["dataset"].unique())
    fig, axes = ps.panels(len(datasets), ncols=1, height=3.0, width=ps.WIDTH_2COL * 1.2)
    styles = ps.line_styles(t["family"].unique())
    used = set()
    for ax, ds in zip(axes, datasets, strict=True):
        d = t[t["dataset"] == ds]
        div, unit = ps.param_scale(d["flops"])
        handles = []
        for fam in ps.ordered(d["family"], ps.FAMILIES):
            g, st = d[d["family"] == fam], styles[str(fam)]
            trained = g[g["point"] == "trained"]
            for k in (k for k in KNOBS if (g["knob"] == k).any()):
                line = pd.concat([trained, g[g["knob"] == k]]).sort_values("flops", ascending=False)
                ax.plot(line["flops"] / div, line["val_ppl"], KNOBS[k][0], color=st["color"], lw=1)
                end = line.iloc[-1]
                ax.annotate(short(end["point"]), (end["flops"] / div, end["val_ppl"]), xytext=(-4, 4),
                            textcoords="offset points", ha="right", fontsize=6, color=st["color"])  # fmt: skip
                used.add(k)
            for r in g.itertuples():
                filled = r.point == "trained"
                face = st["color"] if filled else "white"
                yerr = r.hw if r.hw == r.hw else None
                ax.errorbar(r.flops / div, r.val_ppl, yerr=yerr, fmt=st["marker"], color=st["color"], ms=5, mfc=face,
                            capsize=2, lw=0.8)  # fmt: skip
            n = int(g["n"].max())
            label = f"{ps.study_label(fam)} (n={n}, {g['n_tokens'].max()} tokens)"
            handles.append(mlines.Line2D([], [], color=st["color"], marker=st["marker"], ls="none", label=label))
        handles += [
            mlines.Line2D([], [], color="0.4", ls=KNOBS[k][0], lw=1, label=KNOBS[k][1]) for k in KNOBS if k in used
        ]
        ax.legend(handles=handles, fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_xlabel(f"activated forward FLOPs per token ({unit})" if unit else "activated forward FLOPs per token")
        ax.set_ylabel("validation perplexity\n(lower is better)")
        ax.set_title(f"{ds}: quality against cost as served")
    fig.suptitle(
        "Filled: the trained routing; open: served cheaper without retraining (label: the cheapest point of each knob);"
        "\nbars: 95% CI over runs where n ≥ 2",
        fontsize=8,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
