"""``mohge bench precision``: fp32 and bf16 trainings of one config, compared on final val loss."""

import json

import pytest
from conftest import tiny_run, train_tiny
from mohge_studies.bench import main as bench_main
from mohge_studies.bench.precision import compare


def test_compare_pairs_by_seed_and_judges_every_seed():
    rows = [
        {"seed": s, "precision": p, "val_loss": v, "tokens_per_s": t}
        for s, p, v, t in [(0, "fp32", 2.0, 100), (0, "bf16", 2.01, 130), (1, "fp32", 2.1, 100), (1, "bf16", 2.05, 140)]
    ]
    out = compare(rows, 0.01)
    assert [p["seed"] for p in out["pairs"]] == [0, 1]
    assert out["pairs"][0]["rel_diff"] == pytest.approx(0.005) and out["pairs"][1]["tokens_per_s_ratio"] == 1.4
    assert out["max_abs_rel_diff"] == pytest.approx(0.05 / 2.1) and not out["within_tolerance"]  # seed 1: -2.4 %
    assert compare(rows, 0.03)["within_tolerance"]
    assert out["fp32_seed_spread"] == pytest.approx(0.05)
    assert not compare(rows[:1], 0.01)["within_tolerance"]  # no pair: no verdict of agreement


def test_precision_bench_trains_both_and_skips_what_finished(tmp_path, capsys):
    model, data = train_tiny(tmp_path / "base", tiny_run())
    args = ["precision", "--config", str(model / "config.json"), "--data", str(data), "--seeds", "0", "--steps", "4"]
    args += ["--tolerance", "0.5", "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "p.json")]
    assert bench_main(args) == 0
    first = capsys.readouterr().out
    assert first.count("precision: training") == 2
    got = json.loads((tmp_path / "p.json").read_text())
    assert {r["precision_used"] for r in got["rows"]} == {"fp32", "bf16"}
    assert got["n_seeds"] == 1 and got["within_tolerance"] and all(r["steps"] == 4 for r in got["rows"])
    assert bench_main(args) == 0  # both finished: read back, not trained again
    assert "precision: training" not in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["pairs"] == got["pairs"]
