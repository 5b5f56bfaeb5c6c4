"""Unused experts and width classes over training (mohge_studies.analysis.idle): the tidy table on small synthetic logs,
the count per model and layer, and C3's columns from the committed capacity runs against a count made here from their
training logs."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from mohge_studies.analysis import idle
from mohge_studies.capacity import analysis as capacity

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = ROOT / "results" / "capacity"


def write_log(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def runs_csv(*runs: tuple[str, str, int]) -> pd.DataFrame:
    return pd.DataFrame([{"run": r, "family": f, "dataset": "facts", "seed": s} for r, f, s in runs])


EVEN = [0.25, 0.25, 0.25, 0.25]


@pytest.fixture
def two_seeds(tmp_path) -> tuple[list[Path], pd.DataFrame]:
    """MoHGE, two seeds, two MoE layers, three logged steps; one homogeneous MoE with a single width class."""
    a = write_log(
        tmp_path / "runs" / "m-s0" / "train_log.jsonl",
        [
            {"step": 10, "unused_experts": [0, 0], "group_usage": [EVEN, EVEN]},
            {"step": 20, "unused_experts": [3, 0], "group_usage": [[0.5, 0.5, 0.0, 0.0], EVEN]},
            {"step": 30, "unused_experts": [0, 0], "group_usage": [EVEN, EVEN]},
        ],
    )
    b = write_log(
        tmp_path / "runs" / "m-s1" / "train_log.jsonl",
        [
            {"step": 10, "unused_experts": [1, 0], "group_usage": [EVEN, EVEN]},
            {"step": 20, "unused_experts": [2, 0], "group_usage": [EVEN, EVEN]},
            {"step": 30, "unused_experts": [0, 0], "group_usage": [EVEN, EVEN]},
        ],
    )
    c = write_log(
        tmp_path / "runs" / "e-s0" / "train_log.jsonl",
        [{"step": s, "unused_experts": [0, 0], "group_usage": [[1.0], [1.0]]} for s in (10, 20, 30)],
    )
    return [a, b, c], runs_csv(("m-s0", "mohge", 0), ("m-s1", "mohge", 1), ("e-s0", "moe", 0))


def test_the_table_has_a_row_per_run_step_and_layer_with_the_logged_count(two_seeds):
    logs, runs = two_seeds
    t = idle.idle_table(logs, runs)
    assert list(t.columns) == idle.COLUMNS and len(t) == 3 * 3 * 2
    row = t[(t.run == "m-s0") & (t.step == 20) & (t.layer == 0)].iloc[0]
    assert (row.model, row.dataset, row.seed, row.unused_experts, row.unused_groups) == ("mohge", "facts", 0, 3, 2)
    assert t.loc[t.model == "moe", "unused_groups"].isna().all()  # one width class: nothing to count
    assert (t.loc[t.model == "mohge", "unused_groups"].fillna(-1) >= 0).all()


def test_h0_a_step_with_an_idle_expert_is_not_counted(two_seeds):
    """Layer 0 is idle at step 20 in seed 0 and at steps 10 and 20 in seed 1: 1.5 steps in the mean over seeds."""
    logs, runs = two_seeds
    s = idle.steps_with_unused(idle.idle_table(logs, runs)).set_index(["model", "layer"])
    assert list(s.reset_index().columns) == idle.STEP_COLUMNS
    assert s.loc[("mohge", 0), "steps_with_unused"] == 1.5 and s.loc[("mohge", 0), "n"] == 2
    assert s.loc[("mohge", 0), "logged_steps"] == 3 and s.loc[("mohge", 0), "last_unused_step"] == 20
    assert s.loc[("mohge", 1), "steps_with_unused"] == 0 and math.isnan(s.loc[("mohge", 1), "last_unused_step"])
    assert s.loc[("moe", 0), "steps_with_unused"] == 0


def test_a_width_class_is_unused_only_under_one_percent_of_an_even_share():
    assert idle.unused_groups([0.0051, 0.9949]) == 0  # even share 1/2: the bar is 0.005
    assert idle.unused_groups([0.0049, 0.9951]) == 1
    assert idle.unused_groups([0.0026, 0.0024, 0.5, 0.495]) == 1  # 1/4: the bar is 0.0025
    assert math.isnan(idle.unused_groups([1.0]))


def test_a_log_without_the_count_is_not_logged_rather_than_none(tmp_path):
    """group_usage alone: the groups are counted, unused_experts is NaN, and the model has no steps_with_unused row
    (never a 0 that would read as 'never idle')."""
    log = write_log(
        tmp_path / "runs" / "g-s0" / "train_log.jsonl",
        [{"step": 5, "group_usage": [[0.0, 1.0]]}, {"step": 6, "loss": 1.0}],
    )
    t = idle.idle_table([log], runs_csv(("g-s0", "mohge", 0)))
    assert len(t) == 1 and math.isnan(t.unused_experts.iloc[0]) and t.unused_groups.iloc[0] == 1
    assert idle.steps_with_unused(t).empty


def test_a_log_of_a_run_that_runs_csv_does_not_hold_is_left_out(two_seeds):
    logs, runs = two_seeds
    assert set(idle.idle_table(logs, runs[runs.run != "e-s0"]).run) == {"m-s0", "m-s1"}
    assert idle.idle_table(logs, pd.DataFrame()).empty


def test_over_training_is_the_mean_over_layers_then_seeds(two_seeds):
    logs, runs = two_seeds
    o = idle.over_training(idle.idle_table(logs, runs)).set_index(["model", "step"])
    assert o.loc[("mohge", 20), "unused_experts"] == ((3 + 0) / 2 + (2 + 0) / 2) / 2
    assert o.loc[("mohge", 20), "unused_groups"] == (2 / 2 + 0) / 2 and o.loc[("mohge", 20), "n"] == 2


def test_c3_keeps_its_trace_columns_and_adds_the_logged_steps(two_seeds, tmp_path):
    logs, runs = two_seeds
    trace = tmp_path / "runs" / "m-s0" / "trace.json"
    layers = [{"counts": [100] * 8}, {"counts": [0] + [100] * 7}]
    trace.write_text(json.dumps({"expert_widths": [4, 8], "experts_per_group": 4, "d_model": 16, "layers": layers}))
    c3 = capacity.unused_table([trace], runs, 0.01, logs).set_index(["model", "layer"])
    assert list(c3.reset_index().columns) == ["model", "layer", "n", "unused", "unused_params", *capacity.IDLE_COLUMNS]
    assert c3.loc[("mohge", 1), "unused"] == 1 and c3.loc[("mohge", 1), "unused_params"] == 3 * 16 * 4
    assert c3.loc[("mohge", 0), "steps_with_unused"] == 1.5 and c3.loc[("mohge", 1), "steps_with_unused"] == 0
    assert list(c3.index) == [("mohge", 0), ("mohge", 1)]  # the rows stay the traced models'


def test_committed_c3_counts_the_steps_its_runs_logs_hold():
    """C3's steps_with_unused, logged_steps and last_unused_step from the committed capacity runs equal a count made
    here straight from each run's train_log.jsonl (the runs with a B, as the analysis reads them)."""
    runs = pd.read_csv(CAPACITY / "runs.csv")
    runs = runs[runs["bits_stored"].notna()]
    c3 = pd.read_csv(CAPACITY / "study" / "C3_unused.csv")
    per_run: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for run, model in zip(runs["run"], runs["family"], strict=True):
        rows = [json.loads(line) for line in (CAPACITY / "runs" / run / "train_log.jsonl").read_text().splitlines()]
        rows = [r for r in rows if r.get("unused_experts")]
        for layer in range(len(rows[0]["unused_experts"]) if rows else 0):
            idle_steps = [r["step"] for r in rows if r["unused_experts"][layer] > 0]
            per_run.setdefault((model, layer), []).append((len(idle_steps), len(rows), max(idle_steps, default=-1)))
    checked = 0
    for row in c3.itertuples(index=False):
        counts = per_run.get((row.model, row.layer))
        if counts is None:
            assert math.isnan(row.steps_with_unused) and math.isnan(row.logged_steps), row
            continue
        assert row.steps_with_unused == pytest.approx(sum(c[0] for c in counts) / len(counts)), row
        assert row.logged_steps == pytest.approx(sum(c[1] for c in counts) / len(counts)), row
        last = max(c[2] for c in counts)
        assert math.isnan(row.last_unused_step) if last < 0 else row.last_unused_step == last, row
        checked += 1
    assert checked >= 40  # every model whose logs count unused experts, two layers each
