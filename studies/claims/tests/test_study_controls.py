"""The arms declared after the claims study's results (mohge_studies.claims.controls): each declared test on synthetic
runs with known effects (direction, p against a direct scipy computation), "declared, not run" without the runs, the
restatement rule of Q1b on constructed cases, Q3's control and dose-response, and the token-level table."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mohge_studies.claims import controls
from scipy import stats

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def config() -> dict:
    """configs/config.yaml + studies/claims/config.yaml, merged as the workflow merges them."""
    from mohge_studies.config.runs import merge_config

    from mohge.config import load_yaml_or_json

    base, study = map(load_yaml_or_json, (ROOT / "configs" / "config.yaml", ROOT / "studies/claims/config.yaml"))
    return merge_config(base, study)


@pytest.fixture(scope="module")
def planned(config) -> dict:
    return controls.planned_models(config)


# perplexity factor of each Shakespeare model in the case where heterogeneity helps; seeds 0-7 (0-3 for the arms)
HELPS = {
    "mohge": 0.95, "moe_equal": 1.0, "mohge+hom208": 1.0, "mohge+renorm": 0.95, "moe_equal+probsgate": 1.0,
    "moe_equal+noaux": 1.0, "mohge+lr1p5e3": 0.97, "mohge+lr6e3": 0.99, "moe_equal+lr1p5e3": 1.03,
    "moe_equal+lr6e3": 0.99,
}  # fmt: skip


def _runs(factors: dict[str, float], planned: dict, seeds: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per planned seed of each model in ``factors`` (or the first ``seeds[model]`` seeds): ppl = 100 x a
    per-seed base shared by every model (the pairing) x the model's factor x a small noise of its own."""
    rng = np.random.default_rng(0)
    base = 1 + 0.05 * rng.normal(size=8)
    rows = []
    for model, factor in factors.items():
        for seed in sorted(planned[("shakespeare", model)])[: (seeds or {}).get(model, 8)]:
            ppl = 100 * base[seed] * factor * math.exp(0.004 * rng.normal())
            rows.append({"run": f"shakespeare-{model}-s{seed}", "dataset": "shakespeare", "family": model,
                         "seed": seed, "test_ppl": ppl, "val_ppl": ppl * 1.02, "activated_params": 1.0})  # fmt: skip
    return pd.DataFrame(rows)


def _by_question(table: pd.DataFrame) -> pd.DataFrame:
    return table.set_index("question")


def _scipy_p(runs: pd.DataFrame, a: str, b: str, alternative: str = "two-sided") -> float:
    wide = runs.pivot_table(index="seed", columns="family", values="test_ppl")[[a, b]].dropna()
    return float(stats.ttest_rel(np.log(wide[a]), np.log(wide[b]), alternative=alternative).pvalue)


def test_each_declared_test_has_its_direction_and_scipy_p(config, planned):
    runs = _runs(HELPS, planned)
    t = _by_question(controls.control_tests(runs, config, planned))
    assert list(t.index) == [
        "MoHGE vs hom208", "hom208 vs equal-parameter MoE", "MoHGE vs renorm", "probsgate vs equal-parameter MoE",
        "best lr: mohge", "best lr: moe_equal", "Q1b at each family's best lr", "noaux vs equal-parameter MoE",
        "Q1b against noaux", "heterogeneity helps?",
    ]  # fmt: skip
    for question, a, b, alt, decision in [
        ("MoHGE vs hom208", "mohge", "mohge+hom208", "two-sided", "A lower"),
        ("hom208 vs equal-parameter MoE", "mohge+hom208", "moe_equal", "two-sided", "not separated"),
        ("MoHGE vs renorm", "mohge", "mohge+renorm", "two-sided", "not separated"),
        ("probsgate vs equal-parameter MoE", "moe_equal+probsgate", "moe_equal", "two-sided", "not separated"),
        ("noaux vs equal-parameter MoE", "moe_equal+noaux", "moe_equal", "two-sided", "not separated"),
        ("Q1b against noaux", "mohge", "moe_equal+noaux", "less", "A lower"),
        ("Q1b at each family's best lr", "mohge", "moe_equal+lr6e3", "less", "A lower"),
    ]:
        r = t.loc[question]
        assert (r["A"], r["B"], r["decision"], r["status"], r["n"]) == (a, b, decision, "run", 4), question
        assert r["p"] == pytest.approx(_scipy_p(runs, a, b, alt)), question
        assert r["power"] == r["power"] and r["mde80_pct"] > 0  # the declared power, as in S2
    assert t.loc["MoHGE vs hom208", "ratio"] == pytest.approx(0.95, abs=0.01)
    # (c): the best lr of each family by mean test ppl over the seeds its three lr arms share
    assert t.loc["best lr: mohge", "A"] == "mohge" and t.loc["best lr: moe_equal", "A"] == "moe_equal+lr6e3"
    assert "lr 0.006" in t.loc["best lr: moe_equal", "decision"] and "seeds 0,1,2,3" in t.loc["best lr: mohge", "note"]
    verdict = t.loc["heterogeneity helps?"]
    assert verdict["decision"] == "heterogeneity helps" and verdict["status"] == "run"


@pytest.mark.parametrize(
    "change, failed",
    [
        ({"mohge+hom208": 0.93}, "(a) MoHGE beats hom208: not met"),  # equal widths do better at fixed router
        ({"mohge+renorm": 1.0}, "(b) the lead survives the gate: not met"),  # the softmax gate carries the lead
        ({"moe_equal+lr6e3": 0.93}, "(c) Q1b at the best lrs: not met"),  # an lr artefact
        ({"moe_equal+noaux": 0.93}, "(d) Q1b against noaux: not met"),  # the Switch loss made MoE-208 worse
    ],
)
def test_the_restatement_rule_stays_the_package_when_a_control_explains_the_lead(config, planned, change, failed):
    t = _by_question(controls.control_tests(_runs({**HELPS, **change}, planned), config, planned))
    verdict = t.loc["heterogeneity helps?"]
    assert verdict["decision"] == "the package" and failed in verdict["note"], verdict["note"]
    assert verdict["note"].count("not met") == 1


def test_declared_tests_without_runs_are_listed_without_numbers(config, planned):
    runs = _runs({"mohge": 0.95, "moe_equal": 1.0}, planned)  # the committed study: no arm has run
    t = _by_question(controls.control_tests(runs, config, planned))
    arms = t.drop(index="heterogeneity helps?")
    assert (arms["status"] == "declared, not run").all() and (arms["decision"] == "declared, not run").all()
    assert arms[["ratio", "ci_low", "ci_high", "p", "power", "mde80_pct"]].isna().all().all()
    verdict = t.loc["heterogeneity helps?"]
    assert verdict["decision"] == "the package" and verdict["status"] == "declared, not run"
    assert "Q1b: met" in verdict["note"] and verdict["note"].count("declared, not run") == 4
    # half of one arm: its tests report the pairs that ran, and the verdict waits for the rest
    part = _by_question(controls.control_tests(_runs({**HELPS}, planned, {"mohge+hom208": 2}), config, planned))
    assert (
        part.loc["MoHGE vs hom208", "status"] == "partly run (2 of 4 pairs)" and part.loc["MoHGE vs hom208", "n"] == 2
    )
    assert part.loc["heterogeneity helps?", "status"] == "partly run"
    assert part.loc["heterogeneity helps?", "decision"] == "the package"


def test_a_study_without_the_arms_declares_none():
    from mohge.config import load_yaml_or_json

    config = load_yaml_or_json(ROOT / "configs" / "config.yaml")
    runs = pd.DataFrame(columns=["run", "dataset", "family", "seed", "test_ppl", "activated_params"])
    t = controls.control_tests(runs, config)
    assert t.empty and list(t.columns) == controls.CONTROL_COLUMNS


# ---- Q3: control and dose


def _graded(emh: dict[str, list[float]], planned: dict, act: dict[str, float] | None = None):
    """Per-level widths and runs of graded models: easy - hard per seed as given, hard at 200."""
    per, runs = [], []
    for model, values in emh.items():
        for seed, v in enumerate(values):
            run = f"graded-{model}-s{seed}"
            for level, w in (("easy", 200 + v), ("medium", 210.0), ("hard", 200.0)):
                per.append({"run": run, "dataset": "graded", "family": model, "seed": seed, "level": level,
                            "slots": 10, "mean_width": w})  # fmt: skip
            ppl = 6.7 * (1 + 0.01 * seed) * (1.0 if model.endswith("ag0") else 1.03 + 0.002 * (seed - 1))
            runs.append({"run": run, "dataset": "graded", "family": model, "seed": seed, "test_ppl": ppl,
                         "activated_params": (act or {}).get(model, 1.8e6) * (1 + 0.001 * seed)})  # fmt: skip
    return pd.DataFrame(per), pd.DataFrame(runs)


def test_q3_dose_tests_each_alpha_against_the_control(config, planned):
    emh = {
        "mohge+ag0": [1.0, -0.5, 0.4],
        "mohge+ag1e5": [1.5, 0.0, 0.1],  # as the control
        "mohge+ag1e1": [-12.0, -9.5, -11.0],  # easy 10 units narrower than at alpha_G = 0
    }
    per, runs = _graded(emh, planned, {"mohge+ag1e1": 1.6e6})
    t = controls.q3_dose(per, runs, config, planned).set_index("model")
    assert list(t.index) == [f"mohge+ag{v}" for v in ("0", "1e5", "1e4", "1e3", "1e2", "1e1", "1", "1rel", "10")]
    assert t["alpha_G"].tolist() == [0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1.0, 10.0]
    # the release's cost weights at widths 96..320 (interval 1024) against the ones spanning the widths (96)
    assert t.loc["mohge+ag1", "omega_max"] == 1.2188 and t.loc["mohge+ag1rel", "omega_max"] == 3.3333
    strong, weak = t.loc["mohge+ag1e1"], t.loc["mohge+ag1e5"]
    assert strong["q3_decision"] == "easy tokens go to small groups" and weak["q3_decision"] == "not shown"
    assert strong["steers"].startswith("steers") and weak["steers"] == "no difference shown"
    d = np.array(emh["mohge+ag1e1"]) - np.array(emh["mohge+ag0"])
    assert strong["emh_vs_control"] == pytest.approx(d.mean()) and strong["n_pairs"] == 3
    assert strong["evc_p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue) and strong["evc_mde80"] > 0
    assert strong["ppl_ratio_vs_control"] == pytest.approx(1.03, abs=1e-4) and strong["activated_vs_control_pct"] < -10
    assert t.loc["mohge+ag1e2", "status"] == "declared, not run" and math.isnan(t.loc["mohge+ag1e2", "test_ppl"])
    assert t.loc["mohge+ag0", "steers"] == "" and t.loc["mohge+ag1e4", "steers"] == "declared, not run"
    # the committed study: no control has run, so no difference can be taken
    per, runs = _graded({"mohge+ag1e5": emh["mohge+ag1e5"]}, planned)
    t = controls.q3_dose(per, runs, config, planned).set_index("model")
    assert t.loc["mohge+ag0", "status"] == "declared, not run" and t.loc["mohge+ag1e5", "steers"] == "declared, not run"
    assert t.loc["mohge+ag1e5", "n"] == 3 and math.isnan(t.loc["mohge+ag1e5", "emh_vs_control"])


# ---- the token-level table


def _block(rho: float, null: float, p: float, within: float) -> dict:
    return {"answer": {"rho": rho, "null_mean": null, "p": p}, "all": {"rho": rho / 2},
            "within_token": {"easy_minus_hard": within, "n_ids": 5}}  # fmt: skip


def test_token_table_reads_each_trace_and_says_which_have_no_record(tmp_path, planned):
    rows = []
    blocks = {0: _block(0.30, 0.10, 0.005, -2.0), 1: _block(0.25, 0.05, 0.01, -1.0), 2: None}
    for seed, block in blocks.items():
        run = f"graded-mohge+ag1e3-s{seed}"
        (tmp_path / "runs" / run).mkdir(parents=True)
        trace = {"model": run, "layers": []} | ({"token_q3": block} if block else {})
        (tmp_path / "runs" / run / "trace.json").write_text(json.dumps(trace))
        rows.append({"run": run, "dataset": "graded", "family": "mohge+ag1e3", "seed": seed})
    rows.append({"run": "graded-mohge+ag1e4-s0", "dataset": "graded", "family": "mohge+ag1e4", "seed": 0})
    t = controls.token_q3(tmp_path, pd.DataFrame(rows), {"graded"}, planned=planned).set_index("model")
    r = t.loc["mohge+ag1e3"]
    assert r["status"] == "partial: 2 of 3 runs" and r["n_token_record"] == 2
    assert r["rho_answer"] == pytest.approx(0.275) and r["excess"] == pytest.approx(0.2)
    assert r["perm_p_fisher"] == pytest.approx(stats.combine_pvalues([0.005, 0.01], method="fisher").pvalue)
    assert r["perm_p_below_alpha"] == "2 of 2" and r["within_emh"] == pytest.approx(-1.5)
    assert t.loc["mohge+ag1e4", "status"].startswith("no token-level record")
    assert t.loc["mohge+ag0", "status"] == "declared, not run"


def test_the_committed_claims_tables_are_what_the_analysis_makes(tmp_path, config):
    """run_analysis on the committed results/claims CSVs: every committed csv/md table byte for byte; every
    declared arm has run in the committed study, so each row of S8 and S9 says so, and S10 has every graded run."""
    from mohge_studies.claims import analysis as study

    committed = ROOT / "results" / "claims" / "study"
    study.run_analysis(ROOT / "results" / "claims", config, tmp_path)
    for path in sorted(committed.glob("S*.csv")) + sorted(committed.glob("S*.md")):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name
    s8 = pd.read_csv(tmp_path / "S8_controls.csv")
    assert len(s8) == 10 and (s8["status"] == "run").all(), s8["status"].tolist()
    s9 = pd.read_csv(tmp_path / "S9_q3_dose.csv").set_index("model")
    assert s9.loc["mohge+ag1e4", "status"] == "run" and s9.loc["mohge+ag0", "status"] == "run"
    s10 = pd.read_csv(tmp_path / "S10_token_q3.csv").set_index("model")
    # every graded run, the first study's regenerated ones included, carries its token-level record
    assert (s10["status"] == "token-level record").all(), s10["status"].to_dict()


# ---- S11: balance on trained routing without a loss


def _bias_inputs(planned: dict, balance: dict[str, list[float]], unused_per_layer: list[float], ppl: dict):
    """runs (paired perplexities), utilization rows (all-size at EP 4 per seed) and S7 rows of the bias arm."""
    runs = _runs(ppl, planned)
    util = [
        {"source": f"shakespeare-{m}-s{s}", "layer": "all", "strategy": "all_size", "ep_size": 4, "max_over_mean": v}
        for m, values in balance.items()
        for s, v in enumerate(values)
    ] + [{"source": "shakespeare-mohge-s0", "layer": "all", "strategy": "contiguous", "ep_size": 4, "max_over_mean": 9}]
    arms = [m for m in balance if m != "mohge"] or ["mohge+biasfree"]
    unused = pd.DataFrame(
        [
            {"dataset": "shakespeare", "model": m, "layer": str(i), "n": 4, "num_experts": 32, "unused": u}
            for m in arms
            for i, u in enumerate(unused_per_layer)
        ]
    )
    return runs, pd.DataFrame(util), unused


BIAS_PPL = {"mohge": 1.0, "mohge+biasfree": 1.0, "mohge+ae2e1": 1.01}


def test_bias_arm_goals_read_their_declared_rules_and_scipy_ps(config, planned):
    balance = {"mohge+biasfree": [1.05, 1.07, 1.06, 1.08], "mohge": [1.30, 1.35, 1.28, 1.33]}
    runs, util, unused = _bias_inputs(planned, balance, [0, 0, 0], BIAS_PPL)
    t = controls.bias_balance(runs, util, unused, config, planned).query("A == 'mohge+biasfree'").set_index("question")
    bal = t.loc["all-size max/mean at EP 4"]
    x = np.log(balance["mohge+biasfree"])
    half = stats.t.ppf(0.975, 3) * x.std(ddof=1) / 2
    assert bal["estimate"] == pytest.approx(math.exp(x.mean()))
    assert bal["ci_high"] == pytest.approx(math.exp(x.mean() + half)) and bal["met"] == "met"
    vs = t.loc["max/mean against the release recipe"]
    p = stats.ttest_rel(x, np.log(balance["mohge"])).pvalue
    assert vs["p"] == pytest.approx(p) and vs["decision"] == "A lower"
    assert t.loc["experts under 1 % of a uniform share", "met"] == "met"
    ni = t.loc["not worse than the release recipe"]
    wide = runs.pivot_table(index="seed", columns="family", values="test_ppl")[["mohge+biasfree", "mohge"]].dropna()
    d = np.log(wide["mohge+biasfree"]) - np.log(wide["mohge"]) - math.log(1.02)
    assert ni["p"] == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="less").pvalue) and ni["met"] == "met"
    upper = math.exp(d.mean() + math.log(1.02) + stats.t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    assert ni["ci_high"] == pytest.approx(upper)  # the interval the test reads: its upper end the one-sided bound
    assert t.loc["against alpha_E 2e-1", "p"] == pytest.approx(_scipy_p(runs, "mohge+biasfree", "mohge+ae2e1"))
    verdict = t.loc["balance holds on trained routing without a loss?"]
    assert verdict["decision"] == "balance holds on trained routing without a loss" and verdict["met"] == "met"


@pytest.mark.parametrize(
    ("balance", "unused", "ppl", "failed"),
    [
        ([1.12, 1.13, 1.11, 1.12], [0, 0, 0], 1.0, "balance: not met"),
        ([1.05, 1.07, 1.06, 1.08], [0, 6.5, 4.0], 1.0, "unused experts: not met"),
        ([1.05, 1.07, 1.06, 1.08], [0, 0, 0], 1.03, "perplexity: not met"),
    ],
)
def test_bias_arm_verdict_is_not_supported_when_one_goal_fails(config, planned, balance, unused, ppl, failed):
    runs, util, s7 = _bias_inputs(planned, {"mohge+biasfree": balance}, unused, {**BIAS_PPL, "mohge+biasfree": ppl})
    t = controls.bias_balance(runs, util, s7, config, planned).query("A == 'mohge+biasfree'").set_index("question")
    verdict = t.loc["balance holds on trained routing without a loss?"]
    assert verdict["decision"] == "not supported" and failed in verdict["note"]
    assert verdict["note"].count(": met") == 2


def test_bias_arm_without_runs_is_declared_not_run_and_absent_where_not_planned(config, planned):
    empty = pd.DataFrame(columns=["source", "layer", "strategy", "ep_size", "max_over_mean"])
    runs = _runs({"mohge": 1.0}, planned)
    t = controls.bias_balance(runs, empty, pd.DataFrame(columns=["dataset", "model", "layer"]), config, planned)
    assert (t["status"] == "declared, not run").all() and t[["estimate", "p"]].isna().all().all()
    from mohge.config import load_yaml_or_json

    none = controls.bias_balance(runs, empty, empty, load_yaml_or_json(ROOT / "configs" / "config.yaml"))
    assert none.empty and list(none.columns) == controls.BIAS_COLUMNS


def test_group_bias_arms_read_q2s_bar_and_holm_over_their_two_perplexity_tests(config, planned):
    """docs/study.md, "Every group kept alive": balance is met only with the interval's upper end below Q2's bar
    (1.10), a looser goal than S11's is not used; the two arms' perplexity tests are met on their Holm p."""
    arms = ("mohge+groupbias", "mohge+biasfree_groups")
    balance = {"mohge+groupbias": [1.05, 1.07, 1.06, 1.08], "mohge+biasfree_groups": [1.08, 1.12, 1.05, 1.11],
               "mohge": [1.30, 1.35, 1.28, 1.33]}  # fmt: skip
    ppl = {**BIAS_PPL, "mohge+groupbias": 1.0, "mohge+biasfree_groups": 1.0}
    runs, util, unused = _bias_inputs(planned, balance, [0, 0, 0], ppl)
    t = controls.bias_balance(runs, util, unused, config, planned)
    bal = t[t["goal"] == "balance"].set_index("A")
    assert bal.loc["mohge+groupbias", "ci_high"] < 1.10 and bal.loc["mohge+groupbias", "met"] == "met"
    wide = bal.loc["mohge+biasfree_groups"]  # mean 1.09 <= 1.10 and upper end <= 1.20: S11's goal would be met
    assert wide["estimate"] <= 1.10 and 1.10 <= wide["ci_high"] <= 1.20 and wide["met"] == "not met"
    ni = t[t["goal"] == "perplexity"].set_index("A")
    ps = [ni.loc[a, "p"] for a in arms]
    adjusted = sorted(ps)[0] * 2, max(sorted(ps)[0] * 2, sorted(ps)[1])
    for a, p in zip(arms, ps, strict=True):
        holm = adjusted[0] if p == min(ps) else adjusted[1]
        assert f"Holm p over the group-bias arms {min(holm, 1.0):.3g}" in ni.loc[a, "note"]
    verdicts = t[t["goal"] == "verdict"].set_index("A")
    assert verdicts.loc["mohge+biasfree_groups", "decision"] == "not supported"
    assert "balance: not met" in verdicts.loc["mohge+biasfree_groups", "note"]
