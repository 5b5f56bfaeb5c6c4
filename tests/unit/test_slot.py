"""`mohge slot`: the next runs of a study for one GPU slot, seed by seed, skipping the runs whose results are in."""

from pathlib import Path

import yaml
from mohge_studies.config.runs import merge_config
from mohge_studies.workflow.slot import main, next_runs

ROOT = Path(__file__).resolve().parents[2]


def ladder() -> dict:
    cfg: dict = {}
    for path in ("configs/config.yaml", "studies/gpu_capacity/config.yaml"):
        cfg = merge_config(cfg, yaml.safe_load((ROOT / path).read_text()))
    return cfg


def test_the_ladder_runs_seed_by_seed_in_the_families_declared_order(tmp_path):
    names = [name for name, _ in next_runs(ladder(), str(tmp_path), 12)]
    assert names == [f"facts_d128-{f}-s{s}" for s in (10, 11, 12, 13) for f in ("moe", "moe_equal", "mohge")]


def test_a_run_whose_results_are_all_in_the_checkout_is_not_made_again(tmp_path, capsys):
    cfg = ladder()
    (first, files), (second, _) = next_runs(cfg, str(tmp_path), 2)
    assert f"results/gpu_capacity/runs/{first}/metrics.json" in files
    assert f"results/gpu_capacity/utilization/{first}/summary.csv" in files  # every seed is traced and placed
    for f in files[:-1]:  # one file missing: the run is still to make
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("{}")
    assert next_runs(cfg, str(tmp_path), 1)[0][0] == first
    (tmp_path / files[-1]).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / files[-1]).write_text("{}")
    assert next_runs(cfg, str(tmp_path), 1)[0][0] == second
    configs = [str(ROOT / "configs" / "config.yaml"), str(ROOT / "studies" / "gpu_capacity" / "config.yaml")]
    assert main([*configs, "--runs", "2", "--root", str(tmp_path), "--names"]) == 0
    assert capsys.readouterr().out.split() == [second, "facts_d128-mohge-s10"]
