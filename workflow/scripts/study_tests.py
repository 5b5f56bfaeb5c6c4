"""F8: the study's paired comparisons as a forest plot: the perplexity ratio A/B (geometric mean over paired
seeds) and its 95% CI for every S2_tests row of one metric, the ±margin equivalence band shaded, each row's
test, n, p-value and decision written beside it.

Inputs: s2 (S2_tests.csv of mohge.analysis.study). Outputs: png, pdf.
Params: metric (default "test_ppl", the pre-declared primary metric), margin (default 0.03: the TOST margin).
A row with n < 2 paired seeds has no interval and no test: it is listed as such.
"""

import sys
from pathlib import Path

_smk = globals().get("snakemake")  # set by Snakemake's script: directive
# Snakemake runs a copy of this file (after its preamble: hence no __future__ import here);
# snakemake.scriptdir is the directory of the original, where plotstyle.py lives.
sys.path.insert(0, str(getattr(_smk, "scriptdir", None) or Path(__file__).resolve().parent))
import plotstyle as ps  # noqa: E402

TESTS = {"tost": "TOST", "less": "one-sided", "two-sided": "two-sided"}


def p_text(p: float) -> str:
    return "—" if p != p else ("p < 0.001" if p < 0.001 else f"p = {p:.3f}")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the paired comparisons (F8)."""
    metric, margin = params.get("metric", "test_ppl"), float(params.get("margin", 0.03))
    s2 = ps.read_csv(inputs.get("s2"))
    if not s2.empty and "metric" in s2:
        s2 = s2[s2["metric"] == metric].reset_index(drop=True)
    if s2.empty:
        ps.placeholder_figure(outputs, "F8: paired comparisons", f"no paired tests on {metric} in S2 yet")
        return
    fig, ax = ps.plt.subplots(figsize=(ps.WIDTH_2COL, 0.45 * len(s2) + 1.3))
    y = list(range(len(s2)))[::-1]  # the first test on top
    lo_band, hi_band = 1 / (1 + margin), 1 + margin  # |mean log ratio| < log(1+m) (mohge.analysis.study.compare)
    ax.axvspan(lo_band, hi_band, color="#009E73", alpha=0.15, lw=0)
    ax.axvline(1, color="#444444", lw=0.8, ls=":")
    for yi, r in zip(y, s2.itertuples(index=False), strict=True):
        color = ps.family_style(r.A)["color"]
        if r.ratio == r.ratio:
            ax.errorbar(
                r.ratio,
                yi,
                xerr=[[max(r.ratio - r.ci_low, 0)], [max(r.ci_high - r.ratio, 0)]],
                fmt="o",
                color=color,
                capsize=3,
                ms=5,
            )
    finite = s2[["ci_low", "ci_high", "ratio"]].stack().dropna()
    lo = min([lo_band, *finite]) if len(finite) else lo_band
    hi = max([hi_band, *finite]) if len(finite) else hi_band
    pad = 0.15 * (hi - lo)
    ax.set_xlim(lo - pad, hi + pad)
    for yi, r in zip(y, s2.itertuples(index=False), strict=True):
        right = f"{TESTS.get(r.test, r.test)}, n={int(r.n)}, {p_text(r.p)}: {r.decision}"
        ax.annotate(right, (1.01, yi), xycoords=("axes fraction", "data"), va="center", fontsize=7)
        if r.ratio != r.ratio:
            ax.annotate("no interval (n < 2)", (1, yi), va="center", ha="center", fontsize=7, color="#777777")
    labels = [f"{r.question}: {ps.family_label(r.A)} / {ps.family_label(r.B)}" for r in s2.itertuples()]
    ax.set_yticks(y, labels)
    ax.set_ylim(-0.7, len(s2) - 0.3)
    ax.grid(False, axis="y")
    split = {"val_ppl": "val", "test_ppl": "test"}.get(metric, metric)
    ax.set_xlabel(f"perplexity ratio A / B on the full {split} split (paired by seed; < 1: A better)")
    ax.annotate(
        f"equivalence\nband ±{margin:.0%}",
        (1, 1.0),
        xycoords=("data", "axes fraction"),
        ha="center",
        va="bottom",
        fontsize=7,
        color="#006B4F",
    )
    n = s2["n"].max()
    fig.suptitle(
        f"Paired comparisons: perplexity ratio and 95% CI over n paired seeds (n per row, up to {int(n)})",
        fontsize=8.5,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, _smk)
