"""F11: difficulty routing under the Group-Wise loss, one point per alpha_G variant (categorical x, sorted by
alpha_G): left, the tested quantity, the paired easy - hard difference of the mean routed expert width with its
95% CI (paired by seed; "easy tokens go to small groups" needs the interval below 0); middle, the mean routed
width per level (means over seeds; their between-seed intervals are not the test and are in S4); right, test
perplexity with its 95% CI, the cost side of the dose-response.

Inputs: s4 (S4_difficulty.csv of mohge_studies.claims.analysis). Outputs: png, pdf.
Params: alpha_g (model -> alpha_G; default: read from the variant tag, mohge+ag1e5 = 1e-5, mohge+ag0 = 0,
mohge+ag1rel = 1 with cost weights spanning the widths, ticked "ω∝h" and drawn apart),
dataset (default "graded", else the first in S4). Without any alpha_G variant in S4, every model of S4 is shown.
"""

import math
import re

import mohge_studies.analysis.plotstyle as ps

# mohge+ag1e5 -> 1e-5; mohge+ag0 -> 0; mohge+ag10 -> 10; mohge+ag1rel -> 1 with the cost weights spanning the widths
TAG = re.compile(r".*\+ag(\d+)(?:e(\d+))?(rel)?")


def alpha_of(model: str) -> float:
    m = TAG.fullmatch(str(model))
    if not m:
        return float("nan")
    return int(m.group(1)) * 10.0 ** -int(m.group(2) or 0)


def is_rel(model: str) -> bool:
    """An arm whose cost weights span the widths (omega proportional to width), not a step of the release's dose."""
    m = TAG.fullmatch(str(model))
    return bool(m and m.group(3))


def tick_name(model: str, alpha: float) -> str:
    """The alpha_G value alone, short (1e-5, 0.1, 10: the axis names it); a `rel` arm says its cost weights."""
    if alpha != alpha:
        return ps.study_label(model)
    exp = round(math.log10(alpha)) if alpha > 0 else 0
    short = f"1e{exp}" if 0 < alpha < 0.1 and math.isclose(alpha, 10.0**exp) else f"{alpha:g}"
    return short + ("\nω∝h" if is_rel(model) else "")


def point(ax, x, y, lo, hi, color, label=None, fmt="o") -> None:
    err = ps.ci_err(ps.pd.Series([y]), ps.pd.Series([lo]), ps.pd.Series([hi]))
    ax.errorbar([x], [y], yerr=err, fmt=fmt, color=color, capsize=3, ms=5, lw=1, label=label)


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the paired easy - hard routed width, the width per level and the perplexity per alpha_G (F11)."""
    s4, ds = ps.study_rows(ps.read_csv(inputs.get("s4")), params.get("dataset", "graded"))
    if s4.empty or not any(lv in s4 for lv in ps.LEVELS):
        ps.placeholder_figure(outputs, "F11: routed width by difficulty", "no difficulty rows in S4 yet")
        return
    given = params.get("alpha_g") or {}
    s4 = s4.assign(alpha=[given.get(m, alpha_of(m)) for m in s4["model"]])
    sweep = s4.dropna(subset=["alpha"]).sort_values(["alpha", "model"])
    d = sweep if len(sweep) else s4.sort_values("model")
    # the value alone under each point (the axis names α_G): six "α_G = ..." labels overprint at this width
    names = [tick_name(m, a) for m, a in zip(d["model"], d["alpha"], strict=True)]
    same_n = d["n"].nunique() == 1
    ticks = names if same_n else [f"{nm}\n(n={int(n)})" for nm, n in zip(names, d["n"], strict=True)]
    x = list(range(len(d)))
    rel = [is_rel(m) for m in d["model"]]
    fig, (left, mid, right) = ps.panels(3, ncols=3, height=2.9, width=ps.WIDTH_2COL * 1.15)
    color = ps.FAMILY_COLORS["mohge"]
    for xi, (_, r), other in zip(x, d.iterrows(), rel, strict=True):
        if "easy_minus_hard" in r and r["easy_minus_hard"] == r["easy_minus_hard"]:
            point(left, xi, r["easy_minus_hard"], r["emh_low"], r["emh_high"], color, fmt="D" if other else "o")
        ppl_fmt = "D" if other else "s"
        point(right, xi, r["test_ppl"], r["test_ppl_low"], r["test_ppl_high"], ps.OTHER_COLOR, fmt=ppl_fmt)
    left.axhline(0, color="#444444", lw=0.8, ls=":")
    left.set_ylabel("easy − hard mean routed width\n(hidden units; paired by seed)")
    left.set_title("the test: paired easy − hard, 95% CI\n(claim needs the interval below 0)", fontsize=8)
    dose = [xi for xi, other in zip(x, rel, strict=True) if not other]  # the release's cost weights, joined
    apart = [xi for xi, other in zip(x, rel, strict=True) if other]  # other cost weights: points, not a dose step
    for lv in ps.LEVELS:
        if lv in d:
            values = d[lv].to_numpy()
            mid.plot(dose, values[dose], "o-", color=ps.LEVEL_COLORS[lv], ms=4, lw=1, label=lv)
            mid.plot(apart, values[apart], "D", color=ps.LEVEL_COLORS[lv], ms=4)
    mid.legend(title="level", fontsize=6.5, title_fontsize=6.5, loc="lower left")
    mid.set_ylabel("mean routed expert width\n(hidden units per routed slot)")
    mid.set_title("width per level: means over seeds\n(between-seed CIs in S4, not the test)", fontsize=8)
    right.set_ylabel("test perplexity (full split)")
    right.set_title("cost: test perplexity, 95% CI", fontsize=8)
    for ax in (left, mid, right):
        ax.set_xticks(x, ticks, fontsize=6.5)
        ax.set_xlim(-0.5, len(d) - 0.5)
        if len(sweep):
            ax.set_xlabel("α_G (Group-Wise loss coefficient)", fontsize=7.5)
        ax.grid(False, axis="x")
    seeds = f"n = {int(d['n'].iloc[0])} seeds each" if same_n else "n seeds under each"
    note = "\n◆ ω∝h: the Group-Wise cost weights span the widths, not a step of the dose" if any(rel) else ""
    fig.suptitle(f"{ds}: Group-Wise loss and difficulty, one point per α_G ({seeds}){note}", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
