"""The token-level Q3 record (mohge.evaluate.token_width): routed width per token, Spearman's rho against a
within-level permutation null (a planted correlation is found, none is not, the p-value is uniform-ish under the
null), the within-token contrast, and the tracer's ``token_q3`` block and per-token arrays on a tiny trained model."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_run, train_tiny
from scipy import stats

from mohge.core import stats as mstats
from mohge.data import TokenStream
from mohge.evaluate import token_width as tw
from mohge.evaluate import traces


def _tokens(n: int, seed: int, slope: float = 0.0, level_effect: float = 0.0):
    """Synthetic tokens: level in {-1, 0, 1, 2}, loss and width each with a level effect; ``slope`` plants a
    within-level dependence of width on loss."""
    rng = np.random.default_rng(seed)
    level = rng.integers(-1, 3, n)
    loss = rng.gamma(2.0, 1.0, n) + level_effect * level
    width = 200 + 20 * rng.normal(size=n) + 30 * level_effect * level + slope * loss
    target = rng.integers(0, 20, n)
    return width, loss, level, target


def test_routed_width_is_the_gate_weighted_mean():
    widths_E = np.array([10.0, 20.0, 40.0])
    idx = np.array([[0, 2], [1, 1]])
    gates = np.array([[3.0, 1.0], [0.2, 0.2]])
    assert tw.routed_width(idx, gates, widths_E).tolist() == pytest.approx([(30 + 40) / 4, 20.0])


def test_spearman_matches_scipy_and_a_planted_correlation_is_found():
    width, loss, level, _ = _tokens(2000, 0, slope=8.0)
    assert mstats.spearman(width, loss) == pytest.approx(stats.spearmanr(width, loss).statistic)
    out = mstats.stratified_permutation_test(width, loss, level, n_perm=99)
    assert out["rho"] > 0.2 and out["p"] == pytest.approx(1 / 100)  # beyond every permuted rho
    assert abs(out["null_mean"]) < 0.02 and 0 < out["null_sd"] < 0.05


def test_the_null_keeps_the_between_level_part_and_finds_nothing_within():
    # width and loss both rise with the level, independent within it: rho is large, the within-level null as well
    width, loss, level, _ = _tokens(2000, 1, slope=0.0, level_effect=1.0)
    out = mstats.stratified_permutation_test(width, loss, level, n_perm=99)
    assert out["rho"] > 0.2 and out["null_mean"] == pytest.approx(out["rho"], abs=0.05) and out["p"] > 0.05


def test_permutation_p_is_uniform_under_the_null():
    ps = [
        mstats.stratified_permutation_test(*_tokens(300, seed, level_effect=0.5)[:3], n_perm=99, seed=seed)["p"]
        for seed in range(40)
    ]
    assert stats.kstest(ps, "uniform").pvalue > 0.01
    assert 0.3 < np.mean(ps) < 0.7 and np.mean(np.array(ps) < 0.05) <= 0.15


def test_within_token_contrast_pairs_by_token_id():
    rng = np.random.default_rng(2)
    n = 3000
    target, level = rng.integers(0, 30, n), rng.integers(0, 3, n)
    width = 100 + 5 * target + rng.normal(0, 1, n) - 7.0 * (level == 0)  # easy 7 units narrower than hard, per id
    out = tw.within_token_contrast(width, level, target)
    diffs = [width[(target == t) & (level == 0)].mean() - width[(target == t) & (level == 2)].mean() for t in range(30)]
    lo, hi = stats.t.interval(0.95, 29, loc=np.mean(diffs), scale=stats.sem(diffs))
    assert out["n_ids"] == 30 and out["easy_minus_hard"] == pytest.approx(np.mean(diffs))
    assert (out["low"], out["high"]) == pytest.approx((lo, hi)) and out["high"] < 0
    assert out["p"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue)
    none = tw.within_token_contrast(width, np.where(level == 2, 1, level), target)  # no hard token
    assert none["n_ids"] == 0 and math.isnan(none["easy_minus_hard"])


def test_token_summary_is_small_and_json_ready():
    width, loss, level, target = _tokens(500, 3, slope=3.0)
    s = tw.token_summary(np.stack([width, width + 1], 1), loss, level, target, n_perm=20)
    assert set(s) == {"width", "n_tokens", "mean_width", "answer", "all", "within_token"}
    assert s["answer"]["n"] == int((level >= 0).sum()) and s["all"]["n"] == 500 and len(s["all"]["rho_by_layer"]) == 2
    assert len(json.dumps(s, allow_nan=False)) < 2000


RUN = tiny_run(name="tiny-tokens", train={"steps": 2, "ckpt_every": 2, "log_every": 1}, eval={"batch_size": 4})


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    return train_tiny(tmp_path_factory.mktemp("run"), RUN)


def test_tracer_writes_the_token_record_over_every_test_token(run, tmp_path):
    from mohge.train.checkpoint import load_trained

    model, data = run
    trace = traces.trace_checkpoint(model, data, tmp_path / "trace.json")
    stream = TokenStream.open(data, "test")
    T = len(stream) - 1
    z = np.load(tmp_path / "trace_tokens.npz")
    assert sorted(z.files) == ["level_T", "loss_T", "target_T", "width_TL"]
    assert z["width_TL"].shape == (T, 2) and z["loss_T"].shape == (T,)
    assert (z["width_TL"] >= 16).all() and (z["width_TL"] <= 64).all()  # the model's widths: 16 .. 64
    np.testing.assert_array_equal(z["level_T"], stream.levels[1:])
    np.testing.assert_array_equal(z["target_T"], stream.tokens[1:].astype(np.int32))
    # the loss is the next token's cross-entropy: the mean of a direct pass over the same windows
    cfg, net = load_trained(model)
    with torch.no_grad():
        total = sum(
            torch.nn.functional.cross_entropy(net(x).logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            for x, y in stream.iter_eval_batches(4, cfg.data_config.seq_len)
        )
    assert z["loss_T"].mean() == pytest.approx(total / T, rel=1e-5)
    block = json.loads((tmp_path / "trace.json").read_text())["token_q3"]
    assert block == json.loads(json.dumps(trace["token_q3"]))
    answer = z["level_T"] >= 0
    rho = stats.spearmanr(z["width_TL"].astype(np.float64).mean(1)[answer], z["loss_T"][answer]).statistic
    assert block["n_tokens"] == T and block["answer"]["rho"] == pytest.approx(rho, abs=1e-6)
    assert block["answer"]["n_perm"] == tw.N_PERM and 0 < block["answer"]["p"] <= 1
    # the fields a trace had before the record are unchanged
    assert {"layer", "counts", "group_counts", "counts_by_level"} == set(trace["layers"][0])
    assert traces.load_trace(tmp_path / "trace.json").tokens == T


def test_the_study_table_reads_what_the_tracer_writes(run, tmp_path):
    """The tracer's token_q3 block, in a study root as the workflow copies it, is what S10 aggregates."""
    import pandas as pd
    from mohge_studies.claims import controls

    model, data = run
    rows = []
    for seed in (0, 1):
        run_dir = tmp_path / "runs" / f"graded-mohge-s{seed}"
        traces.trace_checkpoint(model, data, run_dir / "trace.json", npz=False)
        rows.append({"run": run_dir.name, "dataset": "graded", "family": "mohge", "seed": seed})
    block = json.loads((tmp_path / "runs" / "graded-mohge-s0" / "trace.json").read_text())["token_q3"]
    s10 = controls.token_q3(tmp_path, pd.DataFrame(rows), {"graded"}).iloc[0]
    assert s10["status"] == "token-level record" and s10["n_token_record"] == 2
    assert s10["rho_answer"] == pytest.approx(block["answer"]["rho"])  # the same model twice: the same record
    assert s10["excess"] == pytest.approx(block["answer"]["rho"] - block["answer"]["null_mean"])
    assert not (tmp_path / "runs" / "graded-mohge-s0" / "trace_tokens.npz").exists()  # --no-npz: no arrays
