"""F4: per-GPU load under each expert placement: FLOPs per expert-parallel rank divided by the mean over ranks.

Inputs: ranks (utilization_ranks.csv), summary (utilization_summary.csv, optional).
Outputs: png, pdf. Params: source (the routing trace; default the first in sorted order).
One panel per EP size: each rank's FLOPs summed over layers / the mean rank, for the named trace (n = 1).
Last panel: max/mean against EP size, from the summary's layer "all" rows (the step ratio of T3: sum over layers of
the slowest rank / of the mean rank; analytic lines, measured open markers): the mean over the traces of every seed
of the source's model, with its 95% CI where n >= 2 (n in the title), or from the per-rank loads when no summary
is given.
"""

import re

import mohge_studies.analysis.plotstyle as ps
from matplotlib.ticker import MaxNLocator


def rank_loads(ranks):
    """FLOPs per (strategy, ep_size, rank) over layer "all" (else summed over layers), divided by the rank mean."""
    ranks = ranks.assign(layer=ps.as_level(ranks["layer"]))
    ranks = ranks[ranks["layer"] == "all"] if (ranks["layer"] == "all").any() else ranks
    load = ranks.groupby(["strategy", "ep_size", "rank"], as_index=False)["flops"].sum()
    return load.assign(load=load["flops"] / load.groupby(["strategy", "ep_size"])["flops"].transform("mean"))


def model_of(source):
    """The model a routing trace comes from: the run name without its seed ("shakespeare-mohge-s2")."""
    return source.astype(str).str.replace(r"-s\d+$", "", regex=True)


def max_over_mean(summary, kind: str, source: str):
    """max/mean per (strategy, ep_size) of one kind of summary row (layer "all" when recorded, else mean over
    layers): mean, 95% CI half-width and n over the traces of the source's model (every seed traced); empty when
    that model has no rows of this kind (traces of other models are never pooled in)."""
    if summary.empty or "kind" not in summary or not (summary["kind"] == kind).any():
        return summary.iloc[0:0].assign(max_over_mean_mean=[], max_over_mean_ci95=[], n=[])
    m = summary[summary["kind"] == kind].assign(layer=lambda d: ps.as_level(d["layer"]))
    model = model_of(m["source"])
    m = m[model == re.sub(r"-s\d+$", "", source)]
    if m.empty:
        return summary.iloc[0:0].assign(max_over_mean_mean=[], max_over_mean_ci95=[], n=[])
    m = m[m["layer"] == "all"] if (m["layer"] == "all").any() else m
    per = m.groupby(["strategy", "ep_size", "source"], as_index=False)["max_over_mean"].mean()
    return ps.summarise(per, ["strategy", "ep_size"], ["max_over_mean"])


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the per-GPU load of each placement strategy (F4)."""
    ranks = ps.read_csv(inputs.get("ranks"))
    if ranks.empty:
        ps.placeholder_figure(outputs, "Per-GPU load", "no placement study recorded yet")
        return
    source = params.get("source")
    if source not in set(ranks["source"]):  # no source asked for, or one whose trace is not collected (yet)
        source = sorted(ranks["source"].unique())[0]
    load = rank_loads(ranks[ranks["source"] == source])
    summary = ps.read_csv(inputs.get("summary"))
    analytic, meas = (max_over_mean(summary, kind, source) for kind in ("analytic", "measured"))
    if analytic.empty:
        analytic = load.groupby(["strategy", "ep_size"], as_index=False)["load"].max()
        analytic = analytic.rename(columns={"load": "max_over_mean_mean"}).assign(max_over_mean_ci95=float("nan"), n=1)
    strategies = ps.ordered(load["strategy"], ps.STRATEGIES)
    eps = sorted(load["ep_size"].unique())
    fig, axes = ps.panels(len(eps) + 1, ncols=2 if len(eps) == 3 else 3, height=2.3)
    pad = 0.05 * (load["load"].max() - load["load"].min())
    for ax, ep in zip(axes, eps, strict=False):
        for s in strategies:
            d = load[(load["strategy"] == s) & (load["ep_size"] == ep)].sort_values("rank")
            ax.plot(
                d["rank"],
                d["load"],
                marker="o",
                ms=3,
                lw=1,
                color=ps.STRATEGY_COLORS.get(s, ps.OTHER_COLOR),
                label=ps.strategy_label(s),
                zorder=3 if s == "all_size" else 2,  # the method on top
            )
        ax.axhline(1, color="#444444", lw=0.8, ls=":")
        ax.set_ylim(load["load"].min() - pad, load["load"].max() + pad)  # one scale for every EP size
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"EP = {ep} GPUs")
        ax.set_xlabel("expert-parallel rank")
        ax.set_ylabel("FLOPs (all layers)\n/ mean over ranks")
    ax = axes[-1]
    for s in strategies:
        color = ps.STRATEGY_COLORS.get(s, ps.OTHER_COLOR)
        a = analytic[analytic["strategy"] == s].sort_values("ep_size")
        ax.errorbar(
            a["ep_size"],
            a["max_over_mean_mean"],
            yerr=a["max_over_mean_ci95"].fillna(0),
            marker="o",
            ms=4,
            color=color,
            capsize=2,
        )
        if not meas.empty:
            m = meas[meas["strategy"] == s].sort_values("ep_size")
            ax.errorbar(
                m["ep_size"],
                m["max_over_mean_mean"],
                yerr=m["max_over_mean_ci95"].fillna(0),
                marker="s",
                mfc="white",
                ls="--",
                lw=0.9,
                color=color,
                capsize=2,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps, [str(e) for e in eps])
    ax.axhline(1, color="#444444", lw=0.8, ls=":")
    n = int(analytic["n"].max())
    ax.set_title(f"imbalance vs EP size\n(n = {n} trace{'s' if n > 1 else ''}{', 95% CI' if n > 1 else ''})")
    ax.set_xlabel("EP size (GPUs)")
    ax.set_ylabel("max / mean rank FLOPs")
    if not meas.empty:
        ax.plot([], [], color="k", marker="s", mfc="white", ls="--", lw=0.9, label="measured")
        ax.plot([], [], color="k", marker="o", label="analytic")
        ax.legend(loc="best")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(strategies))
    fig.suptitle(
        f"Per-GPU load by placement strategy (1 = perfect balance)\nper-rank panels: routing trace {source} (n = 1)"
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
