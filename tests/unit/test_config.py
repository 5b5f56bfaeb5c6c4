"""Every bad config is refused before anything is built, with a message naming the key and the value."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from mohge.config import ConfigError, ModelConfig, RunConfig, load_model_config, load_run_config, to_dict

GOOD_FFN = {"kind": "mohge", "num_experts": 64, "expert_widths": [384, 512, 640, 768, 896, 1024, 1152, 1280]}


def model(ffn=None, router=None, **top):
    return {"model": {**top, "ffn": {**GOOD_FFN, **(ffn or {})}, "router": router or {}}}


@pytest.mark.parametrize(
    ("cfg", "key", "value"),
    [
        (model(ffn={"num_experts": 60}), "model.ffn.num_experts", "60"),
        (model(router={"group_topk": 9}), "model.router.group_topk", "9"),
        (model(router={"topk": 33, "group_topk": 4}), "model.router.topk", "33"),
        (model(ffn={"expert_widths": [384, 512, 0, 768, 896, 1024, 1152, 1280]}), "model.ffn.expert_widths[2]", "0"),
        (model(ffn={"expert_widths": [384, -5, 640, 768, 896, 1024, 1152, 1280]}), "model.ffn.expert_widths[1]", "-5"),
        (model(ffn={"kind": "mixture"}), "model.ffn.kind", "mixture"),
        (model(ffn={"gate": 1}), "model.ffn.gate", "unknown key"),
        (model(router={"gate_mode": "softest"}), "model.router.gate_mode", "softest"),
        # all-size allocation: even G and widths symmetric around the mean
        (model(ffn={"num_experts": 63, "expert_widths": [100, 200, 300]}), "model.ffn.expert_widths", "even G"),
        (model(ffn={"expert_widths": [384, 512, 640, 768, 896, 1024, 1152, 2000]}), "model.ffn.expert_widths", "symm"),
        (model(ffn={"ep_size": 3}), "model.ffn.ep_size", "3"),
        (model(ffn={"ep_size": 64}), "model.ffn.ep_size", "64"),  # one expert per rank: unbalanced
        (model(ffn={"kind": "moe", "placement": "contiguous"}), "model.ffn.expert_widths", "one width"),
        (model(ffn={"dense_layers": 7}, n_layers=4), "model.ffn.dense_layers", "7"),
        (model(n_heads=3), "model.n_heads", "3"),
        ({"train": {"steps": 10, "warmup_steps": 10}}, "train.warmup_steps", "10"),
        ({"train": {"lr": "fast"}}, "train.lr", "fast"),
        ({"train": {"batch_size": 6, "grad_accum": 4}}, "train.grad_accum", "4"),
        ({"loss": {"group_aux_start_frac": 1.5}}, "loss.group_aux_start_frac", "1.5"),
        ({"loss": {"group_cost_weights": [1.0, 2.0]}}, "loss.group_cost_weights", "one weight per group"),
        ({"data": {"sorce": "graded"}}, "data", "sorce"),
        ({"data": {"vocab_size": 4096}, "model": {"vocab_size": 2048}}, "data.vocab_size", "4096"),
        ({"epochs": 3}, "epochs", "unknown key"),
    ],
)
def test_bad_config_refused_naming_key(cfg, key, value):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(cfg)
    msg = str(err.value)
    assert key in msg, msg
    assert value in msg, msg


@pytest.mark.parametrize(
    ("key", "alias", "name"),
    [(("model", "router", "gate_mode"), "code_exact", "softmax_topk_probs"),
     (("loss", "expert_aux_mode"), "code", "all_experts_sparse")],
)  # fmt: skip
def test_a_value_named_by_its_alias_is_read_as_its_name(tmp_path, key, alias, name):
    """A YAML or JSON config, and a section built in code, may name a value by its alias; what the code reads, and
    what a resolved config writes, is the value's name. The workflow's schema accepts both."""
    cfg: dict = {}
    node = cfg
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = alias
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    for read in (RunConfig.from_dict(cfg), load_run_config(path)):
        section = read.model.router if key[0] == "model" else read.loss
        assert getattr(section, key[-1]) == name
        assert json.dumps(to_dict(read)).count(f'"{alias}"') == 0
    section_cls = type(RunConfig().model.router if key[0] == "model" else RunConfig().loss)
    assert getattr(section_cls(**{key[-1]: alias}), key[-1]) == name
    schema = json.loads((ROOT / "workflow" / "schemas" / "config.schema.json").read_text())
    entries = list(_schema_entries(schema, key[-1]))
    assert entries and all(name in e["enum"] for e in entries)
    assert all(alias in e["enum"] and f"also accepted: {alias} = {name}" in e["description"] for e in entries)


def _schema_entries(node, key: str):
    """Every schema entry of a property named ``key``, at any depth."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "properties" and isinstance(v, dict) and key in v:
                yield v[key]
            yield from _schema_entries(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _schema_entries(v, key)


def test_defaults_are_the_release_and_round_trip(tmp_path):
    cfg = RunConfig.from_dict(model())
    assert cfg.model.ffn.expert_widths == (384, 512, 640, 768, 896, 1024, 1152, 1280)
    assert (cfg.model.router.topk, cfg.model.router.group_topk) == (6, 4)
    assert cfg.loss.group_aux_coeff == 1e-5 and cfg.loss.expert_aux_coeff == 5e-3
    assert cfg.loss.group_cost_interval == 1024 and cfg.loss.group_aux_start_frac == 0.5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_dict(cfg)))
    assert load_run_config(path) == cfg


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_model_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("d_model: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_model_config(bad)


def test_presets_load():
    for name in ("mohge-3b", "moe-3b"):
        cfg = load_model_config(ROOT / "configs" / "models" / f"{name}.yaml")
        assert isinstance(cfg, ModelConfig) and cfg.n_layers == 15


# ------------------------------------------------------------------------------------------------
# Names are identifiers; YAML errors name file, line and column
# ------------------------------------------------------------------------------------------------

HOSTILE_NAMES = ["x`touch PWNED`", "$(id)", "a;b", "../../x", "a/b", "..", "", "-rf", "a b"]


@pytest.mark.parametrize("bad", HOSTILE_NAMES)
@pytest.mark.parametrize("key", ["name", "family", "dataset", "variant"])
def test_run_names_are_identifiers(key, bad):
    if key == "variant" and bad == "":
        return  # '' means "no variant"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({key: bad})
    msg = str(err.value)
    assert msg.startswith(f"{key}=") and "\n" not in msg


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("train:\n  steps: 10\n  lr: [1, 2\nmodel: {}\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(bad)
    msg = str(err.value)
    assert msg.startswith(f"{bad}:") and "\n" not in msg
    line, col = msg[len(str(bad)) + 1 :].split(":")[:2]
    assert int(line) >= 3 and int(col) >= 1
    (tmp_path / "bad.json").write_text('{"train": {"steps": 10,}}')
    with pytest.raises(ConfigError, match=r"bad\.json:1:\d+: not valid JSON"):
        load_run_config(tmp_path / "bad.json")
