"""The claims study's analysis (mohge_studies.claims.analysis): paired tests on known data, balance and difficulty
summaries."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mohge_studies.analysis.verdicts import prose
from mohge_studies.claims import analysis as study

from mohge.core import stats


def _runs(ppl: dict[str, list[float]], dataset: str = "shakespeare") -> pd.DataFrame:
    rows = []
    for fam, values in ppl.items():
        for seed, v in enumerate(values):
            rows.append(
                {
                    "run": f"{dataset}-{fam}-s{seed}",
                    "dataset": dataset,
                    "family": fam,
                    "seed": seed,
                    "test_ppl": v,
                    "val_ppl": v * 1.05,
                    "total_params": 1,
                    "activated_params": 1.0,
                    "activated_params_uniform": 1,
                    "routed_params": {"moe+w160": 160, "moe_equal": 208, "moe": 256}.get(fam, 0),
                }
            )
    return pd.DataFrame(rows)


def test_pairing_is_by_seed_and_on_log_scale():
    runs = _runs({"mohge": [90.0, 100.0, 80.0], "moe": [100.0, 100.0, 100.0]}).sample(frac=1, random_state=0)
    d = study.paired_log_diffs(runs, "test_ppl", "mohge", "moe")
    assert d.to_dict() == pytest.approx({0: math.log(0.9), 1: 0.0, 2: math.log(0.8)})


def test_tost_shows_equivalence_only_inside_the_margin():
    base = np.array([100.0, 95, 105, 98, 102, 97, 103, 99])
    tight = _runs({"mohge": list(base * np.array([1.001, 0.999] * 4)), "moe": list(base)})
    shifted = _runs({"mohge": list(base * 1.05), "moe": list(base)})
    ok = stats.compare(study.paired_log_diffs(tight, "test_ppl", "mohge", "moe"), "tost", 0.05, 0.03)
    bad = stats.compare(study.paired_log_diffs(shifted, "test_ppl", "mohge", "moe"), "tost", 0.05, 0.03)
    assert ok["p"] < 0.05 and ok["decision"].startswith("equivalent")
    assert bad["p"] > 0.5 and bad["decision"] == "equivalence not shown"
    assert bad["ratio"] == pytest.approx(1.05)


def test_one_sided_test_has_a_direction():
    lower = _runs({"mohge": [90.0, 91, 89, 90.5], "moe_equal": [100.0, 100, 99, 101]})
    d = study.paired_log_diffs(lower, "test_ppl", "mohge", "moe_equal")
    assert stats.compare(d, "less", 0.05)["decision"] == "A lower"
    assert stats.compare(-d, "less", 0.05)["decision"] == "A not shown lower"


def test_quality_tests_plan_the_declared_comparisons_and_the_width_sweep():
    runs = _runs(
        {
            "mohge": [90, 92, 91],
            "moe": [91, 93, 92],
            "moe_equal": [95, 96, 94],
            "moe+w160": [99, 98, 97],
            "dense": [90, 90, 90],
        }
    )
    table = study.quality_tests(runs, {"alpha": 0.05, "equivalence_margin": 0.03, "primary_metric": "test_ppl"})
    primary = table[table["metric"] == "test_ppl"]
    assert list(primary["question"]) == [
        "Q1 parity",
        "Q1 non-inferiority",
        "Q1 difference",
        "Q1b MoHGE package",
        "sensitivity",
        "sensitivity",
        "dense vs MoHGE",
        "dense vs reference MoE",
        "dense vs equal-parameter MoE",
    ]
    assert list(zip(primary["A"], primary["B"], strict=True))[4:6] == [("moe+w160", "moe_equal"), ("moe_equal", "moe")]
    # the tests added after the results are marked as such; the pre-declared ones keep their place
    roles = dict(zip(primary["question"], primary["role"], strict=False))
    assert roles["Q1 parity"] == "pre-declared" and roles["Q1 non-inferiority"] == study.POST_HOC
    assert primary[["power", "mde80_pct", "sd"]].notna().all().all()
    assert set(table["metric"]) == {"test_ppl", "val_ppl"}


def test_non_inferiority_is_the_upper_tost_leg():
    base = np.array([100.0, 95, 105, 98, 102, 97, 103, 99])
    better = _runs({"mohge": list(base * np.array([0.94, 0.96] * 4)), "moe": list(base)})
    d = study.paired_log_diffs(better, "test_ppl", "mohge", "moe")
    tost, ni = stats.compare(d, "tost", 0.05, 0.03), stats.compare(d, "noninferiority", 0.05, 0.03)
    assert tost["decision"] == "equivalence not shown" and ni["decision"].startswith("non-inferior")
    assert ni["p"] == pytest.approx(tost["p_upper"]) and tost["p"] == pytest.approx(tost["p_lower"])
    assert tost["ci_low"] < tost["ci90_low"] < tost["ratio"] < tost["ci90_high"] < tost["ci_high"]
    worse = stats.compare(-d, "noninferiority", 0.05, 0.03)
    assert worse["decision"] == "non-inferiority not shown"
    assert stats.compare(d, "two-sided", 0.05)["decision"] == "A lower"


def test_ratio_interval_stays_at_or_above_one():
    values = [1.0, 1.02, 1.30]
    gmean, lo, hi = study.ratio_interval(values)
    m, tlo, thi = stats.t_interval(np.log(values))
    assert gmean == pytest.approx(math.exp(m)) and hi == pytest.approx(math.exp(thi))
    assert math.exp(tlo) < 1 and lo == 1.0  # the t interval of the logs reaches below 1: truncated
    g2, lo2, hi2 = study.ratio_interval([1.5, 1.6, 1.7])
    assert 1 < lo2 < g2 < hi2 and lo2 == pytest.approx(math.exp(stats.t_interval(np.log([1.5, 1.6, 1.7]))[1]))
    assert study.ratio_interval([1.0, 1.0]) == (1.0, 1.0, 1.0)


def test_balance_decision_needs_both_conditions():
    rows = []
    for model, a, c in (("ok", (1.02, 1.0, 1.05), (1.3, 1.2, 1.4)), ("wide", (1.1, 1.0, 1.2), (1.5, 1.3, 1.6))):
        for strategy, (m, lo, hi) in (("all_size", a), ("contiguous", c)):
            rows.append(
                {"dataset": "d", "model": model, "trace": "trained", "strategy": strategy, "ep_size": 4, "n": 3,
                 "max_over_mean": m, "ci_low": lo, "ci_high": hi}
            )  # fmt: skip
    s3 = pd.DataFrame(rows)
    dec = study.balance_decision(pd.concat([s3, s3.assign(ep_size=8)]), "d", ep=4, bar=1.10).set_index("model")
    assert len(dec) == 2 and dec.loc["ok", "decision"] == "all-size balances"
    assert dec.loc["wide", "decision"] == "bar not met" and dec.loc["wide", "below_contiguous"]


def test_unused_experts_counts_below_one_percent_of_uniform(tmp_path):
    import json

    counts = [[1000, 1000, 5, 0], [1000, 990, 1000, 1000]]  # uniform share 501.25 / 997.5: 2 and 0 unused
    for seed in (0, 1):
        trace = {
            "model": f"m{seed}", "d_model": 8, "expert_widths": [16, 32], "num_experts": 4, "experts_per_group": 2,
            "family": "mohge", "split": "test", "tokens": 10, "topk": 1,
            "layers": [{"layer": i, "counts": c} for i, c in enumerate(counts)],
        }  # fmt: skip
        (tmp_path / "runs" / f"g-mohge-s{seed}").mkdir(parents=True)
        (tmp_path / "runs" / f"g-mohge-s{seed}" / "trace.json").write_text(json.dumps(trace))
    runs = pd.DataFrame({"run": ["g-mohge-s0", "g-mohge-s1"], "dataset": "g", "family": "mohge"})
    u = study.unused_experts(tmp_path, runs).set_index("layer")
    assert u.loc["0", "unused"] == 2 and u.loc["1", "unused"] == 0 and u.loc["all", "unused"] == 1
    assert u.loc["0", "n"] == 2 and u.loc["0", "unused_low"] == 2  # equal over seeds: a point interval


def test_balance_summarises_over_seeds_per_model():
    runs = _runs({"mohge": [1, 1, 1]})
    util = pd.DataFrame(
        [
            {
                "source": f"shakespeare-mohge-s{s}",
                "strategy": "all_size",
                "ep_size": 8,
                "layer": layer,
                "max_over_mean": v,
            }
            for s, v in enumerate([1.2, 1.4, 1.6])
            for layer in ("all", "0")
        ]
    )
    b = study.balance(util, runs)
    gmean = math.exp(np.mean(np.log([1.2, 1.4, 1.6])))  # the geometric mean, its interval on the log scale
    assert len(b) == 1 and b.loc[0, "n"] == 3 and b.loc[0, "max_over_mean"] == pytest.approx(gmean)
    assert b.loc[0, "arith_mean"] == pytest.approx(1.4) and 1.0 <= b.loc[0, "ci_low"] < gmean < b.loc[0, "ci_high"]


def test_mean_width_by_level_weights_widths_by_slots():
    ident = {"run": "r", "dataset": "g", "family": "mohge", "seed": 0, "level": "easy"}
    groups = pd.DataFrame(
        [
            {**ident, "layer": "all", "width": 100, "slots": 3},
            {**ident, "layer": "all", "width": 200, "slots": 1},
            {**ident, "layer": "0", "width": 900, "slots": 50},  # one layer: not part of the mean over all
        ]
    )
    per = study.mean_width_by_level(groups)
    assert per["mean_width"].tolist() == [pytest.approx(125.0)]


def test_reportable_tasks_leave_chance_and_ceiling():
    runs = _runs({"mohge": [1, 1]})
    runs["task:mohge_cloze:acc"] = [0.6, 0.62]
    runs["task:mohge_hellaswag:acc_norm"] = [0.25, 0.24]
    runs["task:mohge_graded_medium:acc"] = [1.0, 1.0]
    why = study.reportable_tasks(runs, {"mohge_cloze": 200, "mohge_hellaswag": 200, "mohge_graded_medium": 200})
    assert why["mohge_cloze"].startswith("reported")
    assert "chance" in why["mohge_hellaswag"] and why["mohge_hellaswag"].startswith("not")
    assert "ceiling" in why["mohge_graded_medium"]


def test_even_within_groups_keeps_group_totals_and_evens_experts():
    from mohge.evaluate.traces import Trace, TraceLayer

    trace = Trace("m", 8, [16, 32], 6, 3, [TraceLayer(0, [10, 0, 0, 1, 2, 4])])
    even = study.even_within_groups(trace)
    assert even.layers[0].counts == [4, 3, 3, 3, 2, 2]
    assert trace.layers[0].counts == [10, 0, 0, 1, 2, 4]  # the input is not changed


def test_task_table_reports_only_tasks_off_chance_and_ceiling():
    runs = _runs({"mohge": [90.0, 91.0], "moe": [92.0, 93.0]})
    runs["task:mohge_cloze:acc"] = [0.6, 0.62, 0.58, 0.6]
    runs["task:mohge_cloze:n_samples"] = 200
    runs["task:mohge_graded_medium:acc"] = 1.0
    runs["task:mohge_graded_medium:n_samples"] = 200
    t = study.task_table(runs)
    cloze = t[t["task"] == "mohge_cloze"]
    assert set(cloze["model"]) == {"mohge", "moe"} and cloze["reported"].str.startswith("reported").all()
    assert cloze.set_index("model").loc["mohge", "mean"] == pytest.approx(0.61)
    assert t[t["task"] == "mohge_graded_medium"]["reported"].str.contains("ceiling").all()


def test_run_analysis_on_the_committed_default_results(tmp_path, capsys):
    """`mohge study` on the committed default results: its tables, and one line that says what it wrote."""
    root = Path(__file__).resolve().parents[3]
    results, config = root / "results" / "default", root / "configs" / "config.yaml"
    assert study.main(["--results", str(results), "--config", str(config), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"11 tables (S1_models ... S11_bias_balance) of {results} written to {tmp_path} (csv, md, html)"
    ]
    s1 = pd.read_csv(tmp_path / "S1_models.csv")
    assert s1.set_index(["dataset", "model"]).loc[("shakespeare", "mohge"), "n"] == 3
    s3 = pd.read_csv(tmp_path / "S3_balance.csv")
    assert set(s3["trace"]) == {"trained", "even_within_groups"}
    even = s3[(s3["trace"] == "even_within_groups") & (s3["model"] == "mohge") & (s3["strategy"] == "all_size")]
    trained = s3[(s3["trace"] == "trained") & (s3["model"] == "mohge") & (s3["strategy"] == "all_size")]
    # on the committed traces, the allocation's own premise (groups even inside) is never worse than trained routing
    assert (
        even.set_index(["dataset", "ep_size"])["max_over_mean"]
        <= trained.set_index(["dataset", "ep_size"])["max_over_mean"] + 1e-9
    ).all()
    assert {"S2_tests.md", "S4_difficulty.csv", "S5_tasks.csv"} <= {p.name for p in tmp_path.iterdir()}


ROOT = Path(__file__).resolve().parents[3]


def test_docs_agree_with_the_committed_claims_tables():
    """The sentences of docs/results.md ("The claims study") and docs/study.md that carry S2, S6-S9 numbers,
    formatted here from the committed tables: a change to a table that leaves the prose behind fails."""
    tables, text = ROOT / "results" / "claims" / "study", prose()
    s2 = pd.read_csv(tables / "S2_tests.csv").query("metric == 'test_ppl'").set_index("question")
    q1, ni, diff = s2.loc["Q1 parity"], s2.loc["Q1 non-inferiority"], s2.loc["Q1 difference"]
    dense_ref, dense_equal = s2.loc["dense vs reference MoE"], s2.loc["dense vs equal-parameter MoE"]
    expect = [
        f"{q1['ratio']:.3f} [{q1['ci_low']:.3f}, {q1['ci_high']:.3f}]",
        f"[{q1['ci90_low']:.3f}, {q1['ci90_high']:.3f}]",
        f"p = {q1['p']:.2f}",
        f"p = {diff['p']:.3f}",
        f"{round(100 * q1['power'])} %",
        f"{round(100 * ni['power'])} %",
        f"dense / MoE-256 {dense_ref['ratio']:.3f} [{dense_ref['ci_low']:.3f}, {dense_ref['ci_high']:.3f}], "
        f"p = {dense_ref['p']:.3f}",
        f"dense / MoE-208 {dense_equal['ratio']:.3f} [{dense_equal['ci_low']:.3f}, {dense_equal['ci_high']:.3f}], "
        f"p = {dense_equal['p']:.3f}",
    ]
    for question, a in (("Q1b MoHGE package", "moe_equal"), ("sensitivity", "moe_equal"), ("dense vs MoHGE", "dense")):
        r = s2[(s2.index == question) & (s2["A"] == a)].iloc[0] if question == "sensitivity" else s2.loc[question]
        expect.append(f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
    assert ni["p"] < 0.001 and "p < 0.001" in text and ni["p_holm"] < 0.001 and "Holm p < 0.001" in text
    # the gate: MoE-208 and MoE-256 not separated, so every Q1 row is not decidable, whichever way its test went
    assert (s2[s2.index.str.startswith("Q1 ")]["decision"] == "not decidable (gate)").all()
    q1b = s2.loc["Q1b MoHGE package"]
    expect.append(f"Holm p = {q1b['p_holm']:.3f} over S2's {int(q1b['family'].rsplit(': ', 1)[1].split()[0])}")
    expect.append(f"p = {diff['p']:.3f}, Holm p = {diff['p_holm']:.3f}")
    for r in (dense_ref, dense_equal):
        expect.append(f"p = {r['p']:.3f}, Holm p = {r['p_holm']:.3f}")
    s6 = pd.read_csv(tables / "S6_balance_decision.csv").query("trace == 'trained'").set_index("model")
    for model in ("mohge", "mohge+ae2e1"):
        r = s6.loc[model]
        expect.append(f"{r['all_size']:.2f} [{r['all_size_low']:.2f}, {r['all_size_high']:.2f}]")
        expect.append(f"{r['contiguous']:.2f} [{r['contiguous_low']:.2f}, {r['contiguous_high']:.2f}]")
        assert r["decision"] == "bar not met"  # "meets the pre-declared bar at no α_E"
    s7 = pd.read_csv(tables / "S7_unused_experts.csv")
    mohge = s7[s7["model"] == "mohge"].set_index("layer")["unused"]
    expect.append(f"{mohge['all']:.1f} of")
    expect.append(" / ".join(f"{mohge[k]:.1f}" for k in sorted(set(mohge.index) - {"all"})))
    strong = s7[(s7["model"] == "mohge+ae2e1") & (s7["layer"] == "all")]["unused"].iloc[0]
    expect.append(f"cuts it to {strong:.1f}")
    # the control arms (S8): every paired test that ran, its ratio, interval, p and 80 % MDE; the verdict
    s8 = pd.read_csv(tables / "S8_controls.csv")
    ran = s8[s8["test"].isin(["two-sided", "less"]) & s8["ratio"].notna()]
    for r in ran.itertuples():
        expect.append(f"{r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]")
        expect.append(f"p = {r.p:.3f}")
        expect.append(f"{r.mde80_pct:.1f} %")  # the 80 % MDE column of docs/study.md
        expect.append(f"| {r.p:.3f} | {r.p_holm:.3f} |")  # docs/study.md's table: nominal and Holm p
        expect.append(f"Holm p = {r.p_holm:.3f}")  # docs/results.md
    assert not (ran["p_holm"] < 0.05).any() and "none of them is a finding" in text
    verdict = s8[s8["question"] == "heterogeneity helps?"]["decision"]
    if len(ran):
        assert len(verdict) == 1 and verdict.iloc[0] == "the package" and "Q1b restated" in text
        note = s8[s8["question"] == "heterogeneity helps?"]["note"].iloc[0]
        assert "(b) the lead survives the gate: met" in note and note.count("not met") == 3  # (a), (c), (d)
    # balance without a loss (S11): the goal, the paired comparisons, the unused experts and the verdict
    s11 = pd.read_csv(tables / "S11_bias_balance.csv").query("A == 'mohge+biasfree'").set_index("question")
    bal, vs = s11.loc["all-size max/mean at EP 4"], s11.loc["max/mean against the release recipe"]
    ni, ae = s11.loc["not worse than the release recipe"], s11.loc["against alpha_E 2e-1"]
    expect.append(f"{bal['estimate']:.2f} [{bal['ci_low']:.2f}, {bal['ci_high']:.2f}]")
    expect.append(f"{vs['estimate']:.3f} [{vs['ci_low']:.3f}, {vs['ci_high']:.3f}] of the release recipe's (paired, "
                  f"p = {vs['p']:.3f})")  # fmt: skip
    expect.append(
        f"{ni['estimate']:.3f} of the release recipe, 90 % interval [{ni['ci_low']:.3f}, {ni['ci_high']:.3f}]"
    )
    expect.append(f"({ni['estimate']:.3f}, one-sided 95 % bound {ni['ci_high']:.3f} against 1.02, p = {ni['p']:.2f})")
    groups = s7[(s7["model"] == "mohge+biasfree") & (s7["layer"] != "all")].set_index("layer")["unused_groups"]
    expect.append("per layer " + " / ".join(f"{groups[k]:.2f}" for k in sorted(groups.index)))
    expect.append(f"(p = {ni['p']:.2f}; 80 % MDE {ni['mde80_pct']:.1f} %)")
    expect.append(f"{ae['estimate']:.3f} [{ae['ci_low']:.3f}, {ae['ci_high']:.3f}], p = {ae['p']:.3f}, not separated "
                  f"(n = {int(ae['n'])}, 80 % MDE {ae['mde80_pct']:.1f} %)")  # fmt: skip
    layers = s7[(s7["model"] == "mohge+biasfree") & (s7["layer"] != "all")].set_index("layer")["unused"]
    expect.append("Unused experts by layer " + " / ".join(f"{layers[k]:.1f}" for k in sorted(layers.index)))
    # every group kept alive (S11's group-bias arms), as docs/results.md states them
    all11 = pd.read_csv(tables / "S11_bias_balance.csv")
    for arm in ("mohge+groupbias", "mohge+biasfree_groups"):
        rows = all11[all11["A"] == arm].set_index("question")
        if (rows["status"] != "run").any():
            continue
        b, vs_ = rows.loc["all-size max/mean at EP 4"], rows.loc["max/mean against the release recipe"]
        ni_ = rows.loc["not worse than the release recipe"]
        holm_p = ni_["note"].rsplit("Holm p over the group-bias arms ", 1)[1]
        expect.append(f"{b['estimate']:.2f} [{b['ci_low']:.2f}, {b['ci_high']:.2f}] at EP 4")
        expect.append(f"{vs_['estimate']:.3f} [{vs_['ci_low']:.3f}, {vs_['ci_high']:.3f}] of the release recipe's")
        expect.append(f"perplexity {ni_['estimate']:.3f}, one-sided 95 % bound {ni_['ci_high']:.3f} (Holm p {holm_p}"
                      if arm == "mohge+groupbias" else f"perplexity {ni_['estimate']:.3f}, one-sided bound "
                      f"{ni_['ci_high']:.3f} (Holm p {holm_p}")  # fmt: skip
        unused = rows.loc["experts under 1 % of a uniform share", "note"].split("; groups")[0]
        expect.append(" / ".join(x.split(": ")[1] for x in unused.removeprefix("mean per layer: ").split(", ")))
        assert rows.loc["every group kept alive, balanced, at no perplexity cost shown?", "decision"] == "not supported"
    verdict = s11.loc["balance holds on trained routing without a loss?"]
    assert verdict["decision"] == "not supported" and ae["decision"] == "not separated" and ni["p"] >= 0.05
    assert verdict["note"] == "balance: met; unused experts: not met; perplexity: not met"
    assert "The declared verdict: not supported" in text
    s1 = pd.read_csv(tables / "S1_models.csv").set_index("model")
    for model in ("mohge+hom208", "moe_equal+noaux"):
        if model in s1.index:
            expect.append(f"{s1.loc[model, 'unused_experts']:.1f}")

    # Q3's control and dose (S9): easy - hard at every alpha_G, and each new arm against the alpha_G = 0 control
    def signed(v: float) -> str:
        return f"{v:+.1f}".replace("-", "−")

    def interval(lo: float, hi: float) -> str:
        return f"[{lo:.1f}, {hi:.1f}]".replace("-", "−")

    s9 = pd.read_csv(tables / "S9_q3_dose.csv").set_index("model")
    for model, r in s9[s9["status"] == "run"].iterrows():
        expect.append(f"{signed(r['easy_minus_hard'])} {interval(r['emh_low'], r['emh_high'])}".lstrip("+"))
        if model in ("mohge+ag1e2", "mohge+ag1e1"):
            vs = f"{signed(r['emh_vs_control'])} {interval(r['evc_low'], r['evc_high'])}"
            expect.append(f"{vs} (p = {r['evc_p']:.3f})")
        if r["alpha_G"] >= 1:  # the raised dose: activated parameters and perplexity against the control
            pct = r["activated_vs_control_pct"]
            expect.append(f"{signed(pct)} % {interval(r['avc_low'], r['avc_high'])}".replace("−0.0 %", "+0.0 %"))
            expect.append(f"×{r['ppl_ratio_vs_control']:.3f} [{r['prc_low']:.3f}, {r['prc_high']:.3f}]")
            expect.append(f"p = {r['prc_p']:.3f}")
        if model in ("mohge+ag1", "mohge+ag1rel"):
            expect.append(f"Holm p = {r['prc_p_holm']:.3f}")
    ae3 = s9.loc["mohge+ag1e3"]
    expect.append(f"+{ae3['activated_vs_control_pct']:.2f} % [{ae3['avc_low']:.2f}, {ae3['avc_high']:.2f}]")
    assert ae3["avc_low"] > 0 and (s9["evc_p_holm"].dropna() >= 0.05).all()
    # S10: per-seed permutation tests, and over seeds the excess over the null, its interval including 0 in every arm
    s10 = pd.read_csv(tables / "S10_token_q3.csv").set_index("model")
    assert (s10["excess_low"] < 0).all() and (s10["excess_high"] > 0).all()
    r = s10.loc["mohge+ag0"]
    expect.append(f"{r['excess']:.3f} {interval3(r['excess_low'], r['excess_high'])}")
    # S6: the trace made even inside groups is labelled a check of the code
    s6all = pd.read_csv(tables / "S6_balance_decision.csv")
    assert (s6all[s6all["trace"] == "even_within_groups"]["decision"] == "check of the code (identity)").all()
    # the claims sweep's slope of log test ppl on log total params (docs/study.md), from the committed runs.csv
    runs = pd.read_csv(ROOT / "results" / "claims" / "runs.csv")
    sweep = runs[(runs["dataset"] == "shakespeare") & runs["family"].str.fullmatch(r"moe(_equal|\+w\d+)?")]
    line = stats.ols_line(np.log(sweep["total_params"]), np.log(sweep["test_ppl"]))
    lo, hi = line.slope_t.interval(0.05)
    expect.append(f"{signed3(line.slope)} {interval3(lo, hi)}")
    missing = [e for e in expect if e not in text]
    assert not missing, missing


def signed3(v: float) -> str:
    return f"{v:+.3f}".replace("-", "−")


def interval3(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]".replace("-", "−")


def test_readme_verdicts_agree_with_the_committed_tables():
    """The README's "Results at a glance" states each claim's verdict with its numbers, formatted here from the
    committed S2, S6, S3, S9 and C2 tables; each verdict is the one the declared rule gives."""
    text = " ".join((ROOT / "README.md").read_text().replace("**", "").split())
    claims, capacity = ROOT / "results" / "claims" / "study", ROOT / "results" / "capacity" / "study"
    s2 = pd.read_csv(claims / "S2_tests.csv").query("metric == 'test_ppl'")
    sens = s2[(s2["question"] == "sensitivity") & (s2["A"] == "moe_equal") & (s2["B"] == "moe")].iloc[0]
    assert sens["decision"] == "not separated" and "not decidable on perplexity" in text
    c2 = pd.read_csv(capacity / "C2_tests.csv").set_index("test")
    assert c2.loc["G1 reference > equal", "verdict"] == "fail"
    c5 = pd.read_csv(capacity / "C5_best_shot.csv").set_index("test")
    g1, claim, het = (c5.loc[t] for t in ("G1 reference > equal", "Claim 1 non-inferiority", "Heterogeneity"))
    assert (g1["verdict"], claim["verdict"], het["verdict"]) == ("pass", "refuted", "differs")
    assert "refuted at d_model 32 on stored knowledge" in text and het["p"] < 0.001
    assert (g1["n_a"], g1["n_b"], claim["n_a"], claim["n_b"]) == (8, 8, 8, 8) and "8 seeds a model" in text
    edges = c5.loc[[t for t in c5.index if t.startswith("Edge:")], ["n_a", "estimate"]]
    assert len(edges) == 3 and (edges["n_a"] == 1).all() and (edges["estimate"] < 1).all()
    assert "one selection seed's choice, not a shown optimum" in text  # one run per lr: no optimum is shown
    s6 = pd.read_csv(claims / "S6_balance_decision.csv").query("trace == 'trained'").set_index("model")
    release, strong = s6.loc["mohge"], s6.loc["mohge+ae2e1"]
    assert release["decision"] == "bar not met" and "not supported on trained routing" in text
    s3 = pd.read_csv(claims / "S3_balance.csv")
    even = s3[(s3["trace"] == "even_within_groups") & (s3["model"] == "mohge") & (s3["strategy"] == "all_size")]
    even4 = even[even["ep_size"] == 4].iloc[0]
    s9 = pd.read_csv(claims / "S9_q3_dose.csv")
    assert not (s9["emh_high"] < 0).any() and "not shown at any α_G from 0 to 10" in text
    assert s9["alpha_G"].min() == 0 and s9["alpha_G"].max() == 10
    expect = [
        f"ratio {sens['ratio']:.3f} [{sens['ci_low']:.3f}, {sens['ci_high']:.3f}], p = {sens['p']:.2f}",
        f"G1 passing at {g1['estimate']:.3f} [{g1['ci_low']:.3f}, {g1['ci_high']:.3f}]",
        f"{claim['estimate']:.3f}× [{claim['ci_low']:.3f}, {claim['ci_high']:.3f}]",
        f"{het['estimate']:.3f}× [{het['ci_low']:.3f}, {het['ci_high']:.3f}]",
        f"{release['all_size']:.2f} [{release['all_size_low']:.2f}, {release['all_size_high']:.2f}] at EP 4",
        f"contiguous {release['contiguous']:.2f} (n = {release['n']})",
        f"{strong['all_size']:.2f} [{strong['all_size_low']:.2f}, {strong['all_size_high']:.2f}] (n = {strong['n']})",
        f"exactly {even4['max_over_mean']:.3f}",
    ]
    missing = [e for e in expect if e not in text]
    assert not missing, missing


def test_readme_inference_sentence_is_the_default_studys_t4():
    """README's inference line, formatted here from the committed default study: T4's means per served routing and a
    Welch interval on log perplexity over the runs of inference.csv."""
    from mohge.core.stats import welch

    text = " ".join((ROOT / "README.md").read_text().replace("**", "").split())
    res = ROOT / "results" / "default"
    t4 = (
        pd.read_csv(res / "tables" / "T4_inference.csv")
        .query("dataset == 'shakespeare'")
        .set_index(["family", "point"])
    )
    m, e, d, k = (
        t4.loc[key] for key in (("mohge", "trained"), ("moe", "trained"), ("dense", "trained"), ("mohge", "topk=3"))
    )
    runs = pd.read_csv(res / "inference.csv").query("dataset == 'shakespeare' and point == 'trained'")
    log_ppl = {f: np.log(runs.loc[runs["family"] == f, "val_ppl"].to_numpy()) for f in ("mohge", "moe")}
    est = welch(log_ppl["mohge"], log_ppl["moe"])
    lo, hi = est.interval(0.05)
    p = est.p_h0_eq(0.0)
    assert p > 0.05 and "not separated" in text
    expect = [
        f"MoHGE activates {m['flops_per_token'] / 1e6:.2f} M forward FLOPs per token against MoE's "
        f"{e['flops_per_token'] / 1e6:.2f} M ({m['flops_per_token'] / e['flops_per_token']:.2f}×)",
        f"{math.exp(est.estimate):.3f}× MoE's [{math.exp(lo):.3f}, {math.exp(hi):.3f}] (unpaired Welch on log "
        f"perplexity, n = {m['n']} each, p = {p:.2f}",
        f"spends {k['flops_per_token'] / 1e6:.2f} M at perplexity {k['val_ppl']:.1f}",
        f"the one dense run reaches {d['val_ppl']:.1f} at {d['flops_per_token'] / 1e6:.2f} M",
    ]
    assert m["n"] == e["n"] and d["n"] == 1
    missing = [x for x in expect if x not in text]
    assert not missing, missing


def test_default_balance_paragraph_is_the_committed_t3():
    """docs/results.md's per-GPU load paragraph of the default study, formatted from its T3 (layer 'all')."""
    text = " ".join((ROOT / "docs" / "results.md").read_text().replace("**", "").split())
    t3 = pd.read_csv(ROOT / "results" / "default" / "tables" / "T3_balance.csv").set_index(["strategy", "ep_size"])
    analytic = {s: " / ".join(f"{t3.loc[(s, ep), 'analytic_max_over_mean_mean']:.2f}" for ep in (2, 4, 8))
                for s in ("all_size", "contiguous")}  # fmt: skip
    lpt = " / ".join(f"{t3.loc[('flop_lpt', ep), 'analytic_max_over_mean_mean']:.3f}" for ep in (2, 4, 8))
    measured = {
        s: f"{t3.loc[(s, 4), 'measured_max_over_mean_mean']:.3f}"
        for s in ("all_size", "contiguous", "modse_pairs", "flop_lpt")
    }
    expect = [
        f"max/mean {analytic['all_size']} at EP 2 / 4 / 8, against {analytic['contiguous']} for contiguous",
        f"and {lpt} for the FLOP-aware LPT balancer",
        f"is {measured['all_size']} for all-size, {measured['contiguous']} contiguous, {measured['modse_pairs']} MoDSE "
        f"pairs and {measured['flop_lpt']} LPT",
    ]
    missing = [x for x in expect if x not in text]
    assert not missing, missing


def test_the_frontier_studys_mohge_runs_are_the_claims_runs_retrained_bit_for_bit():
    """studies/frontier/config.yaml retrains the claims study's graded arms of the same name (same data, model, training
    and seed; docs/study.md "The served-frontier study"): each committed run's held-out loss and perplexity equal the
    claims run's exactly."""
    import json

    frontier, claims = ROOT / "results" / "frontier" / "runs", ROOT / "results" / "claims" / "runs"
    shared = sorted(p.name for p in frontier.glob("graded-mohge-*") if (claims / p.name).is_dir())
    assert shared, "no frontier run shares a claims run's name"
    for run in shared:
        a, b = (json.loads((root / run / "metrics.json").read_text()) for root in (frontier, claims))
        assert {k: a[k] for k in ("val", "test")} == {k: b[k] for k in ("val", "test")}, run


def test_readme_and_docs_state_the_served_frontier_test_as_t5_has_it():
    """README's frontier line and docs/results.md's section, formatted from the committed T5_frontier and T4 of the
    frontier study; the verdict is the declared rule's."""
    from mohge_studies.analysis.served_frontier import verdict

    tables = ROOT / "results" / "frontier" / "tables"
    t5 = pd.read_csv(tables / "T5_frontier.csv").iloc[0]
    assert t5["verdict"] == verdict(t5["ci_low"], t5["ci_high"]) and t5["n_defined"] == t5["n_pairs"] == 3
    readme = " ".join((ROOT / "README.md").read_text().replace("**", "").split())
    docs = " ".join((ROOT / "docs" / "results.md").read_text().replace("**", "").split())
    flops = f"{t5['flops_ratio_trained']:.3f}× [{t5['flops_low']:.3f}, {t5['flops_high']:.3f}]"
    ppl = f"{t5['ppl_ratio']:.3f}× [{t5['ci_low']:.3f}, {t5['ci_high']:.3f}]"
    for text in (readme, docs):
        missing = [e for e in (flops, ppl, f"p = {t5['p']:.3f}", t5["verdict"]) if e not in text]
        assert not missing, missing
    assert f"80 % MDE {t5['mde80_pct']:.1f} %" in docs
    t4 = pd.read_csv(tables / "T4_inference.csv").query("point == 'trained'").set_index("family")
    for label, fam in (("MoHGE α_G 0", "mohge+ag0"), ("α_G 1", "mohge+ag1rel"), ("MoE", "moe"), ("dense", "dense")):
        row = t4.loc[fam]
        expect = f"{label} {row['val_ppl']:.2f} at {row['flops_per_token'] / 1e6:.2f} M"
        assert expect in docs, expect
