"""The experiment plan: families x seeds x variants, every run validated before anything runs."""

from __future__ import annotations

import copy
import json
import re
import time

import pytest
import yaml
from conftest import ROOT, config_path
from mohge_studies.config.runs import main as runs_main
from mohge_studies.config.runs import merge_config, plan, workflow_schema

from mohge.config import ConfigError

BASE = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """mohge.evaluate sets HF_*_OFFLINE in the process it runs in: plan here as on a fresh shell."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


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
    assert runs["graded-mohge-release-s0"].model.router.gate_mode == "softmax_topk_probs"
    assert runs["graded-mohge-renorm-s1"].variant == "renorm" and runs["graded-mohge-renorm-s1"].train.seed == 1
    # the homogeneous MoE is re-derived from the variant's widths: mean 44 / 0.8125 -> 54 -> 56
    assert runs["graded-moe-wide-s0"].model.ffn.expert_widths == (56,)
    assert runs["graded-moe-wide-s0"].loss.expert_aux_coeff == 0.05
    assert runs["graded-moe-release-s0"].loss.expert_aux_coeff == 5e-3


@pytest.mark.parametrize(
    ("variants", "needle"),
    [
        ({"x": {"optimizer": {}}}, "variants.x.optimizer"),
        ({"bad/name": {}}, "bad/name"),
        ({"my-var": {}}, "variants='my-var': '-' separates the parts of a run name"),
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


# ------------------------------------------------------------------------------------------------
# Names: injection and path escape through every name-bearing key
# ------------------------------------------------------------------------------------------------

HOSTILE = ["x`touch PWNED`", "$(id)", "a;b", "../../x", "a/b", ".."]


def _rename_dataset(cfg: dict, bad: str) -> None:
    cfg["datasets"] = {bad: cfg["datasets"]["graded"]}
    for exp in cfg["experiments"]:
        exp["dataset"] = bad


NAME_KEYS = {
    "datasets": _rename_dataset,
    "study": lambda cfg, bad: cfg.update(study=bad),
    "variants": lambda cfg, bad: cfg["experiments"][1].update(variants={bad: {}}),
    "families": lambda cfg, bad: cfg["experiments"][0].update(families=[bad]),
}


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize("key", list(NAME_KEYS))
def test_hostile_names_are_refused_in_one_line_naming_the_key(tmp_path, key, bad):
    cfg = copy.deepcopy(BASE)
    NAME_KEYS[key](cfg, bad)
    with pytest.raises(ConfigError) as err:
        plan(cfg)
    msg = str(err.value)
    assert "\n" not in msg and (msg.startswith(key) or f".{key}" in msg), msg
    assert not (tmp_path / "PWNED").exists()
    assert not schema_accepts(cfg)


# ------------------------------------------------------------------------------------------------
# One validator, one answer: plan() and the generated JSON schema refuse the same configs
# ------------------------------------------------------------------------------------------------


def schema_accepts(cfg: dict) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(workflow_schema()).is_valid(cfg)


def _set(path: str, value):
    def apply(cfg: dict) -> None:
        *parents, last = path.split(".")
        node = cfg
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        node[last] = value

    return apply


BAD_CONFIGS = {
    "trian": (_set("trian", {"steps": 3}), "trian: unknown top-level key"),
    "model.foo": (_set("model.foo", 1), "model.foo: unknown key"),
    "seeds": (_set("experiments.1.seeds", []), "experiments[1].seeds=[]"),
    "zero width": (_set("model.ffn.expert_widths", [0, 24, 32, 40]), "model.ffn.expert_widths[0]=0"),
    "empty model": (_set("model", None), "model=None"),
    "negative steps": (_set("train.steps", -1), "train.steps=-1"),
    "bad backend": (_set("model.ffn.backend", "cuda"), "model.ffn.backend='cuda'"),
    "beta1": (_set("train.beta1", 1.0), "train.beta1=1.0"),
    "experiment key": (_set("experiments.0.seed", [0]), "experiments[0].seed: unknown key"),
    "cluster key": (_set("cluster.gpu", 1), "cluster.gpu: unknown key"),
    "utilization": (_set("utilization.strategies", ["random"]), "utilization.strategies[0]='random'"),
    "data key": (_set("datasets.graded.vocab", 5), "datasets.graded.vocab: unknown key"),
    "levels": (_set("datasets.graded.graded_levels", []), "datasets.graded.graded_levels=()"),
    "moe_width": (_set("moe_width", 0), "moe_width=0"),
    "experiment moe_width": (_set("experiments.0.moe_width", -8), "experiments[0].moe_width=-8"),
    "analysis": (_set("analysis.alpha", 1.5), "analysis.alpha=1.5"),
    "variant with '-'": (_set("experiments.0.variants", {"my-var": {}}), "'-' separates the parts of a run name"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_plan_and_schema_refuse_the_same_configs(case):
    mutate, needle = BAD_CONFIGS[case]
    cfg = copy.deepcopy(BASE)
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        plan(cfg)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not schema_accepts(cfg), f"the schema accepts what plan() refuses: {case}"


@pytest.mark.parametrize(
    "names",
    [
        ["config.yaml"],
        ["smoke.yaml"],
        ["paper.yaml"],
        ["config.yaml", "ablations"],
        ["config.yaml", "frontier"],
        ["config.yaml", "capacity"],
        ["config.yaml", "claims"],
        ["config.yaml", "gpu"],
        ["config.yaml", "gpu_capacity"],
    ],
)
def test_shipped_configs_pass_plan_and_schema(names):
    cfg: dict = {}
    for name in names:  # merged in order, as with --configfile
        cfg = merge_config(cfg, yaml.safe_load(config_path(name).read_text()))
    assert plan(cfg) and schema_accepts(cfg)
    assert schema_accepts({**cfg, "study": "s1", "cluster": {"nodes": 2, "gpus_per_node": 4}})


def test_committed_schema_is_the_generated_one():
    committed = json.loads((ROOT / "workflow" / "schemas" / "config.schema.json").read_text())
    assert committed == workflow_schema(), "regenerate: mohge runs schema > workflow/schemas/..."


def test_schema_carries_enums_ranges_and_descriptions():
    schema = workflow_schema()
    ffn = schema["properties"]["model"]["properties"]["ffn"]
    assert ffn["properties"]["backend"]["enum"] == ["auto", "triton", "grouped_mm", "torch", "loop"]
    assert ffn["properties"]["num_experts"]["exclusiveMinimum"] == 0
    assert ffn["properties"]["expert_widths"]["minItems"] == 1
    assert ffn["properties"]["expert_widths"]["items"]["exclusiveMinimum"] == 0
    assert ffn["description"] and ffn["properties"]["placement"]["description"]
    assert schema["properties"]["train"]["properties"]["beta1"]["anyOf"][0]["exclusiveMaximum"] == 1


def test_runs_list_refuses_in_one_line_with_status_2(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "experiments": [{**BASE["experiments"][0], "seeds": []}]}))
    assert runs_main(["list", str(path)]) == 2
    assert "experiments[0].seeds=[]" in caplog.text


# ------------------------------------------------------------------------------------------------
# Refused at plan time: files, tasks, backend on a CPU, the hub while offline
# ------------------------------------------------------------------------------------------------


def text_config(*patterns: str) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["datasets"]["graded"] = {"source": "text", "text_files": list(patterns), "vocab_size": 300, "seq_len": 32}
    return cfg


def test_text_files_are_checked_at_plan_time(tmp_path):
    good = tmp_path / "a.txt"
    good.write_text("to be or not to be\n" * 20)
    assert plan(text_config(str(good)))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    for pattern, needle in [
        (str(tmp_path / "nothing*.txt"), "matches no file"),
        (str(tmp_path / "missing.txt"), "matches no file"),
        (str(tmp_path / "empty.txt"), "empty.txt is empty"),
        (str(tmp_path / "latin1.txt"), "latin1.txt is not UTF-8 (byte 3)"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(needle)) as err:
            plan(text_config(str(good), pattern))
        assert str(err.value).startswith("data.text_files")


@pytest.mark.parametrize(
    ("eval_section", "needle"),
    [
        ({"tasks": ["mohge_ppl", "mohge_nonsense"]}, "eval.tasks[1]='mohge_nonsense': unknown task"),
        ({"tasks": ["hellaswag"]}, "eval.tasks[0]='hellaswag': a standard lm-eval task"),
    ],
)
def test_unknown_eval_tasks_are_refused_before_training(eval_section, needle):
    cfg = copy.deepcopy(BASE)
    cfg["eval"] = eval_section
    with pytest.raises(ConfigError, match=re.escape(needle)):
        plan(cfg)


def test_standard_tasks_plan_with_allow_hub():
    assert plan({**BASE, "eval": {"tasks": ["mohge_ppl", "hellaswag"], "allow_hub": True}})


def test_triton_backend_on_a_cpu_run_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr("mohge.config.preflight.cuda_present", lambda: False)
    cfg = copy.deepcopy(BASE)
    cfg["model"]["ffn"]["backend"] = "triton"
    with pytest.raises(ConfigError, match=r"model\.ffn\.backend='triton': the Triton kernels need a GPU"):
        plan(cfg)
    assert plan({**cfg, "cluster": {"gpus_per_node": 4}})  # planned on a login node for GPU nodes
    with pytest.raises(ConfigError, match="backend='triton'"):
        plan({**cfg, "cluster": {"gpus_per_node": 4}, "train": {**cfg["train"], "device": "cpu"}})


def test_hf_source_is_refused_fast_when_offline(monkeypatch):
    from mohge.config import DataConfig, preflight

    cfg = copy.deepcopy(BASE)
    cfg["datasets"]["graded"] = {"source": "hf", "hf_name": "some/corpus", "vocab_size": 300, "seq_len": 32}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
        plan(cfg)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert plan(cfg)  # the hub is asked when the data is prepared, not while planning
    monkeypatch.setattr(preflight, "HUB_HOST", "127.0.0.1")
    monkeypatch.setattr(preflight, "HUB_PORT", 9)  # nothing listens: refused at once
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"data.hf_name='some/corpus': the hub .* does not answer"):
        preflight.check_hub(DataConfig.from_dict(cfg["datasets"]["graded"]))
    assert time.perf_counter() - t0 < preflight.HUB_TIMEOUT_S + 1


def test_yaml_exponent_without_a_dot_is_a_number_for_both_validators():
    cfg = yaml.safe_load(yaml.safe_dump(BASE) + "loss:\n  expert_aux_coeff: 1e-3\n")
    assert cfg["loss"]["expert_aux_coeff"] == "1e-3"  # YAML 1.1: a string
    assert plan(cfg)["graded-mohge-s0"].loss.expert_aux_coeff == 1e-3 and schema_accepts(cfg)


def test_prepared_datasets_skip_the_input_checks(monkeypatch):
    cfg = copy.deepcopy(BASE)
    cfg["datasets"]["graded"] = {"source": "hf", "hf_name": "some/corpus", "vocab_size": 300, "seq_len": 32}
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_DATASETS_OFFLINE is set"):
        plan(cfg)
    assert plan(cfg, prepared={"graded"})  # prepared on a machine with network; trained offline


def test_an_experiment_may_set_its_own_moe_width():
    exp = {"dataset": "graded", "families": ["moe"], "seeds": [0]}
    runs = plan({**BASE, "moe_width": 48, "experiments": [exp, {**exp, "seeds": [1], "moe_width": 64}]})
    assert runs["graded-moe-s0"].model.ffn.expert_widths == (48,)
    assert runs["graded-moe-s1"].model.ffn.expert_widths == (64,)


def test_a_missing_hf_local_path_is_refused_at_plan_time_naming_the_key(tmp_path):
    """Not a FileNotFoundError traceback from the data job: one line naming datasets.<name>.hf_local_path."""
    cfg = copy.deepcopy(BASE)
    missing = tmp_path / "no-such-dataset"
    cfg["datasets"]["graded"] = {"source": "hf", "hf_local_path": str(missing), "vocab_size": 300, "seq_len": 32}
    with pytest.raises(ConfigError, match=rf"^datasets\.graded\.hf_local_path='{re.escape(str(missing))}': no such"):
        plan(cfg)
    missing.mkdir()  # a folder, but not one save_to_disk wrote
    with pytest.raises(ConfigError, match=r"^datasets\.graded\.hf_local_path=.*not a dataset saved with save_to_disk"):
        plan(cfg)
    (missing / "state.json").write_text("{}")
    assert plan(cfg)
    assert plan(
        {**cfg, "datasets": {"graded": {**cfg["datasets"]["graded"], "hf_local_path": "gone"}}}, prepared={"graded"}
    )
