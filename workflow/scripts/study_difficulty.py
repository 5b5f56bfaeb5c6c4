"""F11: difficulty routing under the Group-Wise loss: mean routed expert width per difficulty level (easy /
medium / hard) for each alpha_G variant, mean and 95% CI over seeds; and the activated-parameter saving against
the perplexity cost, both relative to the weakest alpha_G.

Inputs: s4 (S4_difficulty.csv of mohge.analysis.study). Outputs: png, pdf.
Params: alpha_g (model -> alpha_G; default mohge+ag1e5 1e-5, mohge+ag1e4 1e-4, mohge+ag1e3 1e-3),
dataset (default "graded", else the first in S4). Without any alpha_G variant in S4, the left panel shows every
model of S4 and the right panel says that there is no sweep. The cost's error bar is the CI of the variant's
test perplexity over its seeds scaled by the baseline's mean (not a paired interval).
"""

import sys
from pathlib import Path

_smk = globals().get("snakemake")  # set by Snakemake's script: directive
# Snakemake runs a copy of this file (after its preamble: hence no __future__ import here);
# snakemake.scriptdir is the directory of the original, where plotstyle.py lives.
sys.path.insert(0, str(getattr(_smk, "scriptdir", None) or Path(__file__).resolve().parent))
import plotstyle as ps  # noqa: E402

ALPHA_G = {"mohge+ag1e5": 1e-5, "mohge+ag1e4": 1e-4, "mohge+ag1e3": 1e-3}


def width_panel(ax, d, names: dict) -> None:
    """Mean routed width per level, one line of points per model, CIs where n >= 2."""
    levels = [lv for lv in ps.LEVELS if lv in d]
    step = 0.7 / max(len(d), 1)
    for i, (_, r) in enumerate(d.iterrows()):
        x = [k + (i + 0.5) * step - 0.35 for k in range(len(levels))]
        y = [r[lv] for lv in levels]
        lo = [r.get(f"{lv}_low", float("nan")) for lv in levels]
        hi = [r.get(f"{lv}_high", float("nan")) for lv in levels]
        err = ps.ci_err(ps.pd.Series(y), ps.pd.Series(lo), ps.pd.Series(hi))
        shade = 0.25 + 0.75 * (i + 1) / len(d)  # darker for a stronger alpha_G
        color = ps.plt.cm.Oranges(shade) if r["model"] in names else ps.family_style(r["model"])["color"]
        ax.errorbar(
            x,
            y,
            yerr=err,
            fmt="o-",
            color=color,
            capsize=2,
            ms=4,
            lw=0.9,
            label=ps.with_n(names.get(r["model"], ps.family_label(r["model"])), r["n"]),
        )
    ax.set_xticks(range(len(levels)), levels)
    ax.grid(False, axis="x")
    ax.set_xlabel("difficulty level")
    ax.set_ylabel("mean routed expert width\n(hidden units per routed slot)")
    ax.legend(loc="best", fontsize=6.5)
    ax.set_title("routed width per level")


def cost_panel(ax, d) -> None:
    """Activated-parameter saving (%) against perplexity cost (%), relative to the weakest alpha_G."""
    base = d.iloc[0]
    for i, (_, r) in enumerate(d.iterrows()):
        saving = (1 - r["activated_params"] / base["activated_params"]) * 100
        cost = (r["test_ppl"] / base["test_ppl"] - 1) * 100
        lo = (r["test_ppl_low"] / base["test_ppl"] - 1) * 100
        hi = (r["test_ppl_high"] / base["test_ppl"] - 1) * 100
        err = ps.ci_err(ps.pd.Series([cost]), ps.pd.Series([lo]), ps.pd.Series([hi]))
        ax.errorbar(
            saving, cost, yerr=err, fmt="o", color=ps.plt.cm.Oranges(0.25 + 0.75 * (i + 1) / len(d)), capsize=2, ms=5
        )
        ax.annotate(
            f"α_G={r['alpha']:g} (n={int(r['n'])})",
            (saving, cost),
            xytext=(5, 4),
            textcoords="offset points",
            fontsize=7,
        )
    ax.axhline(0, color="#444444", lw=0.8, ls=":")
    ax.axvline(0, color="#444444", lw=0.8, ls=":")
    ax.set_xlabel(f"activated-parameter saving vs α_G={base['alpha']:g} (%)")
    ax.set_ylabel(f"test perplexity cost vs α_G={base['alpha']:g} (%)")
    ax.set_title("saving vs cost (error bar: unpaired 95% CI)")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the routed width per difficulty level and the saving-vs-cost trade-off (F11)."""
    alpha_g = params.get("alpha_g") or ALPHA_G
    s4, ds = ps.study_rows(ps.read_csv(inputs.get("s4")), params.get("dataset", "graded"))
    if s4.empty or not any(lv in s4 for lv in ps.LEVELS):
        ps.placeholder_figure(outputs, "F11: routed width by difficulty", "no difficulty rows in S4 yet")
        return
    sweep = s4[s4["model"].isin(list(alpha_g))]
    sweep = sweep.assign(alpha=sweep["model"].map(alpha_g)).sort_values("alpha")
    fig, (left, right) = ps.panels(2, ncols=2, height=2.9)
    if sweep.empty:
        width_panel(left, s4.sort_values("model"), {})
        ps.placeholder(right, "no α_G sweep in S4\n(models " + ", ".join(map(str, alpha_g)) + ")")
    else:
        width_panel(left, sweep, {m: f"α_G={a:g}" for m, a in zip(sweep["model"], sweep["alpha"], strict=True)})
        cost_panel(right, sweep)
    fig.suptitle(f"{ds}: Group-Wise loss and difficulty; means over n seeds, error bars: 95% CI (n ≥ 2)", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, _smk)
