"""The served-frontier test (mohge_studies.analysis.served_frontier; docs/study.md "The served-frontier study"): the
envelope, its reading at a cost, the paired test against scipy, and the config's refusal of a model it does not
plan."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT
from mohge_studies.analysis import served_frontier as sf
from mohge_studies.config.runs import merge_config, plan
from scipy import stats as st

from mohge.core.knobs import ConfigError


def test_envelope_keeps_only_points_no_cheaper_point_beats():
    flops = [10, 6, 8, 4, 6, 9]
    ppl = [5.0, 6.0, 5.5, 7.0, 6.5, 5.6]
    assert sf.lower_envelope(flops, ppl) == [(4.0, 7.0), (6.0, 6.0), (8.0, 5.5), (10.0, 5.0)]


def test_envelope_is_read_log_linearly_between_its_brackets_and_undefined_below_it():
    env = [(4.0, 7.0), (8.0, 5.0)]
    p, how = sf.envelope_at(env, 6.0)
    assert p == pytest.approx(math.sqrt(7.0 * 5.0), rel=1e-12) and "between" in how
    assert sf.envelope_at(env, 4.0)[0] == 7.0
    assert sf.envelope_at(env, 9.0)[0] == 5.0
    assert math.isnan(sf.envelope_at(env, 3.9)[0])


def rows_of(trained: dict[int, tuple[float, float]], served: dict[int, list[tuple[str, float, float]]]) -> pd.DataFrame:
    out = [
        {"family": "mohge+a", "run": f"g-mohge-a-s{s}", "point": "trained", "flops_per_token": f, "val_ppl": p}
        for s, (f, p) in trained.items()
    ]
    out += [
        {"family": "mohge+b", "run": f"g-mohge-b-s{s}", "point": pt, "flops_per_token": f, "val_ppl": p}
        for s, pts in served.items()
        for pt, f, p in pts
    ]
    return pd.DataFrame(out)


def test_the_paired_ratio_equals_scipys_one_sample_t_on_the_log_ratios():
    served = {
        s: [("trained", 10.0, 5.0 + 0.1 * s), ("topk=3", 8.0, 5.2 + 0.1 * s), ("topk=2", 6.0, 6.0)] for s in range(3)
    }
    trained = {0: (9.0, 5.3), 1: (9.0, 5.2), 2: (7.0, 5.9)}
    table = sf.frontier_test(rows_of(trained, served), "mohge+a", "mohge+b")
    d = []
    for s, (f, p) in trained.items():
        env = sf.lower_envelope([x[1] for x in served[s]], [x[2] for x in served[s]])
        d.append(math.log(p) - math.log(sf.envelope_at(env, f)[0]))
    ref = st.ttest_1samp(d, 0.0)
    lo, hi = st.t.interval(0.95, len(d) - 1, loc=np.mean(d), scale=st.sem(d))
    row = table.iloc[0]
    assert row["n_pairs"] == row["n_defined"] == 3
    assert row["ppl_ratio"] == pytest.approx(math.exp(np.mean(d)), rel=1e-12)
    assert row["ci_low"] == pytest.approx(math.exp(lo), rel=1e-9) and row["ci_high"] == pytest.approx(
        math.exp(hi), rel=1e-9
    )
    assert row["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert row["flops_ratio_trained"] == pytest.approx((0.9 * 0.9 * 0.7) ** (1 / 3), rel=1e-12)
    assert row["verdict"] == sf.verdict(row["ci_low"], row["ci_high"])


def test_the_verdict_follows_the_declared_rule():
    assert sf.verdict(0.90, 0.99) == "training-time steering beats serving"
    assert sf.verdict(1.01, 1.2) == "serving beats training-time steering"
    assert sf.verdict(0.98, 1.02) == "not separated"


def test_a_seed_below_every_served_point_is_left_out_and_counted():
    served = {s: [("trained", 10.0, 5.0), ("topk=2", 6.0, 6.0)] for s in range(3)}
    trained = {0: (5.0, 6.5), 1: (8.0, 5.4), 2: (8.0, 5.6)}
    row = sf.frontier_test(rows_of(trained, served), "mohge+a", "mohge+b").iloc[0]
    assert row["n_pairs"] == 3 and row["n_defined"] == 2 and "s0: below every served point" in row["reads"]


def test_the_config_refuses_a_frontier_test_naming_a_model_it_does_not_plan():
    base = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
    frontier = yaml.safe_load((ROOT / "studies" / "frontier" / "config.yaml").read_text())
    assert "graded-mohge-ag1rel-s2" in plan(merge_config(base, frontier), preflight=False)
    bad = merge_config(
        base, {**frontier, "inference": {"frontier_test": {"trained": "mohge+ag2", "served": "mohge+ag0"}}}
    )
    with pytest.raises(
        ConfigError, match=r"inference\.frontier_test\.trained='mohge\+ag2': not a model this config plans"
    ):
        plan(bad, preflight=False)
