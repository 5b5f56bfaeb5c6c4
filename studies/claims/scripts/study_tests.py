"""F8: the study's paired comparisons as a forest plot: the perplexity ratio A/B (geometric mean over paired
seeds) for every S2_tests row of one metric with the interval its test reads drawn thick (90% CI for TOST,
non-inferiority and one-sided tests at alpha 0.05; 95% CI for two-sided tests) and the other one thin, the
±margin equivalence band shaded, each row's test, n, p-value and decision written beside it.

F12, the same plot of S8_controls (mohge_studies.claims.controls): the paired tests of the control arms declared after
the results, labelled by arm, without the equivalence band (none of them is an equivalence test); the
selection and rule rows of S8 (best lr, Q1b restated) have no ratio and are not drawn; an arm not run yet is
listed as "declared, not run".

Inputs: s2 (S2_tests.csv of mohge_studies.claims.analysis) for F8, or s8 (S8_controls.csv) for F12. Outputs: png, pdf.
Params: metric (the pre-declared primary metric), margin (the TOST margin; also F12's axis span around 1): the
study's analysis section (studies/claims/rules.smk passes them).
A row with n < 2 paired seeds has no interval and no test: it is listed as such.
"""

import mohge_studies.analysis.plotstyle as ps

TESTS = {"tost": "TOST", "noninferiority": "non-inferiority", "less": "one-sided", "two-sided": "two-sided"}
READS_90 = {"tost", "noninferiority", "less"}  # tests at alpha whose decision is read from the 1 - 2 alpha interval


def p_text(p: float) -> str:
    return "—" if p != p else ("p < 0.001" if p < 0.001 else f"p = {p:.3f}")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the paired comparisons (F8)."""
    metric, margin = params["metric"], float(params["margin"])
    controls = "s8" in inputs
    s2 = ps.read_csv(inputs.get("s8" if controls else "s2"))
    if not s2.empty and "metric" in s2:
        s2 = s2[s2["metric"] == metric].reset_index(drop=True)
    if controls and not s2.empty:  # the paired tests only: selections and the restated rule carry no ratio
        s2 = s2[s2["test"].isin(["two-sided", "less"])].reset_index(drop=True)
        s2["tag"] = s2["arm"].str.split(" ", n=1).str[0]  # (a), (b'), ...
    name = "F12: the control arms' paired tests" if controls else "F8: paired comparisons"
    if s2.empty:
        ps.placeholder_figure(outputs, name, f"no paired tests on {metric} in {'S8' if controls else 'S2'} yet")
        return
    # the forest on the left, each row's test in a text column on the right (outside the layout's reach)
    fig, (ax, tx) = ps.plt.subplots(
        1, 2, figsize=(ps.WIDTH_2COL * 1.3, 0.42 * len(s2) + 1.5), sharey=True, width_ratios=[1.0, 1.0]
    )
    y = list(range(len(s2)))[::-1]  # the first test on top
    lo_band, hi_band = (
        1 / (1 + margin),
        1 + margin,
    )  # |mean log ratio| < log(1+m) (study.compare)
    if not controls:
        ax.axvspan(lo_band, hi_band, color="#009E73", alpha=0.15, lw=0)
    ax.axvline(1, color="#444444", lw=0.8, ls=":")
    has90 = "ci90_low" in s2
    for yi, r in zip(y, s2.itertuples(index=False), strict=True):
        color = ps.family_style(r.A)["color"]
        if r.ratio != r.ratio:
            continue
        wide = (r.ci_low, r.ci_high)
        narrow = (r.ci90_low, r.ci90_high) if has90 else wide
        thick, thin = (narrow, wide) if r.test in READS_90 else (wide, narrow)
        ax.plot(thin, [yi, yi], color=color, lw=0.9, solid_capstyle="butt")
        ax.plot(thick, [yi, yi], color=color, lw=3.2, solid_capstyle="butt", alpha=0.85)
        ax.plot([r.ratio], [yi], "o", color="white", mec=color, mew=1.2, ms=5, zorder=3)
    finite = s2[["ci_low", "ci_high", "ratio"]].stack().dropna()  # the 95% CI holds the 90% one
    if controls:  # no band: the axis holds 1 and the intervals (a ±5 % window when none has run)
        lo_band, hi_band = (1.0, 1.0) if len(finite) else (0.95, 1.05)
    lo = min([lo_band, *finite]) if len(finite) else lo_band
    hi = max([hi_band, *finite]) if len(finite) else hi_band
    pad = 0.15 * (hi - lo)
    ax.set_xlim(lo - pad, hi + pad)
    for yi, r in zip(y, s2.itertuples(index=False), strict=True):
        reads = "90% CI" if r.test in READS_90 else "95% CI"
        not_run = controls and r.status == "declared, not run"
        right = f"{TESTS.get(r.test, r.test)} ({reads}), n={int(r.n)}, {p_text(r.p)}:\n{r.decision}"
        if not_run:
            right = f"{TESTS.get(r.test, r.test)}: declared, not run"
        tx.annotate(right, (0.0, yi), xycoords=("axes fraction", "data"), va="center", fontsize=7)
        if r.ratio != r.ratio:
            gap = "not run" if not_run else "no interval (n < 2)"
            ax.annotate(gap, (1, yi), va="center", ha="center", fontsize=7, color="#777777")
    tx.set_axis_off()
    tx.set_title("test (interval it reads), n pairs, p: decision", fontsize=7.5, loc="left")
    if controls:  # the arm's tag, then A / B (a row whose models a selection picks: its question)
        labels = [
            f"{r.tag} {ps.study_label(r.A)} / {ps.study_label(r.B)}"
            if isinstance(r.A, str) and isinstance(r.B, str)
            else f"{r.tag} {r.question}"
            for r in s2.itertuples()
        ]
    else:
        labels = [f"{r.question}: {ps.study_label(r.A)} / {ps.study_label(r.B)}" for r in s2.itertuples()]
    ax.set_yticks(y, labels)
    ax.set_ylim(-0.7, len(s2) - 0.3)
    ax.grid(False, axis="y")
    split = {"val_ppl": "val", "test_ppl": "test"}.get(metric, metric)
    ax.set_xlabel(f"perplexity ratio A / B, full {split} split\n(paired by seed; < 1: A better)")
    if not controls:
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
    n = int(n) if n == n else 0
    what = "Control arms (declared after the results)" if controls else "Paired comparisons"
    fig.suptitle(
        f"{what}: perplexity ratio over n paired seeds (n per row, up to {n})\n"
        "thick bar: the interval the row's test reads (90% CI for TOST, non-inferiority, one-sided; 95% CI for "
        "two-sided), thin bar: the other one",
        fontsize=8.5,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
