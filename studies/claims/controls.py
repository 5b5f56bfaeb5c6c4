"""The claims study's arms declared after its results (docs/study.md "Declared before their runs"):
their tests.

Every declared test is reported when its runs are in runs.csv and listed as "declared, not run" (no numbers) when
they are not; a test is declared when the study config plans its models (:func:`mohge_studies.config.runs.plan`), so a
study without these arms lists none. The quality tests are those of S2 (:func:`mohge.core.stats.compare`:
paired by seed on log test perplexity, 95 % CI, declared power and 80 % MDE), on the seeds the two models share
(:func:`paired_log_diffs`).

* S8_controls, the attribution of Q1b (MoHGE vs the equal-parameter MoE-208, "the package"):
  (a) MoHGE vs hom208 (MoHGE's router and losses, every width 208) and hom208 vs MoE-208, two-sided;
  (b) MoHGE vs renorm (the product_renorm gate), two-sided; (b') probsgate (MoE-208, softmax over its top-k
  probabilities) vs MoE-208, two-sided; (c) per family (MoHGE, MoE-208) the best of its lrs by mean test ppl over
  the seeds all its lr arms share, and Q1b re-tested at the two best lrs, one-sided; (d) noaux (MoE-208 without its
  Switch loss) vs MoE-208, two-sided, and Q1b re-tested against noaux, one-sided.
  (c) chooses on the test split it then tests on; each selection row's note says which arm val perplexity picks.
  **Multiplicity**: the 7 paired tests ((a) two, (b), (b'), (c), (d) two) are one family (S8_FAMILY); ``p_holm`` is
  Holm's adjustment over them and ``decision_holm`` the decision read at it, a finding only where p_holm < alpha.
  **Restating Q1b** (the last row, a computed verdict, on the Holm decisions): "heterogeneity helps" only if Q1b
  holds (S2), MoHGE beats hom208 ((a): "A lower"), the lead survives the gate ((b): MoHGE is not shown lower than
  renorm, i.e. the softmax_topk_probs gate does not carry it), Q1b holds at each family's best lr ((c)) and against
  noaux ((d)); otherwise "the package".
* S9_q3_dose, Q3's control and dose-response over alpha_G (every MoHGE model of the graded dataset, by its
  loss.group_aux_coeff; omega_max, the widest group's cost weight, tells the cost weights apart): activated parameters
  and test perplexity (mean, CI over seeds), the paired easy - hard routed width and the Q3 test at each alpha_G
  ("easy tokens go to small groups" if its CI lies below 0); against the alpha_G = 0 control, per seed, the difference
  of easy - hard (two-sided paired t: "steers" needs a difference, in the direction of the claim), the perplexity
  ratio (paired, two-sided, as S8) and the activated parameters (%). Holm within each family of tests against the
  control (``evc_p_holm`` over the arms' easy - hard tests, ``prc_p_holm`` over their perplexity tests); ``steers``
  reads ``evc_p_holm``.
* S10_token_q3, the token-level record of each run's trace (:mod:`mohge.evaluate.token_width`), over seeds: Spearman's
  rho of routed width with loss over answer tokens and all tokens, its excess over the within-level shuffled null,
  the permutation p-values (Fisher's combination over seeds; ``perm_p_fisher_holm``: Holm over the dataset's arms),
  and the within-token easy - hard contrast. A run traced
  before the record existed has none ("no token-level record").
* S11_bias_balance, balance on trained routing without a loss (docs/study.md; BIAS_ARM): the all-size max/mean at EP
  ``balance_ep`` on the arm's trained routing (S3's geometric mean and interval; the goal: mean <= BIAS_GOAL and upper
  end <= BIAS_CEILING) and its paired log ratio to the release recipe (two-sided); its unused experts per layer (S7's
  count; the goal: none in any layer of any seed); its test perplexity against the release recipe (non-inferiority
  at BIAS_PPL_MARGIN, read on the 90 % interval's upper end) and against alpha_E 2e-1 (two-sided, with its 80 % MDE);
  the verdict "balance holds on trained routing without a loss" only where the three goals are met. The same rows
  for each arm of BIAS_ARMS that keeps every group alive with a group selection bias, by Q2's bar (the interval's
  upper end below balance_bar), with unused groups beside unused experts and Holm over their perplexity tests.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from mohge_studies.config.runs import AnalysisConfig, plan

from mohge.core.stats import (
    compare,
    detectable,
    fisher_combined_p,
    holm,
    one_sample,
    power_two_sided,
    ratio_interval,
    sample_sd,
    t_interval,
)
from mohge.model.losses import group_cost_weights

NOT_RUN = "declared, not run"
COMPARE_COLUMNS = [
    "n", "ratio", "ci_low", "ci_high", "ci90_low", "ci90_high", "p", "p_lower", "p_upper", "decision", "sd",
    "power", "power_at", "mde80_pct",
]  # fmt: skip
CONTROL_COLUMNS = [
    "arm", "question", "metric", "A", "B", "test", "status", *COMPARE_COLUMNS, "p_holm", "decision_holm", "family",
    "note",
]  # fmt: skip
# S8's family for Holm's adjustment: its paired tests (every row but (c)'s selections and the restatement)
S8_FAMILY = ("a", "a2", "b", "b'", "c", "d2", "d")
DOSE_COLUMNS = [
    "dataset", "model", "alpha_G", "omega_max", "status", "n", "activated_params", "activated_low",
    "activated_high", "test_ppl", "test_ppl_low", "test_ppl_high", "easy_minus_hard", "emh_low", "emh_high",
    "q3_decision", "control", "n_pairs", "emh_vs_control", "evc_low", "evc_high", "evc_p", "evc_p_holm", "evc_mde80",
    "steers", "ppl_ratio_vs_control", "prc_low", "prc_high", "prc_p", "prc_p_holm", "prc_mde80_pct",
    "activated_vs_control_pct", "avc_low", "avc_high", "family",
]  # fmt: skip
TOKEN_COLUMNS = [
    "dataset", "model", "n", "n_token_record", "status", "rho_answer", "rho_answer_low", "rho_answer_high",
    "null_mean", "excess", "excess_low", "excess_high", "perm_p_fisher", "perm_p_fisher_holm", "perm_p_below_alpha",
    "rho_all",
    "rho_all_low", "rho_all_high", "within_emh", "within_emh_low", "within_emh_high", "token_ids",
]  # fmt: skip
LR_VARIANTS = ("lr1p5e3", "lr6e3")  # (c): the lr sweep's variants in studies/claims/config.yaml
# S11: the arm balanced by a selection bias, the release recipe, the alpha_E 2e-1 arm (studies/claims/config.yaml),
# its goals
BIAS_ARM = ("mohge+biasfree", "mohge", "mohge+ae2e1")
BIAS_GOAL, BIAS_CEILING, BIAS_PPL_MARGIN = 1.10, 1.20, 0.02
# every arm balanced by a selection bias, and its balance goal: S11's own (mean <= BIAS_GOAL, upper end <=
# BIAS_CEILING) or Q2's declared bar (the interval's upper end below analysis.balance_bar); the arms of the Q2 goal
# keep every group alive (docs/study.md "Every group kept alive"), their perplexity tests one family (Holm)
BIAS_ARMS = {"mohge+biasfree": "s11", "mohge+groupbias": "q2", "mohge+biasfree_groups": "q2"}
BIAS_COLUMNS = [
    "goal", "question", "metric", "A", "B", "test", "status", "n", "estimate", "ci_low", "ci_high", "p", "decision",
    "mde80_pct", "met", "note",
]  # fmt: skip


def model_name(family: str, variant: str) -> str:
    """The runs.csv name of a model: its family, qualified by the variant (collect.model_name)."""
    return f"{family}+{variant}" if variant else family


def paired_log_diffs(runs: pd.DataFrame, metric: str, a: str, b: str) -> pd.Series:
    """log metric(a) - log metric(b) per seed, over the seeds both models have (index: seed): the claims study pairs
    by seed, which fixes the data order of every model."""
    wide = runs[runs["family"].isin([a, b])].pivot_table(index="seed", columns="family", values=metric)
    if a not in wide or b not in wide:
        return pd.Series(dtype=np.float64)
    wide = wide.dropna(subset=[a, b])
    return np.log(wide[a]) - np.log(wide[b])


def planned_models(config: dict) -> dict[tuple[str, str], dict[int, object]]:
    """(dataset, model) -> seed -> resolved RunConfig, for every run the study config plans."""
    out: dict[tuple[str, str], dict[int, object]] = defaultdict(dict)
    if "experiments" in config and "datasets" in config:
        for cfg in plan(config, preflight=False).values():
            out[(cfg.dataset, model_name(cfg.family, cfg.variant))][cfg.train.seed] = cfg
    return dict(out)


# --------------------------------------------------------------------------------------------------------------
# S8: the controls of Q1b and its restatement


def _declared_pairs(planned: dict, dataset: str, a: str, b: str) -> int:
    return len(set(planned.get((dataset, a), {})) & set(planned.get((dataset, b), {})))


def _status(n: int, declared: int) -> str:
    if n == 0:
        return NOT_RUN
    return "run" if n >= declared else f"partly run ({n} of {declared} pairs)"


def _test_row(runs, planned, dataset, arm, question, a, b, test, alpha, margin, metric, note="") -> dict:
    """One declared paired test; no numbers when none of its pairs has run."""
    d = paired_log_diffs(runs, metric, a, b) if a and b else pd.Series(dtype=np.float64)
    row = {"arm": arm, "question": question, "metric": metric, "A": a, "B": b, "test": test, "note": note}
    row["status"] = _status(len(d), max(_declared_pairs(planned, dataset, a, b), len(d)))
    if not len(d):
        row.update(dict.fromkeys(COMPARE_COLUMNS, math.nan), n=0, decision=NOT_RUN, power_at="")
        return row
    return {**row, **compare(d, test, alpha, margin)}


def _declared(planned: dict, runs: pd.DataFrame, dataset: str, *models: str) -> bool:
    have = set(runs.loc[runs["dataset"] == dataset, "family"])
    return all((dataset, m) in planned or m in have for m in models)


def best_lr(runs: pd.DataFrame, planned: dict, dataset: str, base: str, metric: str) -> dict:
    """(c) for one family: its lr arms (the shared lr and LR_VARIANTS), the best by mean ``metric`` over the seeds
    every arm has run; {"best": None} until every arm has at least one such seed."""
    arms = [base, *(f"{base}+{v}" for v in LR_VARIANTS)]
    arms = [m for m in arms if _declared(planned, runs, dataset, m)]
    lr = {m: next(iter(planned.get((dataset, m), {}).values()), None) for m in arms}
    lr = {m: (f"{c.train.lr:g}" if c is not None else "?") for m, c in lr.items()}
    r = runs[(runs["dataset"] == dataset) & runs["family"].isin(arms)]
    wide = r.pivot_table(index="seed", columns="family", values=metric)
    seeds = wide.dropna().index if set(arms) <= set(wide.columns) else []
    out = {"arms": arms, "lr": lr, "seeds": list(seeds), "best": None, "means": {}}
    if len(seeds) and len(arms) > 1:
        means = wide.loc[seeds, arms].mean()
        out.update(best=str(means.idxmin()), means=means.to_dict())
    return out


def _lr_note(sel: dict, metric: str) -> str:
    if sel["best"] is None:
        return "lrs " + ", ".join(sel["lr"][m] for m in sel["arms"])
    seeds = ",".join(str(s) for s in sel["seeds"])
    means = "; ".join(f"lr {sel['lr'][m]}: {sel['means'][m]:.4g}" for m in sel["arms"])
    return f"mean {metric} over seeds {seeds}: {means}"


def control_tests(runs: pd.DataFrame, config: dict, planned: dict | None = None) -> pd.DataFrame:
    """S8_controls (module docstring): every declared control test of the main dataset and the Q1b verdict."""
    a = AnalysisConfig.from_dict(config.get("analysis") or {}, "analysis")
    alpha, margin, equal, metric = a.alpha, a.equivalence_margin, a.equal_family, a.primary_metric
    planned = planned_models(config) if planned is None else planned
    dataset = config["experiments"][0]["dataset"]
    runs = runs[runs["dataset"] == dataset]
    plan_ = [  # (key, arm, question, A, B, test): the declared tests of docs/study.md
        ("a", "(a) grouped, homogeneous", "MoHGE vs hom208", "mohge", "mohge+hom208", "two-sided"),
        ("a2", "(a) grouped, homogeneous", "hom208 vs equal-parameter MoE", "mohge+hom208", equal, "two-sided"),
        ("b", "(b) gate", "MoHGE vs renorm", "mohge", "mohge+renorm", "two-sided"),
        ("b'", "(b') flat gate", "probsgate vs equal-parameter MoE", f"{equal}+probsgate", equal, "two-sided"),
        ("d2", "(d) no balance loss", "noaux vs equal-parameter MoE", f"{equal}+noaux", equal, "two-sided"),
        ("d", "(d) no balance loss", "Q1b against noaux", "mohge", f"{equal}+noaux", "less"),
    ]
    rows: dict[str, dict] = {}
    for key, arm, question, a, b, test in plan_:
        if _declared(planned, runs, dataset, a, b):
            rows[key] = _test_row(runs, planned, dataset, arm, question, a, b, test, alpha, margin, metric)
    sel = {fam: best_lr(runs, planned, dataset, fam, metric) for fam in ("mohge", equal)}
    if all(len(s["arms"]) > 1 for s in sel.values()):
        for fam, s in sel.items():
            val = best_lr(runs, planned, dataset, fam, "val_ppl") if "val_ppl" in runs else {"best": None}
            rows[f"c-{fam}"] = _selection_row(s, fam, planned, dataset, metric, val)
        a, b = sel["mohge"]["best"] or "", sel[equal]["best"] or ""
        question = "Q1b at each family's best lr"
        note = f"lrs chosen on the {metric} split this test reads"
        rows["c"] = _test_row(
            runs, planned, dataset, "(c) learning rate", question, a, b, "less", alpha, margin, metric, note
        )
    _holm_family(rows, alpha)
    if {"a", "b", "c", "d"} <= set(rows):
        q1b = _test_row(runs, planned, dataset, "", "", "mohge", equal, "less", alpha, margin, metric)
        rows["verdict"] = restate_q1b(q1b, rows, metric)
    order = ["a", "a2", "b", "b'", "c-mohge", f"c-{equal}", "c", "d2", "d", "verdict"]
    return pd.DataFrame([rows[k] for k in order if k in rows], columns=CONTROL_COLUMNS)


def _holm_family(rows: dict[str, dict], alpha: float) -> None:
    """``p_holm`` (Holm within S8_FAMILY, the tests that ran) and ``decision_holm``, the row's decision read at the
    Holm p: a finding only where p_holm < alpha."""
    keys = [k for k in S8_FAMILY if k in rows]
    adjusted = holm([rows[k]["p"] for k in keys])
    m = sum(1 for k in keys if rows[k]["p"] == rows[k]["p"])
    for k, p in zip(keys, adjusted, strict=True):
        row = rows[k]
        row.update(p_holm=p, family=f"S8 paired tests: {m} tests")
        if p != p:
            row["decision_holm"] = row["decision"]
        elif row["test"] == "less":
            row["decision_holm"] = "A lower" if p < alpha else "A not shown lower"
        else:
            lower = row["ratio"] < 1
            row["decision_holm"] = ("A lower" if lower else "A higher") if p < alpha else "not separated"
    for row in rows.values():
        row.setdefault("p_holm", math.nan)
        row.setdefault("decision_holm", row["decision"])
        row.setdefault("family", "")


def _selection_row(sel: dict, family: str, planned: dict, dataset: str, metric: str, val: dict) -> dict:
    """(c)'s choice of one family's lr: the best arm (A), over how many seeds, the means in the note; the choice is
    made on ``metric`` (the split (c) then tests on), and the note says which arm val perplexity (``val``) picks."""
    row = {"arm": "(c) learning rate", "question": f"best lr: {family}", "metric": metric, "B": "", "test": "selection"}
    row.update(dict.fromkeys(COMPARE_COLUMNS, math.nan), power_at="", note=_lr_note(sel, metric))
    declared = set.intersection(*(set(planned.get((dataset, m), {})) for m in sel["arms"]))
    n, best = len(sel["seeds"]), sel["best"]
    row.update(A=best or "", n=n, status=_status(n if best else 0, max(len(declared), n)))
    row["decision"] = f"best: {best} (lr {sel['lr'][best]})" if best else NOT_RUN
    if best:
        row["note"] = f"chosen on {metric}, the split (c) tests on; " + row["note"]
        if val.get("best"):
            row["note"] += f"; val_ppl picks {val['best']} (lr {val['lr'][val['best']]})"
    return row


def restate_q1b(q1b: dict, rows: dict[str, dict], metric: str) -> dict:
    """The restatement rule of Q1b (docs/study.md) as a row: each condition met, not met or not run; the conditions
    on S8's tests read their Holm decisions (a finding only where the Holm p < alpha), Q1b its S2 decision."""
    conditions = {  # condition -> (its row, whether its decision meets it)
        "Q1b": (q1b, q1b["decision"] == "A lower"),
        "(a) MoHGE beats hom208": (rows["a"], rows["a"]["decision_holm"] == "A lower"),
        "(b) the lead survives the gate": (rows["b"], rows["b"]["decision_holm"] in ("not separated", "A higher")),
        "(c) Q1b at the best lrs": (rows["c"], rows["c"]["decision_holm"] == "A lower"),
        "(d) Q1b against noaux": (rows["d"], rows["d"]["decision_holm"] == "A lower"),
    }
    verdicts = {}
    for name, (row, met) in conditions.items():
        status = row["status"]
        verdicts[name] = ("met" if met else "not met") if status == "run" else status.split(" (")[0]
    helps = all(v == "met" for v in verdicts.values())
    arms = [v for k, v in verdicts.items() if k != "Q1b"]
    row = {"arm": "Q1b restated", "question": "heterogeneity helps?", "metric": metric, "A": "mohge", "B": ""}
    row.update(dict.fromkeys(COMPARE_COLUMNS, math.nan), test="rule", power_at="")
    row["status"] = "run" if all(v in ("met", "not met") for v in arms) else "partly run"
    row["status"] = NOT_RUN if all(v == NOT_RUN for v in arms) else row["status"]
    row["decision"] = "heterogeneity helps" if helps else "the package"
    row.update(decision_holm=row["decision"], p_holm=math.nan, family="")
    row["note"] = "; ".join(f"{k}: {v}" for k, v in verdicts.items())
    return row


# --------------------------------------------------------------------------------------------------------------
# S9: Q3's control and dose-response


def q3_models(planned: dict, graded: set[str]) -> list[tuple[str, str, float]]:
    """(dataset, model, alpha_G) of every MoHGE model planned on a graded dataset, by alpha_G."""
    out = []
    for (ds, model), seeds in planned.items():
        cfg = next(iter(seeds.values()))
        if ds in graded and cfg.family == "mohge":
            out.append((ds, model, float(cfg.loss.group_aux_coeff)))
    return sorted(out, key=lambda m: (m[0], m[2], m[1]))


def graded_datasets(planned: dict) -> set[str]:
    return {ds for (ds, _), seeds in planned.items() if next(iter(seeds.values())).data.get("source") == "graded"}


def _emh_by_seed(per: pd.DataFrame, ds: str, model: str) -> pd.Series:
    g = per[(per["dataset"] == ds) & (per["family"] == model)]
    wide = g.pivot_table(index="seed", columns="level", values="mean_width")
    if not {"easy", "hard"} <= set(wide.columns):
        return pd.Series(dtype=np.float64)
    return (wide["easy"] - wide["hard"]).dropna()


def q3_dose(per: pd.DataFrame, runs: pd.DataFrame, config: dict, planned: dict | None = None) -> pd.DataFrame:
    """S9_q3_dose (module docstring); ``per``: mean routed width per run and level (study.mean_width_by_level)."""
    a = AnalysisConfig.from_dict(config.get("analysis") or {}, "analysis")
    alpha, margin = a.alpha, a.equivalence_margin
    planned = planned_models(config) if planned is None else planned
    models = q3_models(planned, graded_datasets(planned))
    rows = []
    for ds, model, ag in models:
        control = next((m for d, m, a in models if d == ds and a == 0.0), None)
        r = runs[(runs["dataset"] == ds) & (runs["family"] == model)]
        row = dict.fromkeys(DOSE_COLUMNS, math.nan)
        row.update(dataset=ds, model=model, alpha_G=ag, n=len(r), control=control or "", n_pairs=0)
        seeds = planned[(ds, model)]
        cfg = next(iter(seeds.values()))
        row["omega_max"] = round(max(group_cost_weights(cfg.model.ffn, cfg.loss)), 4)  # the widest group's cost
        declared = len(seeds)
        row["status"] = "run" if len(r) >= declared else (f"partly run ({len(r)} of {declared})" if len(r) else NOT_RUN)
        if len(r):
            act = t_interval(r["activated_params"], alpha)
            row["activated_params"], row["activated_low"], row["activated_high"] = act
            row["test_ppl"], row["test_ppl_low"], row["test_ppl_high"] = t_interval(r["test_ppl"], alpha)
        emh = _emh_by_seed(per, ds, model)
        row["q3_decision"] = NOT_RUN
        if len(emh):
            row["easy_minus_hard"], row["emh_low"], row["emh_high"] = t_interval(emh, alpha)
            row["q3_decision"] = "easy tokens go to small groups" if row["emh_high"] < 0 else "not shown"
            row["q3_decision"] = "n < 2" if len(emh) < 2 else row["q3_decision"]
        row["steers"] = "" if ag == 0.0 else (NOT_RUN if control else "no alpha_G = 0 control declared")
        if ag != 0.0 and control is not None:
            row.update(_against_control(per, runs, ds, model, control, emh, alpha, margin))
        rows.append(row)
    table = pd.DataFrame(rows, columns=DOSE_COLUMNS)
    return _dose_holm(table, alpha)


def _dose_holm(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Holm within each dataset's arms against the alpha_G = 0 control, one family per test (easy - hard: evc_p;
    perplexity: prc_p); ``steers`` reads the Holm p of easy - hard (a finding only where it is below alpha)."""
    table["family"] = ""
    for ds, g in table.groupby("dataset", sort=False):
        for p, adj in (("evc_p", "evc_p_holm"), ("prc_p", "prc_p_holm")):
            table.loc[g.index, adj] = holm(g[p].to_numpy(dtype=np.float64))
        m = int(g["evc_p"].notna().sum())
        if m:
            family = f"S9 {ds}, each arm against the alpha_G = 0 control: {m} tests of evc_p, {m} of prc_p"
            table.loc[g.index[g["evc_p"].notna()], "family"] = family
    for i, r in table[table["n_pairs"] > 0].iterrows():
        if r["n_pairs"] < 2:
            table.loc[i, "steers"] = "n < 2"
        elif not r["evc_p_holm"] < alpha:
            table.loc[i, "steers"] = "no difference shown"
        elif r["emh_vs_control"] < 0:
            table.loc[i, "steers"] = "steers: easy - hard lower than at alpha_G = 0"
        else:
            table.loc[i, "steers"] = "differs: easy - hard higher than at alpha_G = 0"
    return table


def _against_control(per, runs, ds, model, control, emh, alpha, margin) -> dict:
    """The paired differences of one alpha_G > 0 model to the alpha_G = 0 control, seed by seed."""
    ctrl = _emh_by_seed(per, ds, control)
    d = (emh - ctrl).dropna()
    out: dict = {"n_pairs": len(d)}
    if not len(d):
        return out
    out["emh_vs_control"], out["evc_low"], out["evc_high"] = t_interval(d, alpha)
    out["evc_p"] = one_sample(d).p_h0_eq(0.0)
    if len(d) >= 2:  # in units of the sd (0 with no spread), searched up to 100 sd
        sd = sample_sd(d)
        out["evc_mde80"] = sd * detectable(lambda e: power_two_sided(len(d), sd, e * sd, alpha), hi=100.0)
    rr = runs[runs["dataset"] == ds]
    q = compare(paired_log_diffs(rr, "test_ppl", model, control), "two-sided", alpha, margin)
    out.update(ppl_ratio_vs_control=q["ratio"], prc_low=q["ci_low"], prc_high=q["ci_high"], prc_p=q["p"])
    out["prc_mde80_pct"] = q["mde80_pct"]
    act = paired_log_diffs(rr, "activated_params", model, control)
    if len(act):  # on the log scale, as a percentage: 100 (exp(mean log ratio) - 1)
        pct = [100 * math.expm1(v) if v == v else v for v in t_interval(act, alpha)]
        out["activated_vs_control_pct"], out["avc_low"], out["avc_high"] = pct
    return out


# --------------------------------------------------------------------------------------------------------------
# S10: the token-level Q3 record, over seeds


def _num(value) -> float:
    return math.nan if value is None else float(value)


def _ci(values: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """t_interval over the seeds whose value is defined."""
    values = np.asarray(values, dtype=np.float64)
    return t_interval(values[values == values], alpha)


def token_q3(
    results: Path, runs: pd.DataFrame, graded: set[str], alpha: float = 0.05, planned: dict | None = None
) -> pd.DataFrame:
    """S10_token_q3 (module docstring), from the ``token_q3`` block of each graded run's trace.json; a model that
    ``planned`` declares on a graded dataset and that has no run is listed as declared, not run."""
    declared = [{"dataset": ds, "family": m} for ds, m in (planned or {}) if ds in graded]
    have = set(zip(runs["dataset"], runs["family"], strict=True))
    extra = pd.DataFrame(
        [d for d in declared if (d["dataset"], d["family"]) not in have], columns=["dataset", "family"]
    )
    runs = pd.concat([runs, extra.assign(run=None)], ignore_index=True) if len(extra) else runs
    rows = []
    for (ds, model), g in runs[runs["dataset"].isin(graded)].groupby(["dataset", "family"], sort=True):
        g = g.dropna(subset=["run"])
        if not len(g):
            row = dict.fromkeys(TOKEN_COLUMNS, math.nan)
            rows.append({**row, "dataset": ds, "model": model, "n": 0, "n_token_record": 0, "status": NOT_RUN})
            continue
        recs = []
        for run in g["run"]:
            path = results / "runs" / str(run) / "trace.json"
            block = json.loads(path.read_text()).get("token_q3") if path.is_file() else None
            if block:
                recs.append(block)
        row = dict.fromkeys(TOKEN_COLUMNS, math.nan)
        row.update(dataset=ds, model=model, n=len(g), n_token_record=len(recs))
        if not recs:
            row.update(status="no token-level record (traced before it)", perm_p_below_alpha="")
            rows.append(row)
            continue
        row["status"] = "token-level record" if len(recs) == len(g) else f"partial: {len(recs)} of {len(g)} runs"
        rho = np.array([_num(r["answer"]["rho"]) for r in recs])
        null = np.array([_num(r["answer"]["null_mean"]) for r in recs])
        ps = np.array([_num(r["answer"]["p"]) for r in recs])
        row["rho_answer"], row["rho_answer_low"], row["rho_answer_high"] = _ci(rho, alpha)
        row["null_mean"] = _ci(null, alpha)[0]
        row["excess"], row["excess_low"], row["excess_high"] = _ci(rho - null, alpha)
        ok = ps[ps == ps]
        row["perm_p_fisher"] = fisher_combined_p(ok)
        row["perm_p_below_alpha"] = f"{int((ok < alpha).sum())} of {len(ok)}"
        rho_all = np.array([_num(r["all"]["rho"]) for r in recs])
        row["rho_all"], row["rho_all_low"], row["rho_all_high"] = _ci(rho_all, alpha)
        within = np.array([_num(r["within_token"]["easy_minus_hard"]) for r in recs])
        row["within_emh"], row["within_emh_low"], row["within_emh_high"] = _ci(within, alpha)
        row["token_ids"] = float(np.mean([r["within_token"]["n_ids"] for r in recs]))
        rows.append(row)
    table = pd.DataFrame(rows, columns=TOKEN_COLUMNS)
    for _, g in table.groupby("dataset", sort=False):  # one family: the arms of a dataset
        table.loc[g.index, "perm_p_fisher_holm"] = holm(g["perm_p_fisher"].to_numpy(dtype=np.float64))
    return table


# --------------------------------------------------------------------------------------------------------------
# S11: balance on trained routing without a loss


def _bias_row(goal: str, question: str, metric: str, a: str, b: str, test: str, declared: int) -> dict:
    row = {"goal": goal, "question": question, "metric": metric, "A": a, "B": b, "test": test, "note": ""}
    row.update(dict.fromkeys(["n", "estimate", "ci_low", "ci_high", "p", "mde80_pct"], math.nan))
    return {**row, "status": NOT_RUN, "decision": NOT_RUN, "met": "", "declared": declared}


def _bias_paired(row: dict, d: pd.Series, test: str, alpha: float, margin: float) -> dict:
    """The paired test's row; a non-inferiority test prints the interval it reads, the 90 % one (its upper end is
    the one-sided 95 % bound)."""
    if len(d):
        c = compare(d, test, alpha, margin)
        lo, hi = (c["ci90_low"], c["ci90_high"]) if test == "noninferiority" else (c["ci_low"], c["ci_high"])
        row.update(n=c["n"], estimate=c["ratio"], ci_low=lo, ci_high=hi, p=c["p"])
        row.update(decision=c["decision"], mde80_pct=c["mde80_pct"], status=_status(len(d), row["declared"]))
    return row


def _max_over_mean_by_seed(util: pd.DataFrame, runs: pd.DataFrame, model: str, ep: int) -> pd.Series:
    """The all-size max/mean at EP ``ep`` over every layer ("all") of each seed's trained routing (index: seed)."""
    u = util[(util["layer"].astype(str) == "all") & (util["strategy"] == "all_size") & (util["ep_size"] == ep)]
    seeds = runs[runs["family"] == model].set_index("run")["seed"]
    u = u[u["source"].isin(seeds.index)]
    return pd.Series(u["max_over_mean"].to_numpy(float), index=seeds[u["source"]].to_numpy())


def bias_balance(
    runs: pd.DataFrame, util: pd.DataFrame, unused: pd.DataFrame, config: dict, planned: dict | None = None
) -> pd.DataFrame:
    """S11_bias_balance (module docstring): the rows of every arm of :data:`BIAS_ARMS` the study config plans, on the
    dataset it plans them on; empty where it plans none. ``util``: utilization_summary.csv; ``unused``: S7
    (:func:`mohge_studies.claims.analysis.unused_experts`)."""
    a = AnalysisConfig.from_dict(config.get("analysis") or {}, "analysis")
    planned = planned_models(config) if planned is None else planned
    arms = [(ds, m) for ds, m in planned if m in BIAS_ARMS]
    if not arms:
        return pd.DataFrame(columns=BIAS_COLUMNS)
    rows: list[dict] = []
    for dataset, arm in sorted(arms, key=lambda k: list(BIAS_ARMS).index(k[1])):
        rows += _bias_arm(runs[runs["dataset"] == dataset], util, unused, dataset, arm, a, planned)
    _holm_over_group_arms(rows, a.alpha)
    return pd.DataFrame(rows, columns=BIAS_COLUMNS)


def _bias_arm(
    runs: pd.DataFrame, util: pd.DataFrame, unused: pd.DataFrame, dataset: str, arm: str, a, planned: dict
) -> list[dict]:
    """One arm's rows: balance by its goal, against the release recipe, unused experts (and groups), perplexity
    non-inferiority, S11's arm also against alpha_E 2e-1, and the arm's verdict."""
    _, release, loss_arm = BIAS_ARM
    ep, metric, alpha, goal = a.balance_ep, a.primary_metric, a.alpha, BIAS_ARMS[arm]
    seeds = {m: set(planned.get((dataset, m), {})) for m in (arm, release, loss_arm)}
    rows = []
    # balance: S3's measure over the arm's seeds, and paired by seed with the release recipe
    bal = _max_over_mean_by_seed(util, runs, arm, ep)
    row = _bias_row("balance", f"all-size max/mean at EP {ep}", "max_over_mean", arm, "", "goal", len(seeds[arm]))
    if len(bal):
        mean, lo, hi = ratio_interval(bal.to_numpy(), alpha)
        row.update(n=len(bal), estimate=mean, ci_low=lo, ci_high=hi, status=_status(len(bal), len(seeds[arm])))
        row["note"] = "as S3 (log-t interval)"
        if goal == "s11":
            row["decision"] = f"goal: mean <= {BIAS_GOAL}, upper end <= {BIAS_CEILING}"
            row["met"] = "met" if mean <= BIAS_GOAL and hi <= BIAS_CEILING else "not met"
        else:
            row["decision"] = f"Q2's bar: upper end < {a.balance_bar}"
            row["met"] = "met" if hi < a.balance_bar else "not met"
    rows.append(row)
    ref = _max_over_mean_by_seed(util, runs, release, ep)
    d = (np.log(bal) - np.log(ref)).dropna() if len(bal) and len(ref) else pd.Series(dtype=np.float64)
    row = _bias_row("", "max/mean against the release recipe", "max_over_mean", arm, release, "two-sided",
                    len(seeds[arm] & seeds[release]))  # fmt: skip
    rows.append(_bias_paired(row, d, "two-sided", alpha, 0.0))
    # unused experts: S7's count per layer, over the arm's seeds; groups beside them
    u = unused[(unused["dataset"] == dataset) & (unused["model"] == arm) & (unused["layer"].astype(str) != "all")]
    row = _bias_row("unused experts", "experts under 1 % of a uniform share", "unused", arm, "", "goal",
                    len(seeds[arm]))  # fmt: skip
    if len(u):
        n = int(u["n"].max())
        row.update(n=n, estimate=float(u["unused"].max()), status=_status(n, len(seeds[arm])))
        row.update(decision="goal: none in any layer of any seed", met="met" if (u["unused"] == 0).all() else "not met")
        row["note"] = "mean per layer: " + ", ".join(f"layer {r.layer}: {r.unused:.2f}" for r in u.itertuples())
        if "unused_groups" in u and u["unused_groups"].notna().any():
            row["note"] += "; groups under 1 % of an even share: " + ", ".join(
                f"layer {r.layer}: {r.unused_groups:.2f}" for r in u.itertuples()
            )
    rows.append(row)
    # perplexity: not worse than the release recipe by the margin; S11's arm against the loss that balances
    d = paired_log_diffs(runs, metric, arm, release)
    row = _bias_row("perplexity", "not worse than the release recipe", metric, arm, release, "noninferiority",
                    len(seeds[arm] & seeds[release]))  # fmt: skip
    row = _bias_paired(row, d, "noninferiority", alpha, BIAS_PPL_MARGIN)
    if len(d):
        row["met"] = "met" if row["p"] < alpha else "not met"
        row["note"] = f"H0: ratio >= {1 + BIAS_PPL_MARGIN:.2f}; 90 % interval, its upper end the one-sided 95 % bound"
    rows.append(row)
    if goal == "s11":
        d = paired_log_diffs(runs, metric, arm, loss_arm)
        row = _bias_row("", "against alpha_E 2e-1", metric, arm, loss_arm, "two-sided",
                        len(seeds[arm] & seeds[loss_arm]))  # fmt: skip
        rows.append(_bias_paired(row, d, "two-sided", alpha, BIAS_PPL_MARGIN))
    rows.append(_bias_verdict(rows, metric, arm))
    return rows


def _holm_over_group_arms(rows: list[dict], alpha: float) -> None:
    """The perplexity tests of the Q2-goal arms are one family: each is met on its Holm-adjusted p."""
    fam = [r for r in rows if r["goal"] == "perplexity" and BIAS_ARMS[r["A"]] == "q2" and r["p"] == r["p"]]
    if not fam:
        return
    for r, adjusted in zip(fam, holm([r["p"] for r in fam]), strict=True):
        r["met"] = "met" if adjusted < alpha else "not met"
        r["note"] += f"; Holm p over the group-bias arms {adjusted:.3g}"
    for v in (r for r in rows if r["goal"] == "verdict" and BIAS_ARMS[r["A"]] == "q2"):
        arm_rows = [r for r in rows if r["A"] == v["A"] and r["goal"] not in ("", "verdict")]
        v.update(_bias_verdict(arm_rows, v["metric"], v["A"]))


def _bias_verdict(rows: list[dict], metric: str, arm: str = BIAS_ARM[0]) -> dict:
    """An arm's declared family of three goals: the verdict only where each is met or not met on all its declared
    seeds (a goal read on some of them says how far it has run)."""
    goals = {r["goal"]: (r["met"] if r["status"] == "run" else "") or r["status"]
             for r in rows if r["goal"] and r["goal"] != "verdict"}  # fmt: skip
    groups = BIAS_ARMS.get(arm) == "q2"
    question = "every group kept alive, balanced, at no perplexity cost shown?" if groups else (
        "balance holds on trained routing without a loss?")  # fmt: skip
    row = _bias_row("verdict", question, metric, arm, "", "rule", 0)
    if all(v in ("met", "not met") for v in goals.values()):
        held = all(v == "met" for v in goals.values())
        row.update(status="run", met="met" if held else "not met")
        claim = "every group kept alive with balance and no perplexity cost shown" if groups else (
            "balance holds on trained routing without a loss")  # fmt: skip
        row["decision"] = claim if held else "not supported"
    row["note"] = "; ".join(f"{k}: {v}" for k, v in goals.items())
    return row
