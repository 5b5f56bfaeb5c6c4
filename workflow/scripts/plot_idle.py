"""F15: unused experts and unused width classes over training, per dataset and model (mohge_studies.analysis.idle): per
MoE layer, the mean over the layers and then over the model's seeds at each logged step; an expert or width class
is unused with under 1% of an even share of the routed slots in that logging window.

Inputs: runs (runs.csv), logs (the runs' train_log.jsonl). Outputs: png, pdf.
"""

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import mohge_studies.analysis.plotstyle as ps
from matplotlib import ticker
from matplotlib.lines import Line2D
from mohge_studies.analysis import idle

PANELS = (  # column of mohge_studies.analysis.idle.over_training, y-axis label, why a panel can be empty
    ("unused_experts", "unused experts\nper MoE layer", "the logs do not count unused experts"),
    ("unused_groups", "unused width classes\nper MoE layer", "no model here has two width classes or more"),
)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot unused experts and width classes against training step (F15)."""
    logs = inputs.get("logs") or []
    logs = [Path(logs)] if isinstance(logs, str) else [Path(p) for p in logs]
    runs = ps.read_csv(inputs.get("runs"))
    curves = idle.over_training(idle.idle_table(logs, runs))
    curves = curves[curves[[c for c, _, _ in PANELS]].notna().any(axis=1)]
    if curves.empty:
        ps.placeholder_figure(outputs, "Unused experts over training", "these runs' logs hold no routing counts")
        return
    datasets = sorted(curves["dataset"].unique())
    models = {ds: ps.ordered(curves.loc[curves["dataset"] == ds, "model"], ps.FAMILIES) for ds in datasets}
    silent = {  # models whose logs count neither: no unused-expert count and a single width class
        ds: textwrap.wrap(", ".join(sorted(set(runs.loc[runs["dataset"] == ds, "family"]) - set(models[ds]))), 50)
        for ds in datasets
    }
    heights = [max(1.9, 0.13 * (len(models[ds]) + len(silent[ds]) + 1) + 0.5) for ds in datasets]  # the legends
    fig = plt.figure(figsize=(ps.WIDTH_2COL * 1.45, sum(heights) + 0.9))
    grid = fig.add_gridspec(len(datasets), 3, height_ratios=heights, width_ratios=[1, 1, 0.7])
    styles = ps.line_styles(curves["model"].unique())
    for i, ds in enumerate(datasets):
        d = curves[curves["dataset"] == ds]
        handles = {}
        for j, (col, label, empty) in enumerate(PANELS):
            ax = fig.add_subplot(grid[i, j])
            if j == 0:
                ax.set_title(ds, fontsize=8.5, loc="left")
            if d[col].isna().all():
                ps.placeholder(ax, empty)
                continue
            for model in models[ds]:
                m = d[(d["model"] == model) & d[col].notna()]
                if m.empty:
                    continue
                st, n = styles[model], int(m["n"].max())
                ours = model.partition("+")[0] == "mohge"  # MoHGE drawn over the others, and wider
                (line,) = ax.plot(
                    m["step"],
                    m[col],
                    color=st["color"],
                    ls=st["ls"],
                    lw=(1.8 if ours else 1.1) * (1.0 if n > 1 else 0.6),  # a single seed thinner
                    zorder=3 if ours else 2,
                )
                handles.setdefault(model, (line, f"{model} (n={n})"))
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_xlabel("training step (log scale)", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            top = max(1.0, float(d[col].max()))  # whole experts or classes: an axis of at least one
            ax.set_ylim(-0.05 * top, 1.05 * top)
            ax.tick_params(labelsize=7)
        legend = fig.add_subplot(grid[i, 2])
        legend.set_axis_off()
        shown = [handles[m] for m in models[ds] if m in handles]
        notes = ["not drawn (their logs count neither):", *silent[ds]] if silent[ds] else []
        blank = Line2D([], [], lw=0)
        shown += [(blank, note) for note in notes]  # under the entries, in grey
        leg = legend.legend(*zip(*shown, strict=True), fontsize=6, loc="upper left", frameon=False, handlelength=2.6)
        for text in leg.get_texts()[len(shown) - len(notes) :]:
            text.set_color("#444444")
    note = "per MoE layer, mean over the layers, then over the n seeds of each model; unused: under 1% of an even share"
    fig.suptitle(f"Unused experts and width classes over training\n{note}", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
