"""Analytic per-rank load: the balance claims of docs/method.md §4.2, synthetic traces, the trace reader, the CLI."""

import csv
import json
import logging
import math

import numpy as np
import pytest

from mohge.allocation import place
from mohge.utilization import (
    ANALYTIC_COLUMNS,
    SUMMARY_COLUMNS,
    Trace,
    TraceError,
    TraceLayer,
    analyze,
    compare,
    imbalance,
    load_replay,
    load_trace,
    main,
    rank_loads,
    routing_from_counts,
    synthetic_trace,
    write_trace,
)

WIDTHS = [384, 512, 640, 768, 896, 1024, 1152, 1280]
WIDTHS_E = [w for w in WIDTHS for _ in range(8)]


def group_counts(per_group, n=8):
    return [c for c in per_group for _ in range(n)]


def flops_imbalance(strategy, counts, ep, d=1024):
    rows = rank_loads(counts, WIDTHS_E, place(strategy, WIDTHS_E, ep, counts), ep, d)
    return imbalance([r["flops"] for r in rows])


def test_rank_loads_formulas_and_method_memory():
    rows = rank_loads(group_counts([1] * 8), WIDTHS_E, place("all_size", WIDTHS_E, 4), 4, 1024, flop_mult=6)
    for r in rows:
        assert r["experts"] == 16 and r["width_sum"] == 13312 and r["tokens"] == 16
        assert r["params"] == 3 * 1024 * 13312  # 40.9 M params per GPU per layer at EP = 4 (docs/method.md §4.2)
        assert r["flops"] == 6 * r["params"]  # one token per expert
    inference = rank_loads(group_counts([1] * 8), WIDTHS_E, place("all_size", WIDTHS_E, 4), 4, 1024, flop_mult=2)
    assert inference[0]["flops"] == 2 * inference[0]["params"]
    assert imbalance([1.0, 1.0, 2.0, 4.0]) == (2.0, pytest.approx(math.sqrt(1.5) / 2))
    assert all(math.isnan(v) for v in imbalance([0.0, 0.0]))


def test_all_size_exactly_balanced_for_any_group_popularity():
    # Very unequal group popularities, uniform within each group: all_size stays exactly balanced whenever
    # every rank holds the same multiset of groups (E/EP a multiple of G), contiguous does not.
    skews = [[100000, 1, 0, 500, 37, 4000, 2, 999], [1, 2, 4, 8, 16, 32, 64, 128], [0, 0, 0, 0, 0, 0, 0, 7]]
    rng = np.random.default_rng(0)
    skews += [rng.integers(0, 10**6, 8).tolist() for _ in range(20)]
    for per_group in skews:
        counts = group_counts(per_group)
        for ep in (2, 4, 8):
            mm, cv = flops_imbalance("all_size", counts, ep)
            assert mm == pytest.approx(1.0, abs=1e-12) and cv == pytest.approx(0.0, abs=1e-12)
        assert flops_imbalance("contiguous", counts, 8)[0] > 1.2
    # Even uniform popularity leaves contiguous unbalanced at EP=8: the widest group's rank does 1280 / 832.
    assert flops_imbalance("contiguous", group_counts([10] * 8), 8)[0] == pytest.approx(1280 / 832)


def test_pair_layouts_need_matched_pair_costs():
    # EP=16/32 hold only complementary pairs: balanced when tokens are equal, not under a group skew.
    assert flops_imbalance("all_size", group_counts([5] * 8), 32)[0] == pytest.approx(1.0)
    assert flops_imbalance("all_size", group_counts([8, 7, 6, 5, 4, 3, 2, 1]), 32)[0] > 1.05
    # MoDSE pairs: equal memory, but load follows the pair type's popularity even at EP=8.
    skew = group_counts([8, 7, 6, 5, 4, 3, 2, 1])
    assert flops_imbalance("modse_pairs", skew, 8)[0] > 1.1
    assert flops_imbalance("all_size", skew, 8)[0] == pytest.approx(1.0)


def test_synthetic_trace_shares_and_replay():
    pop = [8, 4, 2, 1, 1, 2, 4, 8]
    trace, replay = synthetic_trace(pop, tokens=600, topk=4, noise=0.0, seed=3, num_layers=2)
    assert trace.num_experts == 64 and trace.experts_per_group == 8 and trace.tokens == 600 and trace.topk == 4
    for lay in trace.layers:
        c = np.array(lay.counts).reshape(8, 8)
        assert c.sum() == 2400
        assert (c.max(1) - c.min(1)).max() <= 1  # uniform within groups up to rounding
        np.testing.assert_allclose(c.sum(1) / 2400, np.array(pop) / sum(pop), atol=8 / 2400)
        idx, gates = replay[lay.layer]
        assert idx.shape == gates.shape == (600, 4)
        assert all(len(set(row)) == 4 for row in idx.tolist())  # distinct experts per token
        np.testing.assert_array_equal(np.bincount(idx.ravel(), minlength=64), lay.counts)
        np.testing.assert_allclose(gates.sum(1), 1.0, rtol=1e-6)
    # Exactly uniform when the shares divide: all_size EP=8 is then exactly balanced.
    exact, _ = synthetic_trace([1, 1, 2, 2, 4, 4, 1, 1], tokens=512, topk=4, noise=0.0)
    assert np.array(exact.layers[0].counts).reshape(8, 8).std(1).max() == 0
    assert flops_imbalance("all_size", exact.layers[0].counts, 8)[0] == 1.0
    noisy, _ = synthetic_trace(pop, tokens=4096, topk=6, noise=0.1, seed=1)
    c = np.array(noisy.layers[0].counts).reshape(8, 8)
    ratio = c / (4096 * 6 * np.array(pop)[:, None] / sum(pop) / 8)  # against the noise-free count
    assert ratio.min() > 0.88 and ratio.max() < 1.12 and ratio.std() > 0.03
    with pytest.raises(ValueError, match="group_popularity"):
        synthetic_trace([1, 2, 3])


def test_routing_from_counts_exact_and_errors():
    counts = [5, 0, 3, 4, 0, 6]
    idx, gates = routing_from_counts(counts, 3, seed=1)
    assert idx.shape == (6, 3)
    np.testing.assert_array_equal(np.bincount(idx.ravel(), minlength=6), counts)
    assert all(len(set(r)) == 3 for r in idx.tolist())
    with pytest.raises(ValueError, match="multiple of topk=4"):
        routing_from_counts(counts, 4)
    with pytest.raises(ValueError, match="more than the T=6"):
        routing_from_counts([7, 5, 6], 3)


def test_flop_lpt_balances_flops_not_tokens_on_skewed_trace():
    trace, _ = synthetic_trace(tokens=4096, topk=6, noise=0.1, seed=0)
    _, summary = analyze(trace, ["flop_lpt", "contiguous"], [4, 8])
    s = {(r["strategy"], r["ep_size"]): r for r in summary if r["layer"] == "all"}
    for ep in (4, 8):
        assert s["flop_lpt", ep]["max_over_mean"] < 1.01
        assert s["flop_lpt", ep]["tokens_max_over_mean"] > 1.05
        assert s["contiguous", ep]["max_over_mean"] > 1.2


def test_analyze_rows_all_row_and_skips(caplog):
    t = Trace("m", 4, [2, 6], 4, 2, [TraceLayer(0, [1, 1, 1, 1]), TraceLayer(5, [4, 0, 0, 0])])
    with caplog.at_level(logging.WARNING):
        analytic, summary = analyze(t, ["contiguous", "modse_pairs"], [2, 4], flop_mult=2)
    assert "'modse_pairs' at ep_size=4" in caplog.text  # one expert per rank: no pairs
    keys = {(r["strategy"], r["ep_size"]) for r in summary}
    assert keys == {("contiguous", 2), ("contiguous", 4), ("modse_pairs", 2)}
    assert len(analytic) == 2 * 2 + 2 * 4 + 2 * 2
    rows = [r for r in analytic if r["strategy"] == "contiguous" and r["ep_size"] == 2 and r["layer"] == 0]
    assert [r["flops"] for r in rows] == [2 * 2 * 3 * 4 * 2, 2 * 2 * 3 * 4 * 6]
    # 'all' = sum of per-layer max over sum of per-layer mean; layer 5 puts 4 tokens on rank 0 only.
    all_row = next(r for r in summary if r["layer"] == "all" and r["strategy"] == "contiguous" and r["ep_size"] == 2)
    l0, l5 = [96.0, 288.0], [192.0, 0.0]
    assert all_row["max_over_mean"] == pytest.approx((288 + 192) / (192 + 96))
    assert all_row["cv"] == pytest.approx((imbalance(l0)[1] + imbalance(l5)[1]) / 2)


def test_trace_round_trip_and_replay(tmp_path):
    trace, replay = synthetic_trace([1, 2, 3, 4], tokens=40, topk=2, expert_widths=[8, 16, 24, 32], experts_per_group=2)
    path = write_trace(trace, tmp_path / "t.json", replay)
    back = load_trace(path)
    assert back == trace
    rep = load_replay(back)
    np.testing.assert_array_equal(rep[0][0], replay[0][0])
    (tmp_path / "t.npz").unlink()
    assert load_replay(back) is None


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("d_model"), "missing key 'd_model'"),
        (lambda d: d.update(num_experts=10), "num_experts=10 must equal"),
        (lambda d: d["layers"][0].update(counts=[1, 2]), r"layers\[0\]: 'counts' has 2 entries"),
        (lambda d: d["layers"][0]["counts"].__setitem__(0, -1), "non-negative"),
        (lambda d: d.update(layers=[]), "'layers' is empty"),
        (lambda d: d.update(expert_widths=[0, 4]), "expert_widths"),
        (lambda d: d["layers"].append(dict(d["layers"][0])), "duplicate layer"),
    ],
)
def test_bad_traces_name_file_and_key(tmp_path, mutate, match):
    trace, _ = synthetic_trace([1, 1], tokens=8, topk=1, expert_widths=[4, 8], experts_per_group=2)
    data = trace.to_json()
    mutate(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=match) as err:
        load_trace(p)
    assert "bad.json" in str(err.value)


def test_missing_and_malformed_trace_files(tmp_path):
    with pytest.raises(TraceError, match="nope.json.*does not exist"):
        load_trace(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TraceError, match="x.json.*not valid JSON"):
        load_trace(tmp_path / "x.json")


def test_compare():
    measured = [
        {"model": "m", "layer": "0", "strategy": "s", "ep_size": "2", "rank": "1", "flops": "3", "seconds": "0.3"},
        {"model": "m", "layer": "0", "strategy": "s", "ep_size": "2", "rank": "0", "flops": "1", "seconds": "0.2"},
    ]
    for r, smin in zip(measured, ("0.25", "0.2"), strict=True):
        r["seconds_min"] = smin
    (row,) = compare(measured)
    assert row["analytic_max_over_mean"] == pytest.approx(1.5)
    assert row["measured_max_over_mean"] == pytest.approx(1.2)
    assert row["rel_diff"] == pytest.approx(1.2 / 1.5 - 1)
    assert row["measured_min_max_over_mean"] == pytest.approx(0.25 / 0.225)


def read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cli_synthetic_writes_csvs(tmp_path):
    out = tmp_path / "u"
    assert main(["--synthetic", "--out", str(out), "--ep", "4", "8", "64", "--noise", "0"]) == 0
    analytic, summary = read(out / "analytic.csv"), read(out / "summary.csv")
    assert list(analytic[0]) == list(ANALYTIC_COLUMNS) and list(summary[0]) == list(SUMMARY_COLUMNS)
    assert (out / "synthetic_trace.json").is_file() and (out / "synthetic_trace.npz").is_file()
    s = {(r["strategy"], r["ep_size"], r["layer"]): r for r in summary}
    assert float(s["all_size", "8", "all"]["max_over_mean"]) == pytest.approx(1.0, abs=2e-3)
    assert float(s["contiguous", "8", "all"]["max_over_mean"]) > 1.2
    assert ("modse_pairs", "64", "all") not in s and ("all_size", "64", "all") in s
    sums = {int(r["width_sum"]) for r in analytic if r["strategy"] == "all_size" and r["ep_size"] == "8"}
    assert sums == {6656}


def test_cli_errors_name_the_trace(tmp_path, caplog):
    with caplog.at_level(logging.ERROR):
        assert main(["--trace", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.json" in caplog.text and "does not exist" in caplog.text
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path)])  # neither --trace nor --synthetic


def test_reader_accepts_extra_keys_and_int32_replay(tmp_path):
    # mohge.traces writes more than the reader needs (family, split, group_counts, counts_by_level, levels).
    trace, replay = synthetic_trace([1, 1], tokens=10, topk=1, expert_widths=[4, 8], experts_per_group=2)
    data = trace.to_json() | {"family": "mohge", "split": "test"}
    data["layers"][0] |= {"group_counts": [5, 5], "counts_by_level": {}}
    (tmp_path / "t.json").write_text(json.dumps(data))
    idx, gates = replay[0]
    np.savez(tmp_path / "t.npz", idx_0=idx.astype(np.int32), gates_0=gates, levels=np.zeros(10, np.int8))
    back = load_trace(tmp_path / "t.json")
    assert back.layers[0].counts == trace.layers[0].counts
    rep = load_replay(back)
    assert rep[0][0].dtype == np.int64 and rep[0][0].tolist() == idx.tolist()
