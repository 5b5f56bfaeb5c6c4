"""The experiment plan: from the workflow config to one resolved, validated ``RunConfig`` per run.

The Snakefile calls :func:`plan` at parse time, so every run's config is built and checked (strictly, by the
dataclasses of :mod:`mohge.config`) before any job starts. A run is ``{dataset}-{family}-s{seed}``; its model
is the workflow's MoHGE ``model`` section with the family's matched baseline derived by :mod:`mohge.config.matched`,
its vocabulary and context taken from the dataset.

Workflow config keys (see ``configs/README.md``): ``study`` (the name of the output roots), ``datasets`` (name ->
data section), ``model``, ``loss``, ``train``, ``eval`` (shared by every run), ``experiments`` (a list of {dataset,
families, seeds, variants}), ``moe_width`` (the homogeneous baseline's width; null = the release's ratio),
``utilization``, ``analysis`` (a study's statistics), ``figures``, ``cluster`` (SLURM resources), ``inference``
(per-run serving cost and the route-override knob points). Names
(datasets, variants, study) are identifiers (:func:`mohge.core.knobs.check_name`); :func:`plan` refuses every mistake
in one line naming the key, and then checks what the runs need from the world (:mod:`mohge.config.preflight`).

    mohge runs schema          # the JSON schema of the workflow config (workflow/schemas/)
    mohge runs list CONFIG...  # the runs a config plans (several files merge, as with --configfile)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from mohge_studies import DESIGNS as STUDY_DESIGNS

from mohge.config.data import DataConfig
from mohge.config.matched import FAMILIES, derive
from mohge.config.preflight import check_run
from mohge.config.sections import EvalConfig, LossConfig, ModelConfig, RunConfig, TrainConfig
from mohge.core.cli import user_errors
from mohge.core.knobs import (
    NAME_PATTERN,
    PART_PATTERN,
    ConfigError,
    _fail,
    _Section,
    check_bounds,
    check_name,
    knob,
    load_yaml_or_json,
    schema_of,
    to_dict,
)
from mohge.core.vocab import PLACEMENTS


@dataclass(frozen=True)
class UtilizationConfig(_Section):
    """The per-GPU utilization study: placement strategies and expert-parallel sizes it compares."""

    strategies: tuple[str, ...] = knob(PLACEMENTS, "placement strategies compared", choices=PLACEMENTS, min_items=1)
    ep_sizes: tuple[int, ...] = knob((2, 4), "expert-parallel sizes", ge=1, min_items=1)
    measure_nproc: int = knob(0, "processes of the measured EP run (0: none)", ge=0)
    trace_all_seeds: bool = knob(False, "trace every seed of a model, not only its first")
    untraced_datasets: tuple[str, ...] = knob((), "datasets whose runs are read on their results alone, never traced")
    _path: str = field(default="utilization", repr=False, compare=False)


@dataclass(frozen=True)
class FiguresConfig(_Section):
    """Inputs of the figures that are not produced by the workflow."""

    bench_csv: str = knob("results/bench/kernels.csv", "kernel benchmark CSV (committed)")
    _path: str = field(default="figures", repr=False, compare=False)


@dataclass(frozen=True)
class ClusterConfig(_Section):
    """SLURM resources of a training job and its launcher (srun + torchrun when nodes * gpus_per_node > 1)."""

    nodes: int = knob(1, "nodes per training job", ge=1)
    gpus_per_node: int = knob(0, "GPUs per node (0: train on CPUs)", ge=0)
    cpus_per_task: int = knob(1, "CPU cores per task (1: two CPU runs share a 2-core machine)", ge=1)
    mem_gb: int = knob(4, "memory per node in GB", ge=1)
    runtime_min: int = knob(60, "wall-clock limit of a training job in minutes", ge=1)
    _path: str = field(default="cluster", repr=False, compare=False)


def train_resources(cluster: ClusterConfig) -> dict:
    """The SLURM resources of a training job (the train rule's ``resources``) from the config's ``cluster`` section.

    One node: ``gpu`` (SLURM's --gpus) and no task count, which the jobstep plugin runs as one ``srun -n1`` step.
    Several nodes: an MPI-style job as the plugin documents it (``mpi`` set: the rule's command calls srun itself,
    so no srun is prepended), ``tasks`` = nodes (sbatch --ntasks N with --nodes N: one task per node), GPUs per node
    as GRES (a job-wide --gpus may land unevenly), and ``tasks_per_gpu=0``, without which the plugin turns ``tasks``
    of a GPU job into --ntasks-per-gpu. Memory and runtime are the config's limits on every attempt: a retry
    re-queues and resumes from the scratch checkpoints, it does not ask for more than the config states (the
    planner, :mod:`mohge_studies.analysis.sizing`, compares the plan's days with this runtime).
    """
    nodes, gpus = cluster.nodes, cluster.gpus_per_node
    fixed = {
        "nodes": nodes,
        "mem_mb": cluster.mem_gb * 1024,  # per node (sbatch --mem)
        "runtime": cluster.runtime_min,  # minutes
    }
    if nodes == 1:
        return {**fixed, "gpu": gpus}
    multi = {**fixed, "mpi": "srun", "tasks": nodes, "tasks_per_gpu": 0}
    return {**multi, "gres": f"gpu:{gpus}"} if gpus else multi


@dataclass(frozen=True)
class KnobPoints(_Section):
    """The cheaper routings each trained model is served at (mohge.evaluate.route_override); a point at or above a
    model's trained value, or one it cannot take, is left out for that model."""

    group_topk: tuple[int, ...] = knob((), "MoHGE: groups per token (K_g) below the trained value", ge=1)
    bar_widest: tuple[int, ...] = knob((), "MoHGE: widest groups no token may reach", ge=1)
    topk: tuple[int, ...] = knob((), "moe, hmoe, modse: experts per token below the trained top-k", ge=1)
    _path: str = field(default="inference.knob_points", repr=False, compare=False)


@dataclass(frozen=True)
class FrontierTest(_Section):
    """A declared test of the served frontier (docs/study.md "The served-frontier study"): one model's trained
    routing against another's served frontier at equal FLOPs per token, paired by seed; both empty: no test."""

    trained: str = knob("", "the model at its trained routing (family+variant as runs.csv names it)")
    served: str = knob("", "the model whose served points give the frontier (family+variant)")
    _path: str = field(default="inference.frontier_test", repr=False, compare=False)


@dataclass(frozen=True)
class InferenceConfig(_Section):
    """Per-run inference records (mohge bench inference): serving cost per token and validation
    perplexity along the knob points; a study whose config has this section gets them, a table and a figure."""

    enabled: bool = knob(True, "make the records (false: a config extending one that asks for them opts out)")
    knob_points: KnobPoints = knob(doc="the cheaper routings served", factory=KnobPoints)
    prompt_lengths: tuple[int, ...] = knob((16, 64, 128), "prefill prompt lengths (capped by the context)", ge=1)
    batch_sizes: tuple[int, ...] = knob((1, 16), "batch sizes of the cached decode", ge=1, min_items=1)
    decode_tokens: int = knob(16, "new tokens per timed decode (capped by the context)", ge=1)
    reps: int = knob(5, "timed rounds (median)", ge=1)
    eval_batches: int = knob(8, "validation batches of the cost and knob passes (0: the whole split)", ge=0)
    frontier_test: FrontierTest = knob(doc="the declared served-frontier test (T5_frontier)", factory=FrontierTest)
    _path: str = field(default="inference", repr=False, compare=False)


DESIGNS = tuple(STUDY_DESIGNS)  # the declared analyses (mohge_studies.DESIGNS)
# The capacity study's variant prefixes (docs/study.md): selection runs on a held-out seed, in no test; the arms the
# selection instantiates, out of the first analysis and in the best shot's
SELECTION = "sel_"
BEST_SHOT = "best_"


CAPACITY_GATES = ("G1", "G2", "G3")  # the capacity study's gate (docs/study.md "The capacity study")


@dataclass(frozen=True)
class AnalysisConfig(_Section):
    """A study's pre-declared statistical analysis (docs/study.md): the claims study's
    (mohge_studies.claims.analysis) or the capacity study's (studies/capacity/scripts/capacity_analysis.py,
    `design: capacity`)."""

    design: str = knob("claims", "which declared analysis: claims (tables S1-S5) or capacity (C1-C5)", choices=DESIGNS)
    alpha: float = knob(0.05, "significance level of every test", gt=0, lt=1)
    equivalence_margin: float = knob(
        0.03, "TOST margin on the perplexity ratio (claims); non-inferiority margin on B (capacity)", gt=0, lt=1
    )
    primary_metric: str = knob(
        "test_ppl",
        "primary endpoint (full split; capacity: bits_stored)",
        choices=("test_ppl", "val_ppl", "bits_stored"),
    )
    reference_family: str = knob("moe", "Q1: the MoE that MoHGE should equal", choices=FAMILIES)
    equal_family: str = knob("moe_equal", "Q1b: the equal-parameter MoE that MoHGE should beat", choices=FAMILIES)
    balance_ep: int = knob(4, "Q2: EP size the balance bar is read at (E / EP a multiple of G)", gt=0)
    balance_bar: float = knob(1.10, "Q2: all-size's max/mean interval must lie below this", gt=1)
    gate_ratio: float = knob(1.05, "capacity gate G1: 95 % lower bound of B_reference / B_equal above this", gt=1)
    gate_slope: float = knob(0.5, "capacity gate G2: the sweep's slope of log B on log parameters at least this", gt=0)
    unused_share: float = knob(0.01, "capacity: an expert is unused below this share of a uniform share", gt=0, lt=1)
    sweep: tuple[str, ...] = knob((), "capacity: the width sweep's models as runs.csv names them (family+variant)")
    quarter_dataset: str | None = knob(None, "capacity gate G3: the dataset of the saturation control")
    gates: tuple[str, ...] = knob(
        CAPACITY_GATES,
        "capacity: the gate's declared parts (G1 reference > equal, G2 the sweep's slope, G3 saturation)",
        choices=CAPACITY_GATES,
        min_items=1,
    )
    _path: str = field(default="analysis", repr=False, compare=False)

    def check(self) -> None:
        if (self.design == "capacity") != (self.primary_metric == "bits_stored"):
            why = "bits_stored goes with design: capacity, and only with it"
            _fail(self.key("primary_metric"), self.primary_metric, why)
        if self.design == "capacity" and "G2" in self.gates and len(self.sweep) < 4:
            _fail(self.key("sweep"), list(self.sweep), "the capacity gate G2 needs a sweep of at least four widths")


# Top-level keys of the workflow config (besides the sections above): see configs/README.md.
TOP_LEVEL = (
    "study",
    "datasets",
    "model",
    "loss",
    "train",
    "eval",
    "experiments",
    "moe_width",
    "utilization",
    "analysis",
    "figures",
    "cluster",
    "inference",
)
# model keys each run takes from its dataset (model key -> data key), so a config may not set them
DATASET_KEYS = {"vocab_size": "vocab_size", "max_seq_len": "seq_len"}
EXPERIMENT_KEYS = ("dataset", "families", "seeds", "variants", "moe_width")
SECTIONS = {
    "utilization": UtilizationConfig,
    "analysis": AnalysisConfig,
    "figures": FiguresConfig,
    "cluster": ClusterConfig,
    "inference": InferenceConfig,
}


def run_name(dataset: str, family: str, seed: int, variant: str = "") -> str:
    return f"{dataset}-{family}-{variant}-s{seed}" if variant else f"{dataset}-{family}-s{seed}"


def _section(config: dict, key: str) -> dict:
    """A mapping section of the config; absent is {} but a key left empty (``model:``) is refused."""
    if key not in config:
        return {}
    value = config[key]
    if not isinstance(value, dict):
        why = "an empty section: give its keys or remove the line" if value is None else "expected a mapping"
        raise ConfigError(f"{key}={value!r}: {why}")
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
        check_name(name, f"{where}.variants", part=True)
        if not isinstance(over or {}, dict):
            raise ConfigError(f"{where}.variants.{name}={over!r}: expected a mapping of section overrides")
        bad = sorted(set(over or {}) - set(VARIANT_SECTIONS))
        if bad:
            raise ConfigError(f"{where}.variants.{name}.{bad[0]}: unknown key (known: {', '.join(VARIANT_SECTIONS)})")
        for key in VARIANT_SECTIONS:
            _section(over or {}, key)  # an empty override (`model:`) is refused
    return {name: over or {} for name, over in variants.items()}


def _seeds(exp: dict, fam: str, where: str) -> list[int]:
    """The seeds of one family: a list for every family, or a mapping family|default -> list."""
    seeds = exp.get("seeds", [0])
    if isinstance(seeds, dict):
        bad = sorted(set(seeds) - {*FAMILIES, "default"})
        if bad:
            raise ConfigError(f"{where}.seeds.{bad[0]}: unknown key (known: {', '.join((*FAMILIES, 'default'))})")
        key = fam if fam in seeds else "default"
        where, seeds = f"{where}.seeds.{key}", seeds.get(key, [0])
    else:
        where = f"{where}.seeds"
    if not isinstance(seeds, list) or not seeds:
        raise ConfigError(f"{where}={seeds!r}: expected a non-empty list of seeds")
    for i, seed in enumerate(seeds):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"{where}[{i}]={seed!r}: a seed must be an integer >= 0")
    return seeds


def _moe_width(mapping: dict, key: str) -> int | None:
    width = mapping.get("moe_width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise ConfigError(f"{key}={width!r}: expected an integer >= 1 or null")
    return width


def _check_top_level(config: dict) -> None:
    """Top-level keys and the study-level sections (utilization, figures, cluster, study, moe_width)."""
    unknown = sorted(set(config) - set(TOP_LEVEL))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level key (known: {', '.join(TOP_LEVEL)})")
    check_name(config.get("study", "default"), "study")
    for key, cls in SECTIONS.items():
        cls.from_dict(_section(config, key), key)
    _moe_width(config, "moe_width")
    for name in VARIANT_SECTIONS:
        _section(config, name)


def plan(config: dict, preflight: bool = True, prepared: Collection[str] = ()) -> dict[str, RunConfig]:
    """All runs of a workflow config, resolved and validated; raises ConfigError naming the bad key.
    ``preflight``: also check what the runs need from the world (files, tasks, device; mohge.config.preflight), except
    the inputs of the datasets named in ``prepared`` (their data is already prepared).

    This is the validator of the workflow config: ``mohge runs list``, the Snakefile and (through the run
    configs it resolves) ``mohge.train`` share it, and the JSON schema is generated from the same sections.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"config={config!r}: expected a mapping")
    check_bounds(config)  # before anything walks it: Snakemake's --config values may hold YAML aliases too
    _check_top_level(config)
    datasets = _section(config, "datasets")
    if not datasets:
        raise ConfigError("datasets: at least one dataset is needed")
    for ds in datasets:
        check_name(ds, "datasets", part=True)
        DataConfig.from_dict(_section(datasets, ds), f"datasets.{ds}")
    experiments = config.get("experiments")
    if not isinstance(experiments, list) or not experiments:
        raise ConfigError(f"experiments={experiments!r}: at least one experiment is needed (a list)")
    runs: dict[str, RunConfig] = {}
    files_checked: set[str] = set()
    for i, exp in enumerate(experiments):
        where = f"experiments[{i}]"
        if not isinstance(exp, dict):
            raise ConfigError(f"{where}={exp!r}: expected a mapping with dataset, families, seeds, variants")
        bad = sorted(set(exp) - set(EXPERIMENT_KEYS))
        if bad:
            raise ConfigError(f"{where}.{bad[0]}: unknown key (known: {', '.join(EXPERIMENT_KEYS)})")
        ds = exp.get("dataset")
        if ds not in datasets:
            raise ConfigError(f"{where}.dataset={ds!r}: not one of the datasets {sorted(datasets)}")
        families = exp.get("families")
        if not isinstance(families, list) or not families:
            raise ConfigError(f"{where}.families={families!r}: expected a non-empty list of {FAMILIES}")
        data = datasets[ds]
        for variant, over in _variants(exp, where).items():
            shared = {k: merge_config(_section(config, k), over.get(k) or {}) for k in VARIANT_SECTIONS}
            for key in DATASET_KEYS:  # one validator: the schema has no such key either
                if key in shared["model"]:
                    at = f"{where}.variants.{variant}.model" if key in ((over or {}).get("model") or {}) else "model"
                    raise ConfigError(
                        f"{at}.{key}={shared['model'][key]!r}: taken from the dataset (datasets.{ds}."
                        f"{DATASET_KEYS[key]}); remove it"
                    )
            model_dict = {
                **shared["model"],
                "vocab_size": data.get("vocab_size", 2048),
                "max_seq_len": data.get("seq_len", 256),
            }
            mohge_cfg = ModelConfig.from_dict(model_dict, "model")
            for fam in families:
                if fam not in FAMILIES:
                    raise ConfigError(f"{where}.families: {fam!r} is not one of {FAMILIES}")
                width = _moe_width(exp, f"{where}.moe_width") if "moe_width" in exp else config.get("moe_width")
                model = derive(mohge_cfg, fam, width)
                for seed in _seeds(exp, fam, where):
                    name = run_name(ds, fam, seed, variant)
                    if name in runs:
                        raise ConfigError(f"{where}: run {name} is planned twice")
                    runs[name] = cfg = RunConfig.from_dict(
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
                    if preflight:
                        inputs = ds not in files_checked and ds not in prepared
                        check_run(cfg, config.get("cluster"), inputs=inputs)
                        files_checked.add(ds)
    _check_ep_sizes(config, runs)
    _check_frontier_test(config, runs)
    return runs


def _check_frontier_test(config: dict, runs: dict[str, RunConfig]) -> None:
    """``inference.frontier_test`` names two models the config plans (family+variant), or neither."""
    test = InferenceConfig.from_dict(config.get("inference") or {}, "inference").frontier_test
    if not (test.trained or test.served):
        return
    models = sorted({f"{c.family}+{c.variant}" if c.variant else c.family for c in runs.values()})
    for key in ("trained", "served"):
        name = getattr(test, key)
        if name not in models:
            _fail(test.key(key), name, f"not a model this config plans ({', '.join(models)})")


def _check_ep_sizes(config: dict, runs: dict[str, RunConfig]) -> None:
    """Every EP size of the utilization study must divide the expert count of every MoE run (the study places
    each traced model on each size; a size that does not fit would be skipped without a word)."""
    util = UtilizationConfig.from_dict(_section(config, "utilization"), "utilization")
    for i, ep in enumerate(util.ep_sizes):
        for name, cfg in runs.items():
            E = cfg.model.ffn.num_experts
            if cfg.family != "dense" and E % ep:
                raise ConfigError(
                    f"utilization.ep_sizes[{i}]={ep}: does not divide the {E} experts of run {name}; "
                    "use sizes that divide the expert count"
                )


# ---------------------------------------------------------------- JSON schema, generated from the dataclasses


def workflow_schema() -> dict:
    """JSON schema of the workflow config; ``additionalProperties: false`` at every level. Snakemake's
    ``validate`` and :func:`plan` refuse the same mistakes (plan also checks what a schema cannot say)."""
    data = schema_of(DataConfig)
    model = schema_of(ModelConfig)
    for key in ("vocab_size", "max_seq_len"):  # taken from the dataset
        model["properties"].pop(key)
    loss, train, evalc = schema_of(LossConfig), schema_of(TrainConfig), schema_of(EvalConfig)
    name = {"type": "string", "pattern": NAME_PATTERN.pattern}
    part = {"type": "string", "pattern": PART_PATTERN.pattern}
    seeds = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    overrides = {"type": "object", "additionalProperties": False}
    overrides["properties"] = {"model": model, "loss": loss, "train": train, "eval": evalc}
    experiment = {
        "type": "object",
        "additionalProperties": False,
        "description": "runs of one dataset: families x seeds x variants",
        "required": ["dataset", "families"],
        "properties": {
            "dataset": {**part, "description": "a key of datasets"},
            "moe_width": {
                "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "description": "this experiment's homogeneous baseline width (overrides the top-level one)",
            },
            "families": {"type": "array", "items": {"enum": list(FAMILIES)}, "minItems": 1},
            "variants": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": part,
                "additionalProperties": {"anyOf": [{"type": "null"}, overrides]},
                "description": "variant name -> overrides of model, loss, train, eval",
            },
            "seeds": {
                "anyOf": [
                    seeds,
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {k: seeds for k in (*FAMILIES, "default")},
                    },
                ],
                "description": "seeds of every family, or per family (with a default)",
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mohge workflow config (generated by `mohge runs schema`; do not edit by hand)",
        "type": "object",
        "additionalProperties": False,
        "required": ["datasets", "experiments"],
        "properties": {
            "study": {**name, "description": "outputs go to results/<study>/, figures/<study>/, ..."},
            "datasets": {
                "type": "object",
                "propertyNames": part,
                "additionalProperties": data,
                "minProperties": 1,
                "description": "dataset name -> its data section",
            },
            "model": model,
            "loss": loss,
            "train": train,
            "eval": evalc,
            "experiments": {"type": "array", "items": experiment, "minItems": 1},
            "moe_width": {
                "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "description": "width of the homogeneous baseline (null: the release's ratio)",
            },
            **{key: schema_of(cls) for key, cls in SECTIONS.items()},
        },
    }


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge runs", description="Experiment plan and config schema.")
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
