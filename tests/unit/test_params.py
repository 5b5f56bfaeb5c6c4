"""Parameter counts: the worked numbers of docs/method.md §9 for the released 3B config; counts that match the model."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, tiny_model_config

from mohge.config import load_model_config
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
    rc = params.main([str(PRESETS / "mohge-3b.yaml"), "--compare", str(PRESETS / "moe-3b.yaml"), "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "-18.75%" in text
    data = json.loads(out.read_text())
    assert data["total"]["routed_experts"] == 14 * 8 * 3 * 1024 * sum(range(384, 1281, 128))
