"""Matched baselines (docs/method.md §8): every family derived from one MoHGE config by its rule."""

from __future__ import annotations

import pytest
from conftest import ROOT

from mohge.config import load_model_config
from mohge.config import sizes as params
from mohge.config.matched import all_families, default_moe_width, derive

PRESETS = ROOT / "configs" / "models"


def test_matched_families_follow_their_rules():
    cfg = load_model_config(PRESETS / "mohge-3b.yaml")
    assert default_moe_width(cfg) == 1024
    fams = all_families(cfg)
    c = {f: params.count_params(m) for f, m in fams.items()}
    assert c["mohge"]["total_sum"] / c["moe"]["total_sum"] == pytest.approx(0.84, abs=0.005)
    assert fams["moe"].ffn.expert_widths == (1024,)
    assert fams["moe_equal"].ffn.expert_widths == (832,)
    # equal total parameters up to the router rows (64 experts in both; MoHGE adds the 8-row group router)
    diff = c["mohge"]["total_sum"] - c["moe_equal"]["total_sum"]
    assert diff == 14 * 8 * 1024
    # equal activated FLOPs for MoHGE (uniform), HMoE, MoDSE and the equal-size MoE
    act = {f: c[f]["activated"]["routed_experts"] for f in ("mohge", "hmoe", "modse", "moe_equal")}
    assert len(set(act.values())) == 1, act
    assert fams["dense"].ffn.dense_width == 6 * 832 + 2048


def test_derive_refuses_unknown_family_and_non_mohge_source():
    cfg = load_model_config(PRESETS / "mohge-3b.yaml")
    with pytest.raises(ValueError, match="family='switch'"):
        derive(cfg, "switch")
    with pytest.raises(ValueError, match="derive from a mohge config"):
        all_families(all_families(cfg)["moe"])
