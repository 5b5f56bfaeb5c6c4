"""Parameter counts: the worked numbers of docs/method.md §9 for the released 3B config; counts that match the model."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, config_path, tiny_model_config
from mohge_studies.config import param_report

from mohge.config import ConfigError, load_model_config
from mohge.config import sizes as params
from mohge.model import LanguageModel

PRESETS = ROOT / "configs" / "models"


def test_release_3b_matches_worked_numbers():  # docs/method.md §9
    mohge = params.count_params(load_model_config(PRESETS / "mohge-3b.yaml"))
    moe = params.count_params(load_model_config(PRESETS / "moe-3b.yaml"))
    assert mohge["total_sum"] == pytest.approx(2.78e9, rel=0.01)
    assert moe["total_sum"] == pytest.approx(3.31e9, rel=0.01)
    assert mohge["total"]["routed_experts"] / moe["total"]["routed_experts"] == pytest.approx(1 - 0.1875)
    # one MoE layer: 169.9M vs 207.7M (routed + shared + routers)
    per_layer = {
        k: (c["total"]["routed_experts"] + c["total"]["shared_experts"] + c["total"]["routers"]) / 14
        for k, c in (("mohge", mohge), ("moe", moe))
    }
    assert per_layer["mohge"] == pytest.approx(169.9e6, rel=1e-3)
    assert per_layer["moe"] == pytest.approx(207.7e6, rel=1e-3)
    assert mohge["total"]["attention"] / 15 == pytest.approx(7.93e6, rel=1e-3)
    # activated non-embedding under uniform routing: ~441M vs 490M
    assert mohge["activated_non_embedding"] == pytest.approx(441e6, rel=0.01)
    assert moe["activated_non_embedding"] == pytest.approx(490e6, rel=0.01)


def test_counts_equal_real_model_numel():
    cfg = tiny_model_config()
    counts = params.count_params(cfg)
    assert counts["total_sum"] == sum(p.numel() for p in LanguageModel(cfg).parameters())


def test_activated_under_histogram():
    cfg = tiny_model_config()  # widths 16..40, 4 experts per group, top-3, d 32, 2 MoE layers
    only_smallest = [[1] * 4 + [0] * 12]
    counts = params.count_params(cfg, only_smallest)
    assert counts["activated"]["routed_experts"] == 2 * 3 * 3 * 32 * 16
    assert counts["mean_activated_width"] == [16.0, 16.0]
    uniform = params.count_params(cfg)
    assert uniform["mean_activated_width"] == [28.0, 28.0]
    with pytest.raises(ValueError, match="histogram row 0 has 3 entries"):
        params.count_params(cfg, [[1, 2, 3]])


def test_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = [str(PRESETS / "mohge-3b.yaml"), "--compare", str(PRESETS / "moe-3b.yaml"), "--json", str(out)]
    rc = param_report.main(argv)
    assert rc == 0
    text = capsys.readouterr().out
    assert "-18.75%" in text
    data = json.loads(out.read_text())
    assert data["total"]["routed_experts"] == 14 * 8 * 3 * 1024 * sum(range(384, 1281, 128))


def _planned(*names: str) -> dict:
    """The runs of configs/<name>.yaml merged over configs/config.yaml, as the workflow plans an overlay."""
    from mohge_studies.config.runs import merge_config, plan

    from mohge.config import load_yaml_or_json

    config: dict = {}
    for name in ("config", *names):
        config = merge_config(config, load_yaml_or_json(config_path(name)))
    return plan(config, preflight=False)


def test_a_workflow_config_is_counted_with_its_datasets_vocabulary(tmp_path, capsys):
    """configs/paper.yaml's MoHGE run has the dataset's 65,536-token vocabulary: 2.651 B, as docs/serving.md says."""
    out = tmp_path / "p.json"
    assert param_report.main([str(ROOT / "configs" / "paper.yaml"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["run"] == "web-mohge-s0"
    assert data["total"]["embeddings"] == 65536 * 1024
    assert data["total_sum"] == params.count_params(_planned("paper")["web-mohge-s0"].model)["total_sum"]
    assert "2.651B" in text and "web-mohge-s0" in text


@pytest.mark.parametrize("overlay", ["claims", "ablations", "frontier", "capacity"])
def test_an_overlay_config_is_counted_merged_over_the_default_config(overlay, tmp_path):
    """An overlay (a config that extends configs/config.yaml) is counted as the workflow plans it."""
    out = tmp_path / "p.json"
    assert param_report.main([str(config_path(overlay)), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    runs = _planned(overlay)
    assert data["run"] == next(name for name, cfg in runs.items() if cfg.family == "mohge")
    assert data["total"] == params.param_totals(runs[data["run"]].model)


def test_run_picks_one_planned_run_and_an_unknown_name_lists_the_runs(tmp_path):
    out = tmp_path / "p.json"
    paper = str(ROOT / "configs" / "paper.yaml")
    assert param_report.main([paper, "--run", "web-moe-s0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["run"] == "web-moe-s0"
    assert data["total"] == params.param_totals(_planned("paper")["web-moe-s0"].model)
    with pytest.raises(ConfigError, match=r"^--run 'web-nope-s0': not a run of .*paper\.yaml \(runs: web-mohge-s0, "):
        param_report.main.__wrapped__([paper, "--run", "web-nope-s0"])


def test_a_config_of_several_sizes_without_a_mohge_run_needs_run(tmp_path):
    """No MoHGE run to count by default and runs of different sizes: the refusal lists the runs to pick from."""
    config = tmp_path / "moe.yaml"
    config.write_text(
        "study: moe_only\nexperiments:\n  - dataset: graded\n    families: [moe, dense]\n    seeds: [0]\n"
    )
    with pytest.raises(ConfigError, match=r"^--run: .*moe\.yaml plans runs of 2 sizes and no MoHGE run.*graded-moe-s0"):
        param_report.main.__wrapped__([str(config)])
    assert param_report.main([str(config), "--run", "graded-dense-s0"]) == 0


def test_a_model_preset_and_a_resolved_run_config_are_counted_as_they_are(tmp_path):
    from mohge_studies.config.runs import to_dict

    run = _planned("paper")["web-mohge-s0"]
    resolved = tmp_path / "config.json"
    resolved.write_text(json.dumps(to_dict(run)))
    preset = PRESETS / "mohge-3b.yaml"
    for path, want in ((resolved, run.model), (preset, load_model_config(preset))):
        out = tmp_path / "p.json"
        assert param_report.main([str(path), "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["total"] == params.param_totals(want) and "run" not in data
