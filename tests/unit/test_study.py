"""The claims study's analysis (mohge.analysis.study): paired tests on known data, balance and difficulty summaries."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mohge.analysis import study


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


def test_t_interval_matches_the_textbook_formula():
    x = [1.0, 2.0, 4.0, 7.0]
    mean, lo, hi = study.t_interval(x)
    half = stats.t.ppf(0.975, 3) * np.std(x, ddof=1) / 2
    assert mean == pytest.approx(3.5) and lo == pytest.approx(3.5 - half) and hi == pytest.approx(3.5 + half)
    assert math.isnan(study.t_interval([1.0])[1])


def test_pairing_is_by_seed_and_on_log_scale():
    runs = _runs({"mohge": [90.0, 100.0, 80.0], "moe": [100.0, 100.0, 100.0]}).sample(frac=1, random_state=0)
    d = study.paired_log_diffs(runs, "test_ppl", "mohge", "moe")
    assert d.to_dict() == pytest.approx({0: math.log(0.9), 1: 0.0, 2: math.log(0.8)})


def test_tost_shows_equivalence_only_inside_the_margin():
    base = np.array([100.0, 95, 105, 98, 102, 97, 103, 99])
    tight = _runs({"mohge": list(base * np.array([1.001, 0.999] * 4)), "moe": list(base)})
    shifted = _runs({"mohge": list(base * 1.05), "moe": list(base)})
    ok = study.compare(study.paired_log_diffs(tight, "test_ppl", "mohge", "moe"), "tost", 0.05, 0.03)
    bad = study.compare(study.paired_log_diffs(shifted, "test_ppl", "mohge", "moe"), "tost", 0.05, 0.03)
    assert ok["p"] < 0.05 and ok["decision"].startswith("equivalent")
    assert bad["p"] > 0.5 and bad["decision"] == "equivalence not shown"
    assert bad["ratio"] == pytest.approx(1.05)


def test_one_sided_test_has_a_direction():
    lower = _runs({"mohge": [90.0, 91, 89, 90.5], "moe_equal": [100.0, 100, 99, 101]})
    d = study.paired_log_diffs(lower, "test_ppl", "mohge", "moe_equal")
    assert study.compare(d, "less", 0.05)["decision"] == "A lower"
    assert study.compare(-d, "less", 0.05)["decision"] == "A not shown lower"


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
        "Q1b heterogeneity",
        "sensitivity",
        "sensitivity",
        "dense vs MoHGE",
    ]
    assert list(zip(primary["A"], primary["B"], strict=True))[2:4] == [("moe+w160", "moe_equal"), ("moe_equal", "moe")]
    assert set(table["metric"]) == {"test_ppl", "val_ppl"}


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
    assert len(b) == 1 and b.loc[0, "n"] == 3 and b.loc[0, "max_over_mean"] == pytest.approx(1.4)
    assert b.loc[0, "ci_low"] < 1.4 < b.loc[0, "ci_high"]


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


def test_run_analysis_on_the_committed_default_results(tmp_path):
    from mohge.config import load_yaml_or_json

    root = Path(__file__).resolve().parents[2]
    config = load_yaml_or_json(root / "configs" / "config.yaml")
    study.run_analysis(root / "results" / "default", config, tmp_path)
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
