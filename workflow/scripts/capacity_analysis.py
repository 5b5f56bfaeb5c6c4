"""The capacity study's pre-declared analysis (configs/capacity.yaml; docs/study.md "The capacity study").

Inputs: runs (results/capacity/runs.csv: bits_stored, total_params_non_embedding per run), traces (the runs'
trace.json routing counts; optional). Params: reference, iso, sweep (the homogeneous MoE models of the width sweep,
as runs.csv names them), mohge (the MoHGE arms), dataset, quarter (the saturation control's dataset), alpha,
margin (non-inferiority, 0.03), gate_ratio (1.05), gate_slope (0.5), unused_share (0.01).
Outputs: C1_models, C2_tests, C3_unused as csv/md/tex; the figure (png, pdf) of bits stored against total
non-embedding parameters: the sweep with its fit, the MoHGE arms, the iso and the reference MoE, 95 % CIs, n.

Every comparison is paired by seed on log B (scipy.stats, Student t). The sweep fit is OLS of log B on
log P (P: total non-embedding parameters) over every sweep run; MoHGE's MoE-equivalent size inverts it at MoHGE's
mean log B, with a delta-method CI (the fit's covariance and the variance of MoHGE's mean).

    python workflow/scripts/capacity_analysis.py --in runs=results/capacity/runs.csv \
        --out C2_tests_csv=results/capacity/study/C2_tests.csv ... --param reference='"moe"' ...
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

_smk = globals().get("snakemake")
sys.path.insert(0, str(getattr(_smk, "scriptdir", None) or Path(__file__).resolve().parent))
import make_tables as mt  # noqa: E402
import plotstyle as ps  # noqa: E402

DEFAULTS = {
    "reference": "moe",
    "iso": "moe_equal",
    "sweep": ["moe+w9", "moe_equal", "moe", "moe+w19"],
    "mohge": ["mohge", "mohge+ae5e2"],
    "dataset": "facts",
    "quarter": "facts_quarter",
    "alpha": 0.05,
    "margin": 0.03,
    "gate_ratio": 1.05,
    "gate_slope": 0.5,
    "unused_share": 0.01,
}
TEST_COLUMNS = ["test", "a", "b", "n", "estimate", "ci_low", "ci_high", "p", "threshold", "verdict"]


def mean_ci(values, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high) of the Student-t interval; no interval with fewer than two values."""
    x = np.asarray(list(values), dtype=float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else math.nan), math.nan, math.nan
    lo, hi = stats.t.interval(1 - alpha, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    return float(x.mean()), float(lo), float(hi)


def paired_ratio(runs: pd.DataFrame, a: str, b: str, alpha: float) -> dict:
    """exp(mean d) with its (1 - alpha) t-CI and two-sided p, d_s = log B_a(s) - log B_b(s) over shared seeds."""
    wide = runs[runs["family"].isin([a, b])].pivot_table(index="seed", columns="family", values="bits_stored")
    d = (np.log(wide[a]) - np.log(wide[b])).dropna() if a in wide and b in wide else pd.Series(dtype=float)
    n = len(d)
    out = {"a": a, "b": b, "n": n, "estimate": math.exp(d.mean()) if n else math.nan}
    out.update(ci_low=math.nan, ci_high=math.nan, p=math.nan)
    if n >= 2 and d.std(ddof=1) > 0:
        lo, hi = stats.t.interval(1 - alpha, n - 1, loc=d.mean(), scale=stats.sem(d))
        out.update(ci_low=math.exp(lo), ci_high=math.exp(hi), p=float(stats.ttest_1samp(d, 0.0).pvalue))
    return out


def sweep_fit(runs: pd.DataFrame, sweep: list[str]) -> dict:
    """OLS of log B on log P over the sweep's runs: slope, intercept, their covariance, residual df."""
    s = runs[runs["family"].isin(sweep)]
    x, y = np.log(s["total_params_non_embedding"].to_numpy(float)), np.log(s["bits_stored"].to_numpy(float))
    fit = {"n": len(s), "widths": int(s["family"].nunique()), "slope": math.nan, "intercept": math.nan}
    if len(s) < 3 or len(set(x)) < 2:
        return fit
    X = np.stack([np.ones_like(x), x], axis=1)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    df = len(y) - 2
    s2 = float(resid @ resid) / df
    cov = s2 * np.linalg.inv(X.T @ X)
    t = stats.t.ppf(0.975, df)
    se = math.sqrt(cov[1, 1])
    fit.update(intercept=float(beta[0]), slope=float(beta[1]), cov=cov, df=df, slope_low=beta[1] - t * se)
    fit["slope_high"] = beta[1] + t * se
    fit["p"] = float(2 * stats.t.sf(abs(beta[1] / se), df)) if se > 0 else math.nan
    return fit


def equivalent_size(runs: pd.DataFrame, fit: dict, model: str, alpha: float) -> dict:
    """P_eq / P_model: the sweep's parameters at the model's mean log B, with a delta-method CI."""
    m = runs[runs["family"] == model]
    out = {"a": model, "b": "sweep fit", "n": len(m), "estimate": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    if not len(m) or not math.isfinite(fit["slope"]) or fit["slope"] <= 0:
        return out
    ybar, p_model = float(np.log(m["bits_stored"]).mean()), float(m["total_params_non_embedding"].mean())
    a, b = fit["intercept"], fit["slope"]
    g = (ybar - a) / b
    out["estimate"] = math.exp(g) / p_model
    var_ybar = float(np.log(m["bits_stored"]).var(ddof=1)) / len(m) if len(m) > 1 else math.nan
    grad = np.array([-1.0 / b, -(ybar - a) / b**2])
    var = float(grad @ fit["cov"] @ grad) + var_ybar / b**2
    if math.isfinite(var):
        z = stats.norm.ppf(1 - alpha / 2)
        out.update(
            ci_low=math.exp(g - z * math.sqrt(var)) / p_model, ci_high=math.exp(g + z * math.sqrt(var)) / p_model
        )
    return out


def decide(main: pd.DataFrame, quarter: pd.DataFrame, p: dict) -> tuple[pd.DataFrame, dict]:
    """The tests of docs/study.md, in order: the gate's three parts, claim 1, the equivalent size, heterogeneity."""
    rows, alpha = [], p["alpha"]
    g1 = paired_ratio(main, p["reference"], p["iso"], alpha)
    g1.update(test="G1 reference > iso", threshold=f"95% low > {p['gate_ratio']}")
    g1["verdict"] = "pass" if g1["ci_low"] > p["gate_ratio"] else ("fail" if g1["n"] >= 2 else "needs 2 seeds")
    fit = sweep_fit(main, p["sweep"])
    g2 = {"test": "G2 sweep slope", "a": ", ".join(p["sweep"]), "b": "log P", "n": fit["n"], "estimate": fit["slope"]}
    g2.update(ci_low=fit.get("slope_low", math.nan), ci_high=fit.get("slope_high", math.nan), p=fit.get("p", math.nan))
    g2["threshold"] = f">= {p['gate_slope']}"
    enough = fit["widths"] >= 4
    g2["verdict"] = ("pass" if fit["slope"] >= p["gate_slope"] else "fail") if enough else "needs 4 widths"
    refq = [f for f in quarter["family"].unique() if f.split("+")[0] == p["reference"]]
    isoq = [f for f in quarter["family"].unique() if f.split("+")[0] == p["iso"]]
    if refq and isoq:
        g3 = paired_ratio(quarter, refq[0], isoq[0], alpha)
    else:
        g3 = {"a": p["reference"], "b": p["iso"], "n": 0, "estimate": math.nan, "ci_low": math.nan}
        g3.update(ci_high=math.nan, p=math.nan)
    lo, hi = 1 - p["margin"], 1 + p["margin"]
    g3.update(test="G3 saturation (quarter set)", threshold=f"within [{lo:.2f}, {hi:.2f}]")
    inside = (lambda v: lo <= v <= hi)(g3["estimate"]) if g3["n"] else False
    if g3["n"] >= 2:
        inside = lo <= g3["ci_low"] and g3["ci_high"] <= hi
    g3["verdict"] = "pass" if inside else ("fail" if g3["n"] else "no runs")
    gate = all(g["verdict"] == "pass" for g in (g1, g2, g3))
    rows += [g1, g2, g3]
    c1 = paired_ratio(main, p["mohge"][0], p["reference"], alpha)
    c1.update(test="Claim 1 non-inferiority", threshold=f"95% low > {1 - p['margin']:.2f}")
    if c1["n"] < 2:
        c1["verdict"] = "needs 2 seeds"
    elif c1["ci_low"] > 1 - p["margin"]:
        c1["verdict"] = "supported" if gate else "supported, but the gate fails"
    elif c1["ci_high"] < 1 - p["margin"]:
        c1["verdict"] = "refuted" if gate else "refuted, but the gate fails"
    else:
        c1["verdict"] = "undecided"
    rows.append(c1)
    for arm in p["mohge"]:
        eq = equivalent_size(main, fit, arm, alpha)
        eq.update(test=f"MoE-equivalent size of {arm}", threshold="claim: about 1.2", p=math.nan, verdict="")
        rows.append(eq)
    het = paired_ratio(main, p["mohge"][0], p["iso"], alpha)
    het.update(test="Heterogeneity", threshold="two-sided", verdict="")
    if het["n"] >= 2:
        het["verdict"] = "differs" if het["p"] < alpha else "no difference shown"
    rows.append(het)
    return pd.DataFrame(rows)[TEST_COLUMNS], {"gate": gate, "fit": fit}


def model_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and model: n, B and recall (mean, 95 % CI), parameters, bits per non-embedding parameter."""
    rows = []
    for (dataset, fam), g in runs.groupby(["dataset", "family"], sort=True):
        b, lo, hi = mean_ci(g["bits_stored"])
        p_ne = float(g["total_params_non_embedding"].mean())
        rows.append(
            {
                "dataset": dataset,
                "model": fam,
                "n": len(g),
                "params_non_embedding": p_ne,
                "params_total": float(g["total_params"].mean()),
                "bits_stored": b,
                "bits_low": lo,
                "bits_high": hi,
                "bits_per_param": b / p_ne,
                "fraction_of_data": b / float(g["data_bits"].mean()),
                "recall": float(g["fact_recall"].mean()),
            }
        )
    return pd.DataFrame(rows)


def unused_table(traces: list[Path], runs: pd.DataFrame, share: float) -> pd.DataFrame:
    """Per model and MoE layer: mean number of experts (over seeds) whose share of routed slots is below
    `share` of a uniform share, and the expert parameters they hold."""
    fam = runs.set_index("run")["family"].to_dict()
    rows = []
    for path in traces:
        t = json.loads(Path(path).read_text())
        run = Path(path).parent.name
        if run not in fam:
            continue
        widths = [w for w in t["expert_widths"] for _ in range(t["experts_per_group"])]
        for i, layer in enumerate(t["layers"]):
            c = np.asarray(layer["counts"], dtype=float)
            unused = c / c.sum() < share / len(c)
            params = sum(3 * t["d_model"] * w for w, u in zip(widths, unused, strict=True) if u)
            rows.append(
                {"model": fam[run], "run": run, "layer": i, "unused": int(unused.sum()), "unused_params": params}
            )
    df = pd.DataFrame(rows, columns=["model", "run", "layer", "unused", "unused_params"])
    out = df.groupby(["model", "layer"], as_index=False).agg(
        n=("run", "nunique"), unused=("unused", "mean"), unused_params=("unused_params", "mean")
    )
    return out


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if v != v else f"{v:.{digits}f}"


MODEL_COLUMNS = ["dataset", "model", "n", "params_non_embedding", "params_total", "bits_stored", "bits_low"]
MODEL_COLUMNS += ["bits_high", "bits_per_param", "fraction_of_data", "recall"]


def _kbits(b: float, lo: float, hi: float) -> str:
    return f"{b / 1e3:.1f} [{lo / 1e3:.1f}, {hi / 1e3:.1f}] k" if lo == lo else f"{b / 1e3:.1f} k"


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """The capacity study's tables and figure."""
    p = {**DEFAULTS, **params.get("settings", {}), **{k: v for k, v in params.items() if k != "settings"}}
    runs = pd.read_csv(inputs["runs"])
    runs = runs[runs["bits_stored"].notna()] if "bits_stored" in runs else runs.iloc[0:0]
    main_runs, quarter = runs[runs["dataset"] == p["dataset"]], runs[runs["dataset"] == p["quarter"]]
    models = model_table(runs) if len(runs) else pd.DataFrame(columns=MODEL_COLUMNS)
    shown = models.assign(
        params_non_embedding=models["params_non_embedding"].map(mt.fmt_params),
        bits_stored=[_kbits(*r) for r in models[["bits_stored", "bits_low", "bits_high"]].itertuples(index=False)],
    )[["dataset", "model", "n", "params_non_embedding", "bits_stored", "bits_per_param", "fraction_of_data", "recall"]]
    caption = "Bits stored per model (mean [95% t-CI] over n seeds); parameters without the embeddings."
    mt.write_table(models, shown.round(3), outputs, "c1", caption, left=2, by="capacity_analysis.py")
    tests, summary = decide(main_runs, quarter, p)
    display = tests.copy()
    for col in ("estimate", "ci_low", "ci_high", "p"):
        display[col] = display[col].map(_fmt)
    note = (
        "The gate passes: the study decides claim 1." if summary["gate"] else "The gate fails: claim 1 is not decided."
    )
    caption = "Pre-declared tests, paired by seed on log B (docs/study.md)."
    mt.write_table(tests, display, outputs, "c2", caption, notes=[note], by="capacity_analysis.py")
    traces = inputs.get("traces") or []
    traces = [Path(traces)] if isinstance(traces, str) else [Path(t) for t in traces]
    unused = unused_table(traces, runs, p["unused_share"])
    caption = f"Experts per MoE layer with under {p['unused_share']:.0%} of a uniform share of routed slots"
    caption += " (mean over n seeds) and the expert parameters they hold."
    mt.write_table(unused, unused.round(2), outputs, "c3", caption, left=2, by="capacity_analysis.py")
    figure(main_runs, summary["fit"], p, outputs)


def figure(runs: pd.DataFrame, fit: dict, p: dict, outputs: dict) -> None:
    import matplotlib.pyplot as plt

    png = next((v for k, v in outputs.items() if k.endswith("png")), None)
    pdf = next((v for k, v in outputs.items() if k.endswith("pdf")), None)
    if png is None and pdf is None:
        return
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
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
        xs = np.linspace(
            np.log(sweep["total_params_non_embedding"].min()) - 0.1,
            np.log(sweep["total_params_non_embedding"].max()) + 0.1,
            50,
        )
        ax.plot(
            np.exp(xs),
            np.exp(fit["intercept"] + fit["slope"] * xs),
            color="#888888",
            lw=1,
            ls="--",
            label=f"fit: slope {fit['slope']:.2f}",
        )
    marks = [(p["iso"], "moe_equal"), (p["reference"], "moe")] + [(m, "mohge") for m in p["mohge"]]
    for i, (model, fam) in enumerate(marks):
        g = runs[runs["family"] == model]
        if not len(g):
            continue
        b, lo, hi = mean_ci(g["bits_stored"])
        x = g["total_params_non_embedding"].mean()
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
            label=f"{model} (n = {len(g)})",
            zorder=3,
        )
    if len(runs):
        ax.axhline(runs["data_bits"].iloc[0], color="black", lw=0.8, ls=":", label="the data's bits")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("total non-embedding parameters")
    ax.set_ylabel("bits stored B")
    ax.legend(fontsize=7, loc="lower right")
    if not len(runs):
        ps.placeholder(ax, "no capacity runs yet")
    fig.tight_layout()
    ps.save(fig, png, pdf)


if __name__ == "__main__":
    ps.run(main, _smk)
