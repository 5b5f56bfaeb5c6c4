"""The experiment plan: from the workflow config to one resolved, validated ``RunConfig`` per run.

The Snakefile calls :func:`plan` at parse time, so every run's config is built and checked (strictly, by the
dataclasses of :mod:`mohge.config`) before any job starts. A run is ``{dataset}-{family}-s{seed}``; its model
is the workflow's MoHGE ``model`` section with the family's matched baseline derived by :mod:`mohge.matched`,
its vocabulary and context taken from the dataset.

Workflow config keys (see ``configs/README.md``): ``datasets`` (name -> data section), ``model``, ``loss``,
``train``, ``eval`` (shared by every run), ``experiments`` (a list of {dataset, families, seeds, variants}),
``moe_width`` (the homogeneous baseline's width; null = the release's ratio), ``utilization``, ``figures``.

    python -m mohge.runs schema          # the JSON schema of the workflow config (workflow/schemas/)
    python -m mohge.runs list CONFIG...  # the runs a config plans (several files merge, as with --configfile)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from .cli import user_errors
from .config import (
    ConfigError,
    EvalConfig,
    LossConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    load_yaml_or_json,
    to_dict,
)
from .matched import FAMILIES, derive

PLACEMENTS_FOR_STUDY = ("contiguous", "all_size", "modse_pairs", "flop_lpt")


def run_name(dataset: str, family: str, seed: int, variant: str = "") -> str:
    return f"{dataset}-{family}-{variant}-s{seed}" if variant else f"{dataset}-{family}-s{seed}"


def _section(config: dict, key: str) -> dict:
    value = config.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}={value!r}: expected a mapping")
    return value


def merge_config(base: dict, over: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


VARIANT_SECTIONS = ("model", "loss", "train", "eval")


def _variants(exp: dict, where: str) -> dict[str, dict]:
    """An experiment's variants: name -> overrides of the shared sections ({"": {}} when it has none).

    A variant changes the MoHGE ``model`` (before each family is derived from it), ``loss``, ``train`` or
    ``eval``; e.g. ``{release: {}, renorm: {model: {router: {gate_mode: product_renorm}}}}``.
    """
    variants = exp.get("variants")
    if variants is None:
        return {"": {}}
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{where}.variants={variants!r}: expected a non-empty mapping name -> overrides")
    for name, over in variants.items():
        if not isinstance(name, str) or not name.replace("_", "").isalnum():
            raise ConfigError(f"{where}.variants: name {name!r} must be letters, digits and underscores")
        bad = sorted(set(over or {}) - set(VARIANT_SECTIONS))
        if bad:
            raise ConfigError(f"{where}.variants.{name}.{bad[0]}: unknown key (known: {', '.join(VARIANT_SECTIONS)})")
    return {name: over or {} for name, over in variants.items()}


def plan(config: dict) -> dict[str, RunConfig]:
    """All runs of a workflow config, resolved and validated; raises ConfigError naming the bad key."""
    datasets = _section(config, "datasets")
    if not datasets:
        raise ConfigError("datasets: at least one dataset is needed")
    experiments = config.get("experiments") or []
    if not experiments:
        raise ConfigError("experiments: at least one experiment is needed")
    runs: dict[str, RunConfig] = {}
    for i, exp in enumerate(experiments):
        where = f"experiments[{i}]"
        ds = exp.get("dataset")
        if ds not in datasets:
            raise ConfigError(f"{where}.dataset={ds!r}: not one of the datasets {sorted(datasets)}")
        data = datasets[ds]
        for variant, over in _variants(exp, where).items():
            shared = {k: merge_config(_section(config, k), over.get(k, {})) for k in VARIANT_SECTIONS}
            model_dict = {
                **shared["model"],
                "vocab_size": data.get("vocab_size", 2048),
                "max_seq_len": data.get("seq_len", 256),
            }
            mohge_cfg = ModelConfig.from_dict(model_dict, "model")
            for fam in exp.get("families", []):
                if fam not in FAMILIES:
                    raise ConfigError(f"{where}.families: {fam!r} is not one of {FAMILIES}")
                seeds = exp.get("seeds", {})
                fam_seeds = seeds.get(fam, seeds.get("default", [0])) if isinstance(seeds, dict) else seeds
                model = derive(mohge_cfg, fam, config.get("moe_width"))
                for seed in fam_seeds:
                    name = run_name(ds, fam, seed, variant)
                    if name in runs:
                        raise ConfigError(f"{where}: run {name} is planned twice")
                    runs[name] = RunConfig.from_dict(
                        {
                            "name": name,
                            "family": fam,
                            "variant": variant,
                            "dataset": ds,
                            "model": to_dict(model),
                            "loss": shared["loss"],
                            "train": {**shared["train"], "seed": seed},
                            "data": data,
                            "eval": shared["eval"],
                        }
                    )
    return runs


# ---------------------------------------------------------------- JSON schema, generated from the dataclasses


def _schema_of(tp: Any) -> dict:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_schema_of(a) for a in typing.get_args(tp) if a is not type(None)]
        return {"anyOf": [*options, {"type": "null"}]}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props = {f.name: _schema_of(hints[f.name]) for f in dataclasses.fields(tp) if f.init and f.name != "_path"}
        return {"type": "object", "additionalProperties": False, "properties": props}
    if origin is tuple:
        args = typing.get_args(tp)
        return {"type": "array", "items": _schema_of(args[0])}
    if tp is dict or origin is dict:
        return {"type": "object"}
    return {
        int: {"type": "integer"},
        float: {"type": "number"},
        bool: {"type": "boolean"},
        str: {"type": "string"},
    }[tp]


def workflow_schema() -> dict:
    """JSON schema of the workflow config; ``additionalProperties: false`` at every level."""
    from .data import DataConfig

    data = _schema_of(DataConfig)
    model = _schema_of(ModelConfig)
    for key in ("vocab_size", "max_seq_len"):  # taken from the dataset
        model["properties"].pop(key)
    loss, train, evalc = _schema_of(LossConfig), _schema_of(TrainConfig), _schema_of(EvalConfig)
    seeds = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    experiment = {
        "type": "object",
        "additionalProperties": False,
        "required": ["dataset", "families"],
        "properties": {
            "dataset": {"type": "string"},
            "families": {"type": "array", "items": {"enum": list(FAMILIES)}, "minItems": 1},
            "variants": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"model": model, "loss": loss, "train": train, "eval": evalc},
                        },
                    ]
                },
            },
            "seeds": {
                "anyOf": [
                    seeds,
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {k: seeds for k in (*FAMILIES, "default")},
                    },
                ]
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mohge workflow config (generated by `python -m mohge.runs schema`; do not edit by hand)",
        "type": "object",
        "additionalProperties": False,
        "required": ["datasets", "experiments"],
        "properties": {
            "study": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]*$"},  # results/<study>/, figures/<study>/
            "cluster": {  # SLURM sizes of a training job (the workflow's train rule and launcher)
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "nodes": {"type": "integer", "minimum": 1},
                    "gpus_per_node": {"type": "integer", "minimum": 0},
                    "cpus_per_task": {"type": "integer", "minimum": 1},
                    "mem_gb": {"type": "integer", "minimum": 1},
                    "runtime_min": {"type": "integer", "minimum": 1},
                },
            },
            "datasets": {"type": "object", "additionalProperties": data, "minProperties": 1},
            "model": model,
            "loss": loss,
            "train": train,
            "eval": evalc,
            "experiments": {"type": "array", "items": experiment, "minItems": 1},
            "moe_width": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
            "utilization": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "strategies": {"type": "array", "items": {"enum": list(PLACEMENTS_FOR_STUDY)}},
                    "ep_sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                    "measure_nproc": {"type": "integer", "minimum": 0},
                    "measure_tokens": {"type": "integer", "minimum": 1},
                },
            },
            "figures": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"bench_csv": {"type": "string"}},
            },
        },
    }


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mohge.runs", description="Experiment plan and config schema.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("schema", help="print the workflow config's JSON schema")
    ls = sub.add_parser("list", help="list the runs a workflow config plans")
    ls.add_argument("configs", nargs="+", help="config files, merged in order as Snakemake does (--configfile)")
    args = ap.parse_args(argv)
    if args.cmd == "schema":
        print(json.dumps(workflow_schema(), indent=2))
        return 0
    config: dict = {}
    for path in args.configs:
        config = merge_config(config, load_yaml_or_json(path))
    runs = plan(config)
    for name, cfg in runs.items():
        print(f"{name:<32} {cfg.model.ffn.kind:<6} steps={cfg.train.steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
