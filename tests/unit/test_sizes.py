"""The torch-free sizes (mohge.config.sizes) equal the meta-device counts of the model that trains
(mohge.model.params.meta_totals), component by component, for every run of every committed config, the release's
presets and the variants a config may set (latent attention, tied embeddings, no shared expert)."""

from __future__ import annotations

import dataclasses

import mohge_studies
import pytest
import yaml
from conftest import ROOT, config_path
from mohge_studies.config.runs import merge_config, plan

from mohge.config import load_model_config
from mohge.config.sizes import param_totals
from mohge.model.params import meta_totals

CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml")) + sorted(mohge_studies.STUDIES)


def models_of(name: str) -> dict[str, object]:
    base = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
    cfg = merge_config(base, yaml.safe_load(config_path(name).read_text()))
    distinct = {}
    for run, rc in plan(cfg, preflight=False).items():
        distinct.setdefault(rc.model, run)
    return {run: model for model, run in distinct.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_closed_forms_equal_the_meta_model_for_every_run_of_a_config(name):
    for run, model in models_of(name).items():
        assert param_totals(model) == meta_totals(model), run


@pytest.mark.parametrize("preset", ["mohge-3b", "moe-3b"])
def test_closed_forms_equal_the_meta_model_for_the_release_presets(preset):
    model = load_model_config(str(ROOT / "configs" / "models" / f"{preset}.yaml"))
    assert param_totals(model) == meta_totals(model)


def test_closed_forms_follow_latent_attention_tied_embeddings_and_no_shared_expert():
    model = next(iter(models_of("smoke.yaml").values()))
    for change in (
        {"attention": "mla", "mla_q_head_dim": 8, "mla_rope_head_dim": 4, "mla_v_head_dim": 8, "mla_kv_lora_rank": 16},
        {"tie_embeddings": True},
        {"ffn": dataclasses.replace(model.ffn, shared_expert_width=0, dense_layers=0)},
    ):
        variant = dataclasses.replace(model, **change)
        assert param_totals(variant) == meta_totals(variant), change


def test_collect_reads_the_training_logs_without_torch():
    """``mohge collect`` (the study tables' step) imports no torch: the L_G schedule sits beside LossConfig."""
    import subprocess
    import sys

    code = "import sys, mohge_studies.analysis.collect; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
