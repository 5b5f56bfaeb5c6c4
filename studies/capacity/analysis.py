"""The capacity study's declared analysis (studies/capacity/config.yaml; docs/study.md "The capacity study"):
tables C1-C6.

B is the bits stored (runs.csv ``bits_stored``), P the total non-embedding parameters. Every interval and test comes
from :mod:`mohge.core.stats`.

Seeds do not pair here: the facts and their order are the data's, the same in every run, and a seed only sets the
initialisation of architectures that share nothing else. So every comparison of two models is unpaired, Welch's
test on log B: exp(mean log B_A - mean log B_B) is the ratio of geometric means, with its Student-t interval on
Welch-Satterthwaite df. Each row's p is the p of the null its ``h0`` column names:

* G1, the reference MoE stores reliably more than the equal-parameter MoE: H0 ratio <= gate_ratio (1.05); passes if
  the 95 % interval's lower end lies above gate_ratio (the one-sided test at alpha / 2).
* G2, the sweep slope: OLS of log B on log P over every sweep run (every seed a point); H0 slope = 0; passes if the
  slope is at least gate_slope (0.5) with four widths or more.
* G3, saturation on the quarter set: H0 ratio outside [1 - margin, 1 + margin] (TOST); passes if the 95 % interval
  lies inside, read on the point ratio with one seed a model.
* Claim 1, non-inferiority of MoHGE to the reference: H0 ratio <= 1 - margin (0.97); supported if the 95 %
  interval's lower end lies above 1 - margin, refuted if its upper end lies below, undecided otherwise.
* MoE-equivalent size: the sweep fit inverted at an arm's mean log B, P_eq = exp((mean log B - a) / b), as
  P_eq / P_arm; its interval is the delta method's (the fit's covariance on n - 2 df and the variance of the arm's
  mean on n_arm - 1 df, Welch-Satterthwaite df) with t quantiles.
* Heterogeneity, MoHGE against the equal-parameter MoE: H0 ratio = 1, two-sided.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from mohge_studies.analysis import idle
from mohge_studies.config.runs import BEST_SHOT, CAPACITY_GATES, SELECTION, AnalysisConfig

from mohge.core.stats import (
    TEstimate,
    delta_interval,
    delta_variance,
    holm,
    ols_line,
    one_sample,
    welch,
    welch_contrast,
)
from mohge.core.vocab import GATE_MODE_ALIASES

_DECLARED = AnalysisConfig()  # the analysis section's own defaults
DEFAULTS = {
    "reference": _DECLARED.reference_family,
    "equal": _DECLARED.equal_family,
    "sweep": ["moe+w9", "moe_equal", "moe", "moe+w19"],
    "mohge": ["mohge", "mohge+ae5e2"],
    "dataset": "facts",
    "quarter": "facts_quarter",
    "transfer": "facts_d64",  # the transfer arm's dataset (d_model 64, docs/study.md "The transfer arm")
    "alpha": _DECLARED.alpha,
    "margin": _DECLARED.equivalence_margin,
    "gate_ratio": _DECLARED.gate_ratio,
    "gate_slope": _DECLARED.gate_slope,
    "unused_share": _DECLARED.unused_share,
    "gates": list(_DECLARED.gates),
}
TEST_COLUMNS = ["test", "a", "b", "n_a", "n_b", "estimate", "ci_low", "ci_high", "h0", "p", "threshold", "verdict"]
TEST_COLUMNS += ["per_seed"]
MODEL_COLUMNS = ["dataset", "model", "n", "params_non_embedding", "params_total", "bits_stored", "bits_low"]
MODEL_COLUMNS += ["bits_high", "bits_per_param", "fraction_of_data", "recall", "bits_per_seed"]
PER_SEED_MAX = 4  # rows with at most this many seeds of a model also print each seed's value
UNUSED_COLUMNS = ["model", "run", "layer", "unused", "unused_params"]
IDLE_COLUMNS = ["steps_with_unused", "logged_steps", "last_unused_step"]  # C3's columns from the training logs


def settings(params: dict) -> dict:
    """DEFAULTS, then the study config's ``settings``, then any other key of ``params``."""
    return {**DEFAULTS, **params.get("settings", {}), **{k: v for k, v in params.items() if k != "settings"}}


def _log_bits(runs: pd.DataFrame, model: str) -> np.ndarray:
    return np.log(runs.loc[runs["family"] == model, "bits_stored"].to_numpy(np.float64))


def per_seed(runs: pd.DataFrame, a: str, b: str) -> str:
    """Each seed's B_a / B_b where both models ran it ("s10 0.885; s11 0.587"; unpaired: the seeds pair nothing,
    the ratios only show the spread), else each model's B in kbit; "" above :data:`PER_SEED_MAX` seeds a model."""
    sa, sb = (runs[runs["family"] == m].set_index("seed")["bits_stored"].sort_index() for m in (a, b))
    if not len(sa) or not len(sb) or max(len(sa), len(sb)) > PER_SEED_MAX:
        return ""
    common = [s for s in sa.index if s in sb.index]
    if common:
        return "; ".join(f"s{s} {sa[s] / sb[s]:.3f}" for s in common)
    return "; ".join(f"{m}: " + ", ".join(f"{v / 1e3:.1f}" for v in x) + " k" for m, x in ((a, sa), (b, sb)))


def ratio_row(runs: pd.DataFrame, a: str, b: str, alpha: float) -> tuple[dict, TEstimate]:
    """B_a / B_b unpaired (Welch on log B): the row's a, b, n_a, n_b, ratio of geometric means and its (1 - alpha)
    interval (blank where it is not informative: fewer than 2 degrees of freedom), each seed's ratio (:func:`per_seed`),
    and the estimate (log scale) for the row's test."""
    la, lb = _log_bits(runs, a), _log_bits(runs, b)
    est = welch(la, lb)
    lo, hi = est.interval(alpha) if est.informative else (math.nan, math.nan)
    row = {"a": a, "b": b, "n_a": len(la), "n_b": len(lb), "estimate": math.exp(est.estimate)}
    row.update(ci_low=math.exp(lo), ci_high=math.exp(hi), per_seed=per_seed(runs, a, b))
    return row, est


def claim_verdict(row: dict, est: TEstimate, floor: float, gate: bool, gate_name: str) -> dict:
    """Claim 1's declared rule on a ratio row: supported if the 95 % interval lies above ``floor``, refuted if below,
    else undecided, given only where the gate passes; ``h0`` and ``p`` are the null the verdict rejects (H0 ratio >=
    floor for a refutation, else H0 ratio <= floor, the non-inferiority null)."""
    refuted = est.informative and gate and row["ci_high"] < floor
    row["h0"] = f"ratio {'>=' if refuted else '<='} {floor:.2f}"
    row["p"] = est.p_h0_ge(math.log(floor)) if refuted else est.p_h0_le(math.log(floor))
    row["threshold"] = f"95% low > {floor:.2f}"
    if not est.informative:
        row["verdict"] = "needs 2 seeds a model" if not est.defined else "per-seed values only (df < 2)"
    elif not gate:
        row["verdict"] = f"not decidable by the declared rule ({gate_name})"
    else:
        row["verdict"] = "supported" if row["ci_low"] > floor else ("refuted" if refuted else "undecided")
    return row


def sweep_fit(runs: pd.DataFrame, sweep: Sequence[str]) -> dict:
    """OLS of log B on log P over the sweep's runs: n, widths, intercept, slope, its covariance and df, the slope's
    estimate (a :class:`mohge.core.stats.TEstimate`); slope nan below 3 runs or with one P."""
    s = runs[runs["family"].isin(sweep)]
    x, y = np.log(s["total_params_non_embedding"].to_numpy(float)), np.log(s["bits_stored"].to_numpy(float))
    fit = {"n": len(s), "widths": int(s["family"].nunique()), "slope": math.nan, "intercept": math.nan}
    if len(s) < 3:
        return fit
    line = ols_line(x, y)
    fit.update(intercept=line.intercept, slope=line.slope, cov=line.cov, df=line.df, slope_t=line.slope_t)
    return fit


def equivalent_size(runs: pd.DataFrame, fit: dict, model: str, alpha: float) -> dict:
    """P_eq / P_model: the sweep's parameters at the model's mean log B, with its delta-method t interval."""
    y = _log_bits(runs, model)
    m = runs[runs["family"] == model]
    out = {"a": model, "b": "sweep fit", "n_a": len(y), "n_b": fit["n"], "estimate": math.nan}
    out.update(ci_low=math.nan, ci_high=math.nan)
    if not len(y) or not math.isfinite(fit["slope"]) or fit["slope"] <= 0:
        return out
    mean, p_model = one_sample(y), float(m["total_params_non_embedding"].mean())
    a, b = fit["intercept"], fit["slope"]
    g = (mean.estimate - a) / b
    out["estimate"] = math.exp(g) / p_model
    v_fit = delta_variance([-1.0 / b, -(mean.estimate - a) / b**2], fit["cov"])  # d g / d (a, b)
    v_mean = mean.se**2 / b**2
    lo, hi, _ = delta_interval(g, [v_fit, v_mean], [fit["df"], mean.df], alpha)
    out.update(ci_low=math.exp(lo) / p_model, ci_high=math.exp(hi) / p_model)
    return out


def gate_row(runs: pd.DataFrame, test: str, ref: str, equal: str, p: dict) -> dict:
    """G1 on ``runs``: B_ref / B_equal, H0 ratio <= gate_ratio; pass if the 95 % interval's lower end lies above it."""
    g1, est = ratio_row(runs, ref, equal, p["alpha"])
    bar = p["gate_ratio"]
    g1.update(test=test, h0=f"ratio <= {bar}", p=est.p_h0_le(math.log(bar)), threshold=f"95% low > {bar}")
    if est.informative:
        g1["verdict"] = "pass" if g1["ci_low"] > bar else "fail"
    else:
        g1["verdict"] = "per-seed values only (df < 2)" if est.defined else "needs 2 seeds a model"
    return g1


def _gate_g1(main: pd.DataFrame, p: dict) -> dict:
    return gate_row(main, "G1 reference > equal", p["reference"], p["equal"], p)


def _gate_g2(fit: dict, p: dict) -> dict:
    slope = fit.get("slope_t")
    lo, hi = slope.interval(p["alpha"]) if slope is not None else (math.nan, math.nan)
    g2 = {"test": "G2 sweep slope", "a": ", ".join(p["sweep"]), "b": "log P", "n_a": fit["n"], "n_b": math.nan}
    g2.update(estimate=fit["slope"], ci_low=lo, ci_high=hi, h0="slope = 0")
    g2.update(p=slope.p_h0_eq(0.0) if slope is not None else math.nan, threshold=f">= {p['gate_slope']}")
    enough = fit["widths"] >= 4
    g2["verdict"] = ("pass" if fit["slope"] >= p["gate_slope"] else "fail") if enough else "needs 4 widths"
    return g2


def _gate_g3(quarter: pd.DataFrame, p: dict) -> dict:
    refq = [f for f in quarter["family"].unique() if f.split("+")[0] == p["reference"]]
    equalq = [f for f in quarter["family"].unique() if f.split("+")[0] == p["equal"]]
    lo, hi = 1 - p["margin"], 1 + p["margin"]
    if refq and equalq:
        g3, est = ratio_row(quarter, refq[0], equalq[0], p["alpha"])
        g3["p"] = est.p_tost(math.log(lo), math.log(hi))
    else:
        g3 = {"a": p["reference"], "b": p["equal"], "n_a": 0, "n_b": 0, "estimate": math.nan, "ci_low": math.nan}
        g3.update(ci_high=math.nan, p=math.nan)
    g3.update(test="G3 saturation (quarter set)", h0=f"ratio outside [{lo:.2f}, {hi:.2f}]")
    g3["threshold"] = f"within [{lo:.2f}, {hi:.2f}]"
    if g3["ci_low"] == g3["ci_low"]:
        inside = lo <= g3["ci_low"] and g3["ci_high"] <= hi
    else:  # one seed a model: the point ratio
        inside = lo <= g3["estimate"] <= hi
    g3["verdict"] = "pass" if inside else ("fail" if g3["n_a"] and g3["n_b"] else "no runs")
    return g3


def decide(main: pd.DataFrame, quarter: pd.DataFrame, p: dict) -> tuple[pd.DataFrame, dict]:
    """The tests of docs/study.md, in order: the gate's three parts, claim 1, the equivalent sizes, heterogeneity. The
    gate is the parts the study declares (``gates``); a part it does not declare is printed as such and does not
    enter the gate."""
    alpha, floor = p["alpha"], 1 - p["margin"]
    fit = sweep_fit(main, p["sweep"])
    gates = [_gate_g1(main, p), _gate_g2(fit, p), _gate_g3(quarter, p)]
    declared = set(p["gates"])
    for name, g in zip(CAPACITY_GATES, gates, strict=True):
        if name not in declared:
            g["verdict"] = "not declared for this study"
    gate = all(g["verdict"] == "pass" for name, g in zip(CAPACITY_GATES, gates, strict=True) if name in declared)
    c1, est = ratio_row(main, p["mohge"][0], p["reference"], alpha)
    c1 = claim_verdict({**c1, "test": "Claim 1 non-inferiority"}, est, floor, True, "")
    if not gate and c1["verdict"] in ("supported", "refuted"):
        c1["verdict"] += ", but the gate fails"
    rows = [*gates, c1]
    for arm in p["mohge"]:
        eq = equivalent_size(main, fit, arm, alpha)
        eq.update(test=f"MoE-equivalent size of {arm}", h0="", p=math.nan, threshold="claim: about 1.2", verdict="")
        rows.append(eq)
    het, est = ratio_row(main, p["mohge"][0], p["equal"], alpha)
    het.update(test="Heterogeneity", h0="ratio = 1", p=est.p_h0_eq(0.0), threshold="two-sided", verdict="")
    if est.defined:
        het["verdict"] = "differs" if het["p"] < alpha else "no difference shown"
    rows.append(het)
    tests = pd.DataFrame(rows)[TEST_COLUMNS].astype({"n_a": "Int64", "n_b": "Int64"})
    return tests, {"gate": gate, "fit": fit}


def model_table(runs: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Per dataset and model: n, B and recall (mean, 95 % CI where it is informative, its lower end at least 0),
    parameters, bits per non-embedding parameter, and each seed's B (kbit) for models of at most
    :data:`PER_SEED_MAX` seeds."""
    rows = []
    for (dataset, fam), g in runs.groupby(["dataset", "family"], sort=True):
        est = one_sample(g["bits_stored"].to_numpy(float))
        b, (lo, hi) = est.estimate, est.interval(alpha) if est.informative else (math.nan, math.nan)
        lo = max(lo, 0.0) if lo == lo else lo  # B >= 0: raising the lower end to 0 keeps the coverage
        shown = g.sort_values("seed")["bits_stored"] if len(g) <= PER_SEED_MAX else []
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
                "bits_per_seed": ", ".join(f"{v / 1e3:.1f}" for v in shown),
            }
        )
    return pd.DataFrame(rows, columns=MODEL_COLUMNS)


def unused_table(traces: Sequence[Path], runs: pd.DataFrame, share: float, logs: Sequence[Path] = ()) -> pd.DataFrame:
    """Per model and MoE layer: mean number of experts (over seeds) whose share of routed slots is below
    `share` of a uniform share, and the expert parameters they hold; then, from the training logs ``logs``, how
    many logged steps had any unused expert (mean over seeds), of how many, and the last such step in any seed
    (:func:`mohge_studies.analysis.idle.steps_with_unused`; NaN where the logs do not count unused experts)."""
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
    df = pd.DataFrame(rows, columns=UNUSED_COLUMNS)
    table = df.groupby(["model", "layer"], as_index=False).agg(
        n=("run", "nunique"), unused=("unused", "mean"), unused_params=("unused_params", "mean")
    )
    steps = idle.steps_with_unused(idle.idle_table(logs, runs, share))
    return table.merge(steps[["model", "layer", *IDLE_COLUMNS]], on=["model", "layer"], how="left")


# The best shot's selection (docs/study.md "Claim 1 with MoHGE given its best shot", item 2)

SELECTION_TIE = 1e-3  # B within 0.1 % of the best is a tie: the lower lr wins, then softmax_topk_probs
SELECTION_COLUMNS = ["family", "variant", "run", "lr", "gate_mode", "bits_stored", "kept"]


def selection(runs: pd.DataFrame, settings_of: dict[str, dict], declared: dict[str, int]) -> pd.DataFrame:
    """One row per selection run (``family`` ``<base>+sel_*`` in runs.csv) with its lr and gate (``settings_of``:
    run -> {"lr", "gate_mode"}, from the resolved run configs; a gate_mode alias such as the committed configs'
    ``code_exact`` is read as its name) and B; ``kept`` marks each base family's choice by the declared rule: the
    largest B, ties within :data:`SELECTION_TIE` of it to the lower lr, then to softmax_topk_probs. A family has
    no choice (``kept`` False everywhere) until all its ``declared`` runs are in."""
    rows = []
    for _, r in runs[runs["family"].str.contains("+" + SELECTION, regex=False)].iterrows():
        base, variant = r["family"].split("+", 1)
        got = settings_of[r["run"]]
        gate = GATE_MODE_ALIASES.get(got["gate_mode"], got["gate_mode"])
        rows.append({"family": base, "variant": variant, "run": r["run"], **got, "gate_mode": gate,
                     "bits_stored": float(r["bits_stored"]), "kept": False})  # fmt: skip
    table = pd.DataFrame(rows, columns=SELECTION_COLUMNS)
    for base, g in table.groupby("family"):
        if len(g) < declared.get(base, 0) or g["bits_stored"].isna().any():
            continue
        tied = g[g["bits_stored"] >= g["bits_stored"].max() * (1 - SELECTION_TIE)]
        order = tied.assign(renorm=tied["gate_mode"] != "softmax_topk_probs").sort_values(["lr", "renorm"])
        table.loc[order.index[0], "kept"] = True
    return table.sort_values(["family", "gate_mode", "lr"], ignore_index=True)


# The best shot's arms, instantiated from the selection (docs/study.md "The selection and the arms it instantiates")

COMMITTED_SETTING = "lr1e2"  # the first analysis's setting (lr 1e-2, the release's gate): its seeds pool if kept
WHY = ("every width 12", "HMoE's flat router", "the release's gate form")  # the why arms' tests, one Holm family


def kept_settings(table: pd.DataFrame) -> dict[str, str]:
    """base family -> its kept selection setting, the variant without ``sel_`` (``renorm_lr5e3``, ``lr5e3``)."""
    kept = table[table["kept"]]
    return {r.family: r.variant.removeprefix(SELECTION) for r in kept.itertuples()}


def best_labels(kept: dict[str, str], reference: str, equal: str) -> dict[str, str]:
    """The best shot's models by role, named from each family's kept ``setting`` as studies/capacity/config.yaml names
    them: ``<family>+best_<setting>`` (confirmatory), MoHGE's ``_quarter`` and ``_long``, the reference's ``_long``,
    ``mohge+best_<setting>_hom12``, ``hmoe+best_<lr of MoHGE's setting>``, ``<equal>+best_<setting>_probsgate``, every
    one of those three families' and HMoE's ``_d64`` (the size ladder), and MoHGE's ``_groups``. Empty until the three
    families have a choice."""
    if not {"mohge", reference, equal} <= set(kept):
        return {}
    m, r, i = (f"{BEST_SHOT}{kept[f]}" for f in ("mohge", reference, equal))
    lr = kept["mohge"].rsplit("_", 1)[-1]
    return {
        "mohge": f"mohge+{m}", "reference": f"{reference}+{r}", "equal": f"{equal}+{i}",
        "mohge_quarter": f"mohge+{m}_quarter", "mohge_long": f"mohge+{m}_long",
        "reference_long": f"{reference}+{r}_long", "hom": f"mohge+{m}_hom12", "hmoe": f"hmoe+{BEST_SHOT}{lr}",
        "probsgate": f"{equal}+{i}_probsgate", "mohge_d64": f"mohge+{m}_d64", "reference_d64": f"{reference}+{r}_d64",
        "equal_d64": f"{equal}+{i}_d64", "hmoe_d64": f"hmoe+{BEST_SHOT}{lr}_d64", "groups": f"mohge+{m}_groups",
    }  # fmt: skip


def _pool_committed(runs: pd.DataFrame, kept: dict[str, str], labels: dict[str, str]) -> pd.DataFrame:
    """A family whose kept setting is the committed one pools its committed seeds with its confirmatory ones."""
    runs = runs.copy()
    for role in ("mohge", "reference", "equal"):
        base = labels[role].split("+")[0]
        if kept.get(base) == COMMITTED_SETTING:
            runs.loc[runs["family"] == base, "family"] = labels[role]
    return runs


def _ratio_test(runs: pd.DataFrame, test: str, a: str, b: str, alpha: float) -> tuple[dict, TEstimate]:
    row, est = ratio_row(runs, a, b, alpha)
    row.update(test=test, h0="", p=math.nan, threshold="", verdict="")
    return row, est


def _interim(row: dict, declared: dict[str, int]) -> str:
    """``interim: n a/b of A/B declared`` while either model of a test row has fewer seeds in than ``declared`` plans
    for it (model label -> seeds); "" once both are complete. A test is read only on its declared seeds."""
    want = [declared.get(row[k], 0) for k in ("a", "b")]
    if all(n >= w for n, w in zip((row["n_a"], row["n_b"]), want, strict=True)):
        return ""
    return f"interim: n {row['n_a']}/{row['n_b']} of {want[0]}/{want[1]} declared"


SATURATED = 0.9  # a d_model 64 row reads nothing where the reference stores more than this share of the set's bits


def _saturated(runs: pd.DataFrame, ref: str) -> bool:
    r = runs[runs["family"] == ref]
    return bool(len(r)) and float((r["bits_stored"] / r["data_bits"]).mean()) > SATURATED


def size_slope(main: pd.DataFrame, d64: pd.DataFrame, labels: dict[str, str], alpha: float) -> tuple[dict, TEstimate]:
    """The size ladder's declared test (docs/study.md, "The size ladder at d_model 64"): exp(S), S = log R64 - log
    R32, R_d = B_MoHGE / B_MoE-15 (ratio of geometric means) at d_model d; Welch-Satterthwaite over the four
    independent samples; H0 S <= 0 (the deficit does not shrink)."""
    samples = [
        _log_bits(d64, labels["mohge_d64"]),
        _log_bits(d64, labels["reference_d64"]),
        _log_bits(main, labels["mohge"]),
        _log_bits(main, labels["reference"]),
    ]
    est = welch_contrast(samples, [1.0, -1.0, -1.0, 1.0])
    lo, hi = est.interval(alpha) if est.informative else (math.nan, math.nan)
    row = {"test": "Size: (MoHGE / MoE-15 at 64) / (at 32)", "a": labels["mohge_d64"], "b": labels["mohge"]}
    row.update(n_a=len(samples[0]) + len(samples[1]), n_b=len(samples[2]) + len(samples[3]))
    row.update(estimate=math.exp(est.estimate), ci_low=math.exp(lo), ci_high=math.exp(hi), per_seed="")
    row.update(h0="ratio <= 1", p=est.p_h0_le(0.0), threshold="one-sided, Holm over 2 with claim 1 at 64")
    return row, est


def ladder(runs: pd.DataFrame, main: pd.DataFrame, labels: dict[str, str], p: dict) -> list[dict]:
    """(8) the size ladder at d_model 64, read by the confirmatory rule (docs/study.md, "The size ladder at d_model
    64"): G1 at 64, claim 1 at 64 (given G1 there), the size slope (Holm over it and claim 1 at 64; read as a change of
    the deficit only where G1 passes at both sizes), and the router factor at 64 (descriptive)."""
    alpha, floor = p["alpha"], 1 - p["margin"]
    d64 = runs[runs["dataset"] == p["transfer"]]
    g1 = gate_row(d64, "G1 at d_model 64", labels["reference_d64"], labels["equal_d64"], p)
    c1, est = ratio_row(d64, labels["mohge_d64"], labels["reference_d64"], alpha)
    c1 = claim_verdict({**c1, "test": "Claim 1 at d_model 64"}, est, floor, g1["verdict"] == "pass", "G1 at 64")
    if _saturated(d64, labels["reference_d64"]):
        c1["verdict"] = f"near saturation (the reference stores > {SATURATED:.0%} of the set): no reading"
    slope, sest = size_slope(main, d64, labels, alpha)
    adjusted = holm([c1["p"], slope["p"]])
    if sest.informative:
        g1_32 = gate_row(main, "", labels["reference"], labels["equal"], p)
        gates = g1["verdict"] == "pass" and g1_32["verdict"] == "pass"
        if adjusted[1] < alpha:
            read = "shrinks"
        elif slope["ci_high"] < 1:
            read = f"grows (p of H0 ratio >= 1: {sest.p_h0_ge(0.0):.3g})"
        else:
            read = "not shown to shrink"
        failed = "fail" in (g1["verdict"], g1_32["verdict"])
        note = (
            "" if gates else " (estimate only: G1 fails at a size)" if failed else " (estimate only: G1 not read at 64)"
        )
        slope["verdict"] = f"Holm p {adjusted[1]:.3g}: {read}{note}"
        # it reads both sizes' arms: interim while the d_model 64 arms have fewer seeds in than declared
        slope["verdict"] = _interim(c1, p.get("declared", {})) or slope["verdict"]
    else:
        slope["verdict"] = "per-seed values only (df < 2)" if sest.defined else "needs 2 seeds a model at each size"
    test = "Router factor at d_model 64: MoHGE / HMoE"
    router, _ = _ratio_test(d64, test, labels["mohge_d64"], labels["hmoe_d64"], alpha)
    return [g1, c1, slope, {**router, "threshold": "descriptive"}]


def groups_alive(main: pd.DataFrame, labels: dict[str, str], alpha: float) -> list[dict]:
    """(9) every group kept alive at d_model 32 (docs/study.md): B_groups / B_best-MoHGE and B_groups / B_HMoE,
    two-sided Welch, Holm over the two; the router factor recovered if the first differs upward and the second does
    not differ, partly if only the first does, else not; the share recovered beside them."""
    rows, ests = [], []
    for b, name in (("mohge", "MoHGE"), ("hmoe", "HMoE")):
        row, est = _ratio_test(main, f"Groups alive: MoHGE+group bias / {name}", labels["groups"], labels[b], alpha)
        row.update(h0="ratio = 1", p=est.p_h0_eq(0.0), threshold="two-sided, Holm over 2")
        rows.append(row)
        ests.append(est)
    adjusted = holm([r["p"] for r in rows])
    if all(e.informative for e in ests):
        up = adjusted[0] < alpha and rows[0]["estimate"] > 1
        apart = adjusted[1] < alpha
        read = "recovered" if up and not apart else ("partly recovered" if up else "not recovered")
        hm = welch(_log_bits(main, labels["hmoe"]), _log_bits(main, labels["mohge"])).estimate
        share = math.log(rows[0]["estimate"]) / hm if hm else math.nan
        for row, adj in zip(rows, adjusted, strict=True):
            row["verdict"] = f"Holm p {adj:.3g}: " + ("differs" if adj < alpha else "not separated")
        rows[0]["verdict"] += f"; the router factor {read} (share {share:.2f})"
    return rows


def best_shot(runs: pd.DataFrame, table: pd.DataFrame, p: dict) -> pd.DataFrame:
    """C5: the best shot's tests (docs/study.md, items 3-9) on the models :func:`best_labels` names; "needs 2 seeds a
    model" or no runs where they have not run. ``runs``: every run of runs.csv; ``table``: :func:`selection`.
    ``p["declared"]`` (model label -> the seeds the config plans) marks a tested row whose models are not all in as
    interim: it carries its estimate, interval and p, and no verdict."""
    kept = kept_settings(table)
    labels = best_labels(kept, p["reference"], p["equal"])
    if not labels:
        return pd.DataFrame(columns=TEST_COLUMNS)
    alpha, floor = p["alpha"], 1 - p["margin"]
    runs = _pool_committed(runs, kept, labels)
    main = runs[runs["dataset"] == p["dataset"]]
    g1 = gate_row(main, "G1 reference > equal", labels["reference"], labels["equal"], p)
    c1, est = ratio_row(main, labels["mohge"], labels["reference"], alpha)
    c1 = claim_verdict({**c1, "test": "Claim 1 non-inferiority"}, est, floor, g1["verdict"] == "pass", "G1")
    rows = [g1, c1]
    het, est = _ratio_test(main, "Heterogeneity", labels["mohge"], labels["equal"], alpha)
    het.update(h0="ratio = 1", p=est.p_h0_eq(0.0), threshold="two-sided")
    het["verdict"] = ("differs" if het["p"] < alpha else "no difference shown") if est.informative else ""
    rows.append(het)
    # (4) capacity or learning speed: descriptive ratios
    for test, a, b, ds in (
        ("400 exposures: MoHGE / MoE-15", labels["mohge_long"], labels["reference_long"], "facts_long"),
        ("quarter set: MoHGE / reference", labels["mohge_quarter"], None, p["quarter"]),
    ):
        sub = runs[runs["dataset"] == ds]
        if b is None:  # the committed quarter runs of the reference (one seed)
            b = next(
                (f for f in sub["family"].unique() if f.split("+")[0] == p["reference"] and BEST_SHOT not in f), ""
            )
        row, _ = _ratio_test(sub, test, a, b, alpha)
        rows.append({**row, "threshold": "descriptive"})
    # (5) why: two-sided Welch, Holm over the three
    why = []
    for test, a, b in zip(WHY, (labels["hom"], labels["hmoe"], labels["probsgate"]),
                          (labels["mohge"], labels["mohge"], labels["equal"]), strict=True):  # fmt: skip
        row, est = _ratio_test(main, f"Why: {test}", a, b, alpha)
        row.update(h0="ratio = 1", p=est.p_h0_eq(0.0), threshold="two-sided, Holm over 3")
        why.append(row)
    for row, adjusted in zip(why, holm([r["p"] for r in why]), strict=True):
        if adjusted == adjusted:
            row["verdict"] = f"Holm p {adjusted:.3g}: " + ("differs" if adjusted < alpha else "no difference shown")
    rows += why
    rows += ladder(runs, main, labels, p)
    rows += groups_alive(main, labels, alpha)
    for row in rows:
        if row["verdict"] and (pending := _interim(row, p.get("declared", {}))):
            row["verdict"] = pending
    # (6) the grid's edge: each family's B at lr 2.5e-3 over its B at its kept setting (seed 100)
    for fam, setting in kept.items():
        edge = f"{fam}+{BEST_SHOT}edge_{setting.rsplit('_', 1)[0] + '_' if '_' in setting else ''}lr2p5e3"
        row, _ = _ratio_test(main, f"Edge: {fam} at lr 2.5e-3 / its choice", edge, f"{fam}+{SELECTION}{setting}", alpha)
        rows.append({**row, "threshold": "descriptive"})
    return pd.DataFrame(rows)[TEST_COLUMNS].astype({"n_a": "Int64", "n_b": "Int64"})


# The deficit taken apart (C6): B_MoHGE / B_MoE-15 = router x width x parameter factor, each a ratio of geometric
# means, so the three multiply to the deficit exactly; what differs between the two models of each factor
DECOMPOSITION = (
    ("the deficit: MoHGE / MoE-15", "mohge", "reference", "everything below"),
    (
        "router factor: MoHGE / HMoE",
        "mohge",
        "hmoe",
        "the two-level router (8 groups, top-4 groups, then top-4 experts of their 16) against one flat top-4 over 32;"
        " the product_renorm gate against the softmax over the top-4 logits; L_G + L_E against HMoE's size-weighted"
        " balance loss; all-size against contiguous placement (one process: the same computation)",
    ),
    (
        "width factor: HMoE / MoE-12",
        "hmoe",
        "equal",
        "widths 5-19 (mean 12) against every width 12; HMoE's size-weighted balance loss against the Switch loss",
    ),
    ("parameter factor: MoE-12 / MoE-15", "equal", "reference", "width 12 against 15 (0.82x the expert parameters)"),
    ("equal-parameter factor: MoHGE / MoE-12", "mohge", "equal", "router factor x width factor"),
)
DECOMPOSITION_COLUMNS = ["d_model", "factor", "a", "b", "n_a", "n_b", "estimate", "ci_low", "ci_high", "per_seed"]
DECOMPOSITION_COLUMNS += ["what_differs"]


def decomposition(runs: pd.DataFrame, labels: dict[str, str], p: dict) -> pd.DataFrame:
    """C6: each factor of :data:`DECOMPOSITION` at d_model 32 (the main set's best-shot models) and at d_model 64
    (the size ladder's, on its set) where their runs are in; unpaired Welch on log B, descriptive (C5 has the tests)."""
    rows = []
    if not labels:
        return pd.DataFrame(columns=DECOMPOSITION_COLUMNS)
    for d_model, ds, suffix in ((32, p["dataset"], ""), (64, p["transfer"], "_d64")):
        sub = runs[runs["dataset"] == ds]
        for factor, a, b, differs in DECOMPOSITION:
            la, lb = labels[a + suffix], labels[b + suffix]
            if not ((sub["family"] == la).any() and (sub["family"] == lb).any()):
                continue
            row, _ = ratio_row(sub, la, lb, p["alpha"])
            rows.append({**row, "d_model": d_model, "factor": factor, "what_differs": differs})
    return pd.DataFrame(rows, columns=DECOMPOSITION_COLUMNS).astype({"n_a": "Int64", "n_b": "Int64"})


def analyse(runs: pd.DataFrame, traces: Sequence[Path], params: dict, logs: Sequence[Path] = ()) -> dict:
    """Every result of the study from runs.csv's rows and the runs' trace.json and train_log.jsonl paths:
    ``models`` (C1), ``tests`` and ``gate`` (C2), ``unused`` (C3), ``selection`` (C4: the selection runs
    ``params["selection"]`` names), ``best_shot`` (C5) and ``decomposition`` (C6), the sweep ``fit``, the ``main``
    dataset's runs, every run with a B (``runs``) and the merged ``settings``."""
    p = settings(params)
    runs = runs[runs["bits_stored"].notna()] if "bits_stored" in runs else runs.iloc[0:0]
    main, quarter = runs[runs["dataset"] == p["dataset"]], runs[runs["dataset"] == p["quarter"]]
    tests, summary = decide(main, quarter, p)
    chosen = p.get("selection") or {}
    settings_of = {run: {"lr": v["lr"], "gate_mode": v["gate_mode"]} for run, v in chosen.items()}
    declared = pd.Series([v["family"] for v in chosen.values()]).value_counts().to_dict() if chosen else {}
    picked = selection(runs[runs["run"].isin(settings_of)], settings_of, declared)
    kept = kept_settings(picked)
    labels = best_labels(kept, p["reference"], p["equal"])
    return {
        "selection": picked,
        "best_shot": best_shot(runs, picked, p),
        "decomposition": decomposition(_pool_committed(runs, kept, labels) if labels else runs, labels, p),
        "settings": p,
        "main": main,
        "runs": runs,
        "models": model_table(runs, p["alpha"]),
        "tests": tests,
        "gate": summary["gate"],
        "fit": summary["fit"],
        "unused": unused_table(traces, runs, p["unused_share"], logs),
    }
