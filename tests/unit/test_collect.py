"""The collect step: activated parameters from the learned routing, group shares per level and layer."""

from __future__ import annotations

import json

import pytest
from mohge_studies.analysis.collect import group_rows, measured_activated


def test_measured_activated_replaces_the_uniform_routed_part(tmp_path):
    cfg = {"model": {"d_model": 10}}
    params = {"activated_sum": 1000, "activated": {"routed_experts": 600}}
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"step": 0, "activated_expert_width": [1, 1]}) + "\n")
    log.write_text(log.read_text() + json.dumps({"step": 9, "activated_expert_width": [4, 6]}) + "\n")
    assert measured_activated(cfg, params, log) == 1000 - 600 + 3 * 10 * (4 + 6)
    assert measured_activated(cfg, params, tmp_path / "missing.jsonl") == 1000


def test_group_rows_aggregate_layers_and_levels(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"dataset": "d", "family": "mohge", "train": {"seed": 0}}))
    trace = {
        "expert_widths": [8, 16],
        "experts_per_group": 2,
        "layers": [
            {"layer": 1, "counts": [1, 1, 2, 0], "counts_by_level": {"easy": [1, 0, 0, 0], "hard": [0, 1, 2, 0]}},
            {"layer": 2, "counts": [0, 0, 3, 1], "counts_by_level": {"easy": [0, 0, 1, 0], "hard": [0, 0, 2, 1]}},
        ],
    }
    (run / "trace.json").write_text(json.dumps(trace))
    rows = {(r["layer"], r["level"], r["group"]): r for r in group_rows(tmp_path, "r")}
    assert rows[(1, "all", 0)]["slots"] == 2 and rows[(1, "all", 1)]["slots"] == 2
    assert rows[("all", "all", 1)]["slots"] == 6 and rows[("all", "all", 1)]["share"] == pytest.approx(0.75)
    assert rows[("all", "hard", 0)]["slots"] == 1 and rows[("all", "hard", 1)]["slots"] == 5
    assert rows[("all", "easy", 0)]["width"] == 8
