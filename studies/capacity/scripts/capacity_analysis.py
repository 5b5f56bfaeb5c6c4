"""Snakemake glue: the capacity study's declared analysis (mohge_studies.capacity.analysis) into its tables and figure.

Inputs: runs (results/capacity/runs.csv), traces (the runs' trace.json; optional), logs (the runs'
train_log.jsonl; optional: C3's steps with an unused expert). Params: settings (the study
config's analysis section; mohge_studies.capacity.analysis.DEFAULTS lists every key). Outputs: C1_models, C2_tests,
C3_unused, C4_selection, C5_best_shot, C6_decomposition as csv/md/tex/html; the figure (png, pdf) of bits stored
against total non-embedding parameters: the sweep with its fit, the MoHGE arms, the equal-parameter and the
reference MoE, and the best shot's confirmatory arms beside them, 95 % CIs, n.

    python studies/capacity/scripts/capacity_analysis.py --in runs=results/capacity/runs.csv \
        --out C2_tests_csv=results/capacity/study/C2_tests.csv ... --param reference='"moe"' ...
"""

import math
from collections.abc import Sequence
from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd
from mohge_studies.capacity import analysis as capacity

from mohge.core import stats

BY = "capacity_analysis.py"


def _paths(value) -> list[Path]:
    """An input of the rule (one path, a list of them or none) as a list of paths."""
    value = value or []
    return [Path(value)] if isinstance(value, str) else [Path(v) for v in value]


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if v != v else f"{v:.{digits}f}"


def _fmt_p(v: float) -> str:
    """A p-value: 3 decimals, or 2 significant digits below 0.001 (never a bare 0.000)."""
    return "—" if v != v else (f"{v:.3f}" if v >= 1e-3 else f"{v:.2g}")


def _kbits(b: float, lo: float, hi: float, seeds: str = "") -> str:
    """Mean [95 % CI] in kbit; where no interval is printed (fewer than 2 degrees of freedom), each seed's B."""
    if lo == lo:
        return f"{b / 1e3:.1f} [{lo / 1e3:.1f}, {hi / 1e3:.1f}] k"
    return f"{b / 1e3:.1f} k (seeds: {seeds})" if "," in seeds else f"{b / 1e3:.1f} k"


def _tests_display(tests: pd.DataFrame) -> pd.DataFrame:
    display = tests.copy()
    for col in {"estimate", "ci_low", "ci_high"} & set(display):
        display[col] = display[col].map(_fmt)
    if "p" in display:
        display["p"] = display["p"].map(_fmt_p)
    for col in ("n_a", "n_b"):
        display[col] = display[col].map(lambda v: "—" if pd.isna(v) else str(v))
    return display.fillna("")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """The capacity study's tables and figure."""
    traces, logs = _paths(inputs.get("traces")), _paths(inputs.get("logs"))
    res = capacity.analyse(pd.read_csv(inputs["runs"]), traces, params, logs)
    models, tests, unused = res["models"], res["tests"], res["unused"]
    shown = models.assign(
        params_non_embedding=models["params_non_embedding"].map(ps.fmt_params),
        bits_stored=[_kbits(*r) for r in models[["bits_stored", "bits_low", "bits_high", "bits_per_seed"]].values],
    )[["dataset", "model", "n", "params_non_embedding", "bits_stored", "bits_per_param", "fraction_of_data", "recall"]]
    caption = "Bits stored per model (mean [95% t-CI] over n seeds; each seed's value where the interval would have"
    caption += " fewer than 2 degrees of freedom); parameters without the embeddings."
    ps.write_table(models, shown.round(3), outputs, "c1", caption, left=2, by=BY)
    display = _tests_display(tests)
    note = "The gate passes: the study decides claim 1." if res["gate"] else "The gate fails: claim 1 is not decided."
    caption = "Pre-declared tests, unpaired (Welch) on log B: seeds do not pair (docs/study.md); p is the p of h0."
    ps.write_table(tests, display, outputs, "c2", caption, notes=[note], by=BY)
    caption = f"Experts per MoE layer with under {res['settings']['unused_share']:.0%} of a uniform share of routed"
    caption += " slots in the trained model's routing (mean over n seeds) and the expert parameters they hold;"
    caption += " over training, the logged steps at which the layer had any unused expert (mean over seeds), of"
    caption += " logged_steps, and the last such step in any seed (—: the logs do not count unused experts, or,"
    caption += " for the last step, no step had one)."
    shown = unused.round(2).astype({"n": str, "unused": str, "unused_params": str})
    for col in capacity.IDLE_COLUMNS:
        shown[col] = unused[col].map(lambda v: "—" if v != v else f"{v:.2f}".rstrip("0").rstrip("."))
    ps.write_table(unused, shown, outputs, "c3", caption, left=2, by=BY)
    sel = res["selection"]
    shown = sel.assign(bits_stored=sel["bits_stored"].map(lambda b: f"{b / 1e3:.1f} k"), kept=sel["kept"].map(
        {True: "kept", False: ""}))  # fmt: skip
    caption = "The selection on seed 100 (in no test): each family keeps its largest B; ties within 0.1 % go to the"
    caption += " lower lr, then to the release's gate (docs/study.md)."
    ps.write_table(sel, shown, outputs, "c4", caption, left=3, by=BY)
    best = res["best_shot"]
    caption = "The best shot's tests on the arms the selection instantiated, unpaired (Welch) on log B; p is the p"
    caption += " of h0, the null the verdict rejects; descriptive rows carry no test; no interval below 2 degrees of"
    caption += " freedom (per_seed: each seed's ratio, unpaired) (docs/study.md)."
    ps.write_table(best, _tests_display(best), outputs, "c5", caption, by=BY)
    dec = res["decomposition"]
    caption = "MoHGE / MoE-15 taken apart: router x width x parameter factor (ratios of geometric means of B, so they"
    caption += " multiply to the deficit), unpaired Welch 95% intervals, descriptive (C5 holds the tests)."
    ps.write_table(dec, _tests_display(dec), outputs, "c6", caption, left=2, by=BY)
    rows = best.set_index("test") if "test" in best else pd.DataFrame()
    wanted = (("G1 reference > equal", "b"), ("G1 reference > equal", "a"), ("Claim 1 non-inferiority", "a"))
    arms = [rows.loc[test, side] for test, side in wanted if test in rows.index]  # none before a selection
    main_models = models[models["dataset"] == res["settings"]["dataset"]]
    transfer = [rows.loc["G1 at d_model 64", side] for side in "ba" if "G1 at d_model 64" in rows.index]
    transfer += [rows.loc["Claim 1 at d_model 64", "a"]] if "Claim 1 at d_model 64" in rows.index else []
    figure(res["main"], main_models, res["fit"], res["settings"], outputs, arms, res["runs"], transfer)


def _arm_mean(ax, arm: pd.DataFrame, model: str, label: str, shift: float, **marker) -> None:
    """One arm's mean B and 95 % t-CI over its runs at its mean parameter count (times ``shift``), black-edged; each
    run's B as a dot instead of an interval on fewer than 2 degrees of freedom."""
    if not len(arm):
        return
    est = stats.one_sample(arm["bits_stored"].to_numpy())
    b, (lo, hi) = est.estimate, est.interval() if est.informative else (math.nan, math.nan)
    x = arm["total_params_non_embedding"].mean() * shift
    if lo != lo and len(arm) > 1:  # no interval below 2 degrees of freedom: each seed's point
        ax.scatter([x] * len(arm), arm["bits_stored"], s=10, color="black", zorder=5)
    ax.errorbar(
        x,
        b,
        yerr=[[b - max(lo, 0.0)], [hi - b]] if lo == lo else None,
        color=ps.family_style(model.split("+")[0]).get("color"),
        mec="black",
        capsize=3,
        label=label,
        zorder=4,
        **marker,
    )


def figure(
    runs: pd.DataFrame,
    models: pd.DataFrame,
    fit: dict,
    p: dict,
    outputs: dict,
    best: Sequence[str] = (),
    every_run: pd.DataFrame | None = None,
    transfer: Sequence[str] = (),
) -> None:
    """B against P: every sweep run and the fit; each marked model's mean and 95 % CI from C1 (``models``); beside
    them (black-edged, a little to the right) the best shot's confirmatory arms ``best`` (C5), mean and 95 % t-CI
    over their runs; and the transfer arm's models ``transfer`` (d_model 64, on their own fact set: stars, with
    that set's bits), from ``every_run``."""
    import matplotlib.pyplot as plt

    png = next((v for k, v in outputs.items() if k.endswith("png")), None)
    pdf = next((v for k, v in outputs.items() if k.endswith("pdf")), None)
    if png is None and pdf is None:
        return
    fig, ax = plt.subplots(figsize=(7.6, 3.6))
    sweep = runs[runs["family"].isin(p["sweep"])]
    if len(sweep):
        ax.scatter(
            sweep["total_params_non_embedding"],
            sweep["bits_stored"],
            s=14,
            color="#888888",
            label=f"MoE sweep runs (n = {len(sweep)})",
            zorder=2,
        )
    if math.isfinite(fit["slope"]):
        # a straight line on log-log axes, drawn from its two ends: intermediate points are collinear only up to
        # rounding, and how the renderer simplifies and joins them then differs with the host's exp and log (pixels
        # along the line differ between AVX2 and AVX-512 hosts)
        xs = [
            math.log(sweep["total_params_non_embedding"].min()) - 0.1,
            math.log(sweep["total_params_non_embedding"].max()) + 0.1,
        ]
        ax.plot(
            [math.exp(x) for x in xs],
            [math.exp(fit["intercept"] + fit["slope"] * x) for x in xs],
            color="#888888",
            lw=1,
            ls="--",
            label=f"fit: slope {fit['slope']:.2f}",
        )
    marks = [(p["equal"], "moe_equal"), (p["reference"], "moe")] + [(m, "mohge") for m in p["mohge"]]
    for i, (model, fam) in enumerate(marks):
        row = models[models["model"] == model]
        if not len(row):
            continue
        b, lo, hi, x, n = row[["bits_stored", "bits_low", "bits_high", "params_non_embedding", "n"]].iloc[0]
        err = [[b - lo], [hi - b]] if lo == lo else None
        style = ps.family_style(fam)
        ax.errorbar(
            x,
            b,
            yerr=err,
            fmt=style.get("marker", "o"),
            color=style.get("color"),
            capsize=3,
            mfc="white" if i == 3 else None,
            label=f"{model} (n = {int(n)})",
            zorder=3,
        )
    for model in best:
        arm = runs[runs["family"] == model]
        marker = ps.family_style(model.split("+")[0]).get("marker", "o")
        _arm_mean(ax, arm, model, f"{model} (n = {len(arm)})", shift=1.04, fmt=marker)
    if len(runs):
        ax.axhline(runs["data_bits"].iloc[0], color="black", lw=0.8, ls=":", label="the data's bits")
    other = every_run if every_run is not None else runs.iloc[0:0]
    shown = other[other["family"].isin(transfer)]
    if len(shown):
        ax.axhline(shown["data_bits"].iloc[0], color="#888888", lw=0.8, ls=":", label="the d_model 64 set's bits")
    for model in transfer:
        arm = other[other["family"] == model]
        _arm_mean(ax, arm, model, f"{model} (d_model 64, n = {len(arm)})", shift=1.0, fmt="*", ms=11)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("total non-embedding parameters")
    ax.set_ylabel("bits stored B")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # off the data
    if not len(runs):
        ps.placeholder(ax, "no capacity runs yet")
    fig.tight_layout()
    ps.save(fig, png, pdf)


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
