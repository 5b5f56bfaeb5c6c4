"""F9: per-GPU balance in the claims study: max/mean expert-FLOP load per placement strategy at each EP size,
mean and 95% CI over the seeds' routing traces, MoHGE (filled) against the homogeneous MoE reference (open).

Inputs: s3 (S3_balance.csv of mohge_studies.claims.analysis). Outputs: png, pdf. Params (studies/claims/rules.smk passes
them from the study's config): dataset (else the first in S3), models (MoHGE and the reference), ep_sizes
(utilization.ep_sizes). One panel per trace kind when S3 has a ``trace`` column (trained | even_within_groups), else one
panel. Models or strategies absent from S3 are skipped. bar and decision_ep (analysis.balance_bar, balance_ep): Q2's
pre-declared bar, drawn as a line and its EP marked. Markers: geometric mean over seeds; error bars: its 95% interval on
the log scale, truncated at 1 (mohge_studies.claims.analysis).
"""

import mohge_studies.analysis.plotstyle as ps

TRACES = {
    "trained": "routing of the trained models",
    "even_within_groups": "synthetic: each group's load\nspread evenly over its experts",
}


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot max/mean per-rank FLOPs per strategy and EP size (F9)."""
    s3, ds = ps.study_rows(ps.read_csv(inputs.get("s3")), params["dataset"])
    models = list(params["models"])
    bar, decision_ep = float(params["bar"]), int(params["decision_ep"])
    if not s3.empty:
        s3 = s3[s3["model"].isin(models)]
        eps = list(params["ep_sizes"])
        s3 = s3[s3["ep_size"].isin(eps)]
    if s3.empty:
        ps.placeholder_figure(outputs, "F9: per-GPU balance", f"no balance rows for {models} in S3 yet")
        return
    if "trace" not in s3:
        s3 = s3.assign(trace="trained")
    traces = ps.ordered(s3["trace"], TRACES)
    strategies = ps.ordered(s3["strategy"], ps.STRATEGIES)
    fig, axes = ps.panels(len(traces), ncols=2, height=3.2, width=ps.WIDTH_2COL * 1.3 if len(traces) > 1 else 6.4)
    step = 0.8 / (len(strategies) * len(models))
    for ax, trace in zip(axes, traces, strict=True):
        d = s3[s3["trace"] == trace]
        for i, s in enumerate(strategies):
            for j, model in enumerate(models):
                r = d[(d["strategy"] == s) & (d["model"] == model)].sort_values("ep_size")
                if r.empty:
                    continue
                x = [eps.index(e) + (i * len(models) + j + 0.5) * step - 0.4 for e in r["ep_size"]]
                color = ps.STRATEGY_COLORS.get(s, ps.OTHER_COLOR)
                ax.errorbar(
                    x,
                    r["max_over_mean"],
                    yerr=ps.ci_err(r["max_over_mean"], r["ci_low"], r["ci_high"]),
                    fmt=ps.FAMILY_MARKERS.get(model.partition("+")[0], "o"),
                    color=color,
                    mfc=color if j == 0 else "white",
                    ms=5,
                    capsize=2,
                    lw=1,
                    label=ps.with_n(f"{ps.family_label(model)}: {ps.strategy_label(s)}", r["n"].min()),
                )
        ax.axhline(1, color="#444444", lw=0.8, ls=":")
        if decision_ep in eps:
            ax.axvspan(eps.index(decision_ep) - 0.45, eps.index(decision_ep) + 0.45, color="#000000", alpha=0.05, lw=0)
        ax.axhline(bar, color="#222222", lw=0.9, ls="--", label=f"Q2 bar {bar:g} (read at EP {decision_ep})")
        ax.set_xticks(range(len(eps)), [str(e) for e in eps])
        ax.grid(False, axis="x")
        ax.set_xlabel("expert-parallel size (GPUs)")
        ax.set_ylabel("max / mean rank expert FLOPs\n(1 = perfect balance)")
        ax.set_title(TRACES.get(trace, str(trace).replace("_", " ")), fontsize=8.5)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=6.5)
    fig.suptitle(
        f"{ds}: per-GPU load by placement (filled: {ps.family_label(models[0])}, open: reference)\n"
        "geometric mean over the n seeds' routing traces (n in legend); error bars: 95% CI on the log scale,\n"
        f"truncated at 1 (n ≥ 2); shaded: EP {decision_ep}, where Q2 is decided (experts per rank a multiple of G)",
        fontsize=8.5,
    )
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
