"""The experiment plan: families x seeds x variants, every run validated before anything runs."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from mohge.config import ConfigError
from mohge.runs import plan

BASE = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())


def with_experiments(*experiments) -> dict:
    return {**BASE, "experiments": list(experiments)}


def test_default_configs_plan_the_documented_runs():
    default = plan(yaml.safe_load((ROOT / "configs" / "config.yaml").read_text()))
    assert len(default) == 11 and "shakespeare-mohge-s2" in default and "graded-hmoe-s0" in default
    assert default["shakespeare-moe-s0"].model.ffn.expert_widths == (256,)
    paper = plan(yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text()))
    assert paper["web-mohge-s0"].model.ffn.expert_widths == (384, 512, 640, 768, 896, 1024, 1152, 1280)
    assert paper["web-moe-s0"].model.ffn.expert_widths == (1024,)


def test_variants_override_before_families_are_derived():
    runs = plan(
        with_experiments(
            {
                "dataset": "graded",
                "families": ["mohge", "moe"],
                "seeds": [0, 1],
                "variants": {
                    "release": None,
                    "renorm": {"model": {"router": {"gate_mode": "product_renorm"}}},
                    "wide": {"model": {"ffn": {"expert_widths": [32, 40, 48, 56]}}, "loss": {"expert_aux_coeff": 0.05}},
                },
            }
        )
    )
    assert len(runs) == 2 * 2 * 3
    assert runs["graded-mohge-renorm-s1"].model.router.gate_mode == "product_renorm"
    assert runs["graded-mohge-release-s0"].model.router.gate_mode == "code_exact"
    assert runs["graded-mohge-renorm-s1"].variant == "renorm" and runs["graded-mohge-renorm-s1"].train.seed == 1
    # the homogeneous MoE is re-derived from the variant's widths: mean 44 / 0.8125 -> 54 -> 56
    assert runs["graded-moe-wide-s0"].model.ffn.expert_widths == (56,)
    assert runs["graded-moe-wide-s0"].loss.expert_aux_coeff == 0.05
    assert runs["graded-moe-release-s0"].loss.expert_aux_coeff == 5e-3


@pytest.mark.parametrize(
    ("variants", "needle"),
    [
        ({"x": {"optimizer": {}}}, "variants.x.optimizer"),
        ({"bad-name": {}}, "bad-name"),
        ({"x": {"model": {"router": {"gate_mode": "nope"}}}}, "gate_mode"),
        ({}, "variants"),
    ],
)
def test_bad_variants_are_refused_naming_the_key(variants, needle):
    with pytest.raises(ConfigError, match=needle):
        plan(with_experiments({"dataset": "graded", "families": ["mohge"], "variants": variants}))


def test_a_run_planned_twice_is_refused():
    exp = {"dataset": "graded", "families": ["mohge"], "seeds": [0]}
    with pytest.raises(ConfigError, match="planned twice"):
        plan(with_experiments(exp, exp))
