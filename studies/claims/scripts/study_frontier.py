"""F10: the Intra-Group loss frontier: test perplexity against per-GPU imbalance (all-size placement, max/mean
expert FLOPs at one EP size), one point per alpha_E with 95% CIs on both axes; contiguous placement of the same
models as a second series.

Inputs: s1 (S1_models.csv), s3 (S3_balance.csv) of mohge_studies.claims.analysis. Outputs: png, pdf. Params: alpha_e
(model -> alpha_E; default mohge 5e-3, mohge+ae5e2 5e-2, mohge+ae2e1 2e-1); from the study's config
(studies/claims/rules.smk passes them): ep (analysis.balance_ep, the EP where Q2 is decided), bar (analysis.balance_bar,
Q2's bar, drawn), dataset, metric (analysis.primary_metric). Models absent from either table are skipped.
"""

import mohge_studies.analysis.plotstyle as ps

ALPHA_E = {"mohge": 5e-3, "mohge+ae5e2": 5e-2, "mohge+ae2e1": 2e-1}
SERIES = ("all_size", "contiguous")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the quality-vs-balance frontier over alpha_E (F10)."""
    alpha_e = params.get("alpha_e") or ALPHA_E
    ep, metric, bar = int(params["ep"]), params["metric"], float(params["bar"])
    s1, ds = ps.study_rows(ps.read_csv(inputs.get("s1")), params["dataset"])
    s3, _ = ps.study_rows(ps.read_csv(inputs.get("s3")), ds)
    if not s3.empty and "trace" in s3:
        s3 = s3[s3["trace"] == "trained"]
    rows = []
    if not s1.empty and not s3.empty:
        s3 = s3[(s3["ep_size"] == ep) & s3["strategy"].isin(SERIES)]
        q = s1[s1["model"].isin(list(alpha_e))][["model", "n", metric, f"{metric}_low", f"{metric}_high"]]
        m = q.merge(s3, on="model", suffixes=("", "_bal"))
        rows = m.assign(alpha=m["model"].map(alpha_e)).sort_values("alpha")
    if len(rows) == 0:
        ps.placeholder_figure(outputs, "F10: alpha_E frontier", f"no alpha_E models with EP {ep} balance yet")
        return
    fig, ax = ps.plt.subplots(figsize=(ps.WIDTH_1COL * 1.6, 3.8))
    for s in SERIES:
        r = rows[rows["strategy"] == s]
        if r.empty:
            continue
        color = ps.STRATEGY_COLORS[s]
        ax.plot(r["max_over_mean"], r[metric], color=color, lw=0.9, ls="-" if s == "all_size" else "--")
        ax.errorbar(
            r["max_over_mean"],
            r[metric],
            xerr=ps.ci_err(r["max_over_mean"], r["ci_low"], r["ci_high"]),
            yerr=ps.ci_err(r[metric], r[f"{metric}_low"], r[f"{metric}_high"]),
            fmt="o" if s == "all_size" else "s",
            color=color,
            mfc=color if s == "all_size" else "white",
            capsize=2,
            lw=0.9,
            label=f"{ps.strategy_label(s)} placement ({ps.n_text(r['n_bal']).replace('seed', 'trace')})",
        )
        for k, (_, p) in enumerate(r.sort_values("max_over_mean").iterrows()):
            # all-size points only (a contiguous point is the same model, at the same perplexity), alternately
            # above and below, on a white box: no label overprints another
            if s != "all_size":
                continue
            above = k % 2 == 0
            ax.annotate(
                f"α_E = {p['alpha']:g} (n={int(p['n'])})",
                (p["max_over_mean"], p[metric]),
                xytext=(4, 7 if above else -7),
                textcoords="offset points",
                va="bottom" if above else "top",
                fontsize=6.5,
                color=color,
                bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 0.5},
                zorder=4,
            )
    ax.axvline(1, color="#444444", lw=0.8, ls=":")
    ax.axvline(bar, color="#222222", lw=0.9, ls="--")
    ax.annotate(
        f"Q2 bar {bar:g}",
        (bar, 0.01),
        xycoords=("data", "axes fraction"),
        xytext=(2, 0),
        textcoords="offset points",
        fontsize=6.5,
    )
    split = {"val_ppl": "val", "test_ppl": "test"}.get(metric, metric)
    ax.set_xlabel(f"max / mean rank expert FLOPs at EP {ep} (1 = balanced)")
    ax.set_ylabel(f"perplexity, full {split} split")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, fontsize=7, frameon=False)
    ax.set_title(
        f"{ds}: quality vs balance over α_E at EP {ep}\nmean test perplexity and geometric-mean max/mean over n seeds;"
        "\nerror bars: 95% CI (max/mean: log scale, truncated at 1)"
        "\nopen squares: the same models, contiguous placement",
        fontsize=8,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
