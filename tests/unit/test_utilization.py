"""Analytic per-rank load: the balance claims of docs/method.md §4.2 and §11, the comparison, the CLI."""

import csv
import logging
import math

import numpy as np
import pytest
from mohge_studies.analysis.utilization import (
    ANALYTIC_COLUMNS,
    SUMMARY_COLUMNS,
    analyze,
    compare,
    imbalance,
    main,
    rank_loads,
)

from mohge.evaluate.traces import Trace, TraceLayer, synthetic_trace
from mohge.model.allocation import place

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


def test_exactly_uniform_synthetic_trace_is_exactly_balanced_by_all_size():
    exact, _ = synthetic_trace([1, 1, 2, 2, 4, 4, 1, 1], tokens=512, topk=4, noise=0.0)
    assert flops_imbalance("all_size", exact.layers[0].counts, 8)[0] == 1.0


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


def test_one_device_times_every_rank_on_exactly_the_rows_its_placement_receives(tmp_path):
    """`--measure --one-device`: the ranks timed in turns in one process (no torchrun), each on the routed slots of
    its own experts, so the measured rows equal the analytic ones rank by rank."""
    out = tmp_path / "u"
    args = ["--synthetic", "--out", str(out), "--widths", "16", "24", "32", "40", "--experts-per-group", "2"]
    args += ["--tokens", "64", "--topk", "2", "--d-model", "16", "--popularity", "4", "3", "2", "1", "--ep", "2"]
    assert main([*args, "--measure", "--nproc", "2", "--repeats", "2", "--one-device"]) == 0
    measured, analytic = read(out / "measured.csv"), read(out / "analytic.csv")
    tokens = {(r["strategy"], r["rank"]): r["tokens"] for r in analytic if r["ep_size"] == "2"}
    assert {(r["strategy"], r["rank"]): r["tokens"] for r in measured} == tokens
    assert {r["timing"] for r in measured} == {"one_device"} and {r["device"] for r in measured} == {"cpu"}
    assert all(float(r["seconds"]) > 0 and r["repeats"] == "2" and r["gpu_util_pct"] == "" for r in measured)
    assert {r["strategy"] for r in read(out / "comparison.csv")} == {s for s, _ in tokens}


def test_local_rows_are_the_slots_of_the_ranks_own_experts():
    import torch
    from mohge_studies.analysis.ep_timing import local_rows

    from mohge.train.distributed.ep_layer import ExpertParallelExperts

    widths_E = [8, 8, 12, 12, 16, 16, 20, 20]
    ranks = place("all_size", widths_E, 2)
    x_TD, idx_TK = torch.randn(10, 4), torch.randint(0, 8, (10, 3))
    seen = 0
    for rank in (0, 1):
        mod = ExpertParallelExperts(widths_E, ranks, rank, 4)
        xs_RD, le_R = local_rows(mod, x_TD, idx_TK)
        mine = [(t, k) for t in range(10) for k in range(3) if ranks[int(idx_TK[t, k])] == rank]
        assert torch.equal(xs_RD, torch.stack([x_TD[t] for t, _ in mine]))
        assert le_R.tolist() == [mod.local_experts.index(int(idx_TK[t, k])) for t, k in mine]
        seen += len(mine)
    assert seen == 30  # every routed slot on exactly one rank
