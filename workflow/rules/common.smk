# Validation, wildcard constraints and input functions; no rules here.
import functools
import glob
import hashlib
import json
import os
import re
import sys

import jsonschema

from mohge.config import SPLITS, DataConfig, load_yaml_or_json, to_dict
from mohge.runs import ClusterConfig, merge_config, plan


def refuse(message):
    """A config mistake: one line naming the key on stderr, no stack frames, no schema dump."""
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(2)


def checked_plan(config):
    """The schema (generated from mohge.config), then every run resolved by mohge.runs.plan."""
    with open(workflow.source_path("../schemas/config.schema.json")) as fh:
        schema = json.load(fh)
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    err = jsonschema.exceptions.best_match(errors)
    if err is not None:
        where = ".".join(str(p) for p in err.absolute_path) or "config"
        refuse(f"{where}: {err.message[:300]}")
    try:
        return plan(config)
    except ValueError as err:  # ConfigError included
        refuse(str(err))


def own_study(configfiles):
    """A config given with --configfile names its own `study`, else its runs would land in results/default."""
    for path in configfiles:
        try:
            data = load_yaml_or_json(path)
        except ValueError as err:
            refuse(str(err))
        if "study" in data:
            return
    if configfiles and "study" not in (workflow.config_settings.config or {}):
        refuse(
            f"study: {os.fspath(configfiles[-1])!r} sets no top-level `study:`; name one so its results do "
            "not overwrite results/default"
        )


def asked_targets():
    """The targets on snakemake's command line: the Snakefile is parsed before the API hands them over."""
    # .../bin/snakemake, or .../snakemake/__main__.py under `python -m snakemake`
    cli = os.path.normpath(sys.argv[0]).split(os.sep)[-2:]
    if cli[-1] != "snakemake" and cli != ["snakemake", "__main__.py"]:
        return set()
    from snakemake.cli import get_argument_parser

    args, _ = get_argument_parser().parse_known_args(sys.argv[1:])
    return set(args.targets or ())


# Asked for `figures` alone, the workflow holds only the table and figure rules: the committed CSVs are their
# sources, so no training, evaluation or collect job can enter the plan.
FROM_RESULTS = asked_targets() == {"figures"}
own_study(workflow.overwrite_configfiles)
RUNS = checked_plan(config)
# One root per config (its `study`): no config can write over another's committed results.
STUDY = config.get("study", "default")
RES = f"results/{STUDY}"
WORK = f"work/{STUDY}"
LOGS = f"logs/{STUDY}"

DATASETS = sorted({cfg.dataset for cfg in RUNS.values()})
UTIL = config.get("utilization", {})
# SLURM sizes of a training job; a CPU machine runs the default (one process, no GPU).
CLUSTER = to_dict(ClusterConfig.from_dict(config.get("cluster") or {}, "cluster"))


wildcard_constraints:
    run="|".join(map(re.escape, RUNS)),
    dataset="|".join(map(re.escape, DATASETS)),
    study="[A-Za-z0-9][A-Za-z0-9_-]*",


def digest(obj):
    """A short hash of a config section: a params entry, so a change reruns the job and the reason stays short."""
    blob = json.dumps(obj, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def train_section(run):
    """What a training result depends on: everything but the eval section."""
    return {k: v for k, v in to_dict(RUNS[run]).items() if k != "eval"}


def run_config_json(run):
    return json.dumps(to_dict(RUNS[run]), sort_keys=True, indent=2) + "\n"


def dataset_section(dataset):
    cfg = next(c for c in RUNS.values() if c.dataset == dataset)
    return {"data": cfg.data}


def data_config(dataset):
    """The DataConfig of a dataset (its shard count and source size the data jobs)."""
    return DataConfig.from_dict(dataset_section(dataset)["data"])


def data_parts(wildcards):
    """The shard jobs' manifests of a dataset: one data_shard job per shard (data.num_shards)."""
    n = data_config(wildcards.dataset).num_shards
    return [
        f"{WORK}/data/{wildcards.dataset}/shards/part-{i:05d}.json" for i in range(n)
    ]


def data_job_minutes(dataset, attempt, hub_minutes):
    """A data job's runtime: minutes for the small local sources, `hub_minutes` for a streamed hf corpus."""
    return (hub_minutes if data_config(dataset).source == "hf" else 20) * attempt


def data_dir(wildcards):
    return f"{WORK}/data/{RUNS[wildcards.run].dataset}"


def data_meta(wildcards):
    return f"{data_dir(wildcards)}/meta.json"


def trace_runs(runs=RUNS):
    """Runs whose routing traces feed the utilization study and F3: the first seed of each MoE model, or
    every seed of every MoE model with `utilization.trace_all_seeds` (balance with CIs over seeds).
    """
    if UTIL.get("trace_all_seeds", False):
        return sorted(r for r, c in runs.items() if c.family != "dense")
    first = {}
    for name, c in runs.items():
        key = (c.dataset, c.family, c.variant)
        if c.family != "dense" and (
            key not in first or c.train.seed < runs[first[key]].train.seed
        ):
            first[key] = name
    return sorted(first.values())


def in_checkout(path):
    """A relative path from the config, read from the workdir when it is there, else from the workflow's source."""
    return (
        path
        if os.path.isabs(path) or os.path.exists(path)
        else os.path.normpath(os.path.join(CHECKOUT, path))
    )


def util_source(runs=RUNS, config=config):
    """The routing trace F4 and T3 show: MoHGE on the main dataset (its first seed), else the first traced run."""
    main = config["experiments"][0]["dataset"]
    traced = trace_runs(runs)
    mohge = sorted(  # the main MoHGE (no variant) before its variants
        (r for r in traced if runs[r].family == "mohge" and runs[r].dataset == main),
        key=lambda r: (runs[r].variant != "", runs[r].train.seed, r),
    )
    return (mohge or traced or [""])[0]


# The workflow's own checkout, also when it is included as a module: job inputs and listed folders are read
# from here, not through source_path (whose runtime copies get a new mtime each time and so rerun jobs).
CHECKOUT = os.path.relpath(
    os.path.join(workflow.current_basedir.get_path_or_uri(secret_free=True), "..", "..")
)
CONFIGS = os.path.normpath(os.path.join(CHECKOUT, "configs"))
# Under --sdm conda, each env's post-deploy script (workflow/envs/*.post-deploy.sh) installs this checkout into it
os.environ.update(MOHGE_CHECKOUT=os.path.abspath(CHECKOUT))


@functools.lru_cache
def study_settings(study):
    """What the tables and figures of a study take from its config (the file in configs/ that names it,
    merged over the default as --configfile does): F4/T3's routing trace and F6's benchmark CSV.
    """
    cfg = config
    if study != STUDY:
        cfg = {"study": study}
        for path in sorted(glob.glob(os.path.join(CONFIGS, "*.yaml"))):
            data = load_yaml_or_json(path)
            if data.get("study") == study:
                cfg = merge_config(
                    load_yaml_or_json(os.path.join(CONFIGS, "config.yaml")), data
                )
    runs = plan(cfg) if "experiments" in cfg else {}
    return {
        "config": cfg,
        "source": util_source(runs, cfg) if runs else "",
        "bench_csv": cfg.get("figures", {}).get(
            "bench_csv", "results/bench/kernels.csv"
        ),
    }


def committed_studies():
    """Every study with collected results in this folder (results/<study>/runs.csv): the figures target."""
    return sorted(
        os.path.basename(os.path.dirname(p)) for p in glob.glob("results/*/runs.csv")
    )


def train_launcher():
    """One process: python; one node with several GPUs: torchrun --standalone; several nodes: srun starts one
    torchrun per node, which meet through a c10d rendezvous on the job's first host."""
    nodes, gpus = CLUSTER["nodes"], CLUSTER["gpus_per_node"]
    if nodes > 1:
        first_host = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
        return (
            f"srun --nodes {nodes} --ntasks-per-node 1 torchrun --nnodes {nodes} --nproc-per-node {gpus}"
            " --rdzv-backend c10d"
            f' --rdzv-endpoint "{first_host}:29500" --rdzv-id "$SLURM_JOB_ID" -m'
        )
    if gpus > 1:
        return f"torchrun --standalone --nproc-per-node {gpus} -m"
    return "python -m"


def eval_gpus():
    """Evaluation and tracing use one GPU when the config trains on GPUs."""
    return min(1, CLUSTER["gpus_per_node"])


def eval_runtime(wildcards, attempt):
    """Minutes: a tenth of training's, at least 30, growing with the attempt."""
    return max(30, CLUSTER["runtime_min"] // 10) * attempt


def all_tables(study=STUDY):
    return expand(
        "results/{study}/tables/{table}.{ext}",
        study=study,
        table=["T1_main", "T2_params", "T3_balance"],
        ext=["csv", "md", "tex"],
    )


FIGURES = [
    "F1_curves",
    "F2_quality_params",
    "F3_groups_by_level",
    "F4_gpu_load",
    "F5_width",
    "F6_kernels",
]


def all_figures(study=STUDY):
    return expand(
        "figures/{study}/{fig}.{ext}", study=study, fig=FIGURES, ext=["png", "pdf"]
    )


# ------------------------------------------------ a study with an `analysis` section (rules/study.smk)

STUDY_TABLES = ["S1_models", "S2_tests", "S3_balance", "S4_difficulty", "S5_tasks"]
TEX_TABLES = STUDY_TABLES[
    :4
]  # S5 (tasks, with the reason each is or is not reported) stays csv/md
STUDY_FIGURES = [
    "F7_study_quality",
    "F8_study_tests",
    "F9_study_balance",
    "F10_study_frontier",
    "F11_study_difficulty",
]


def study_config(study):
    return config if study == STUDY else study_settings(study)["config"]


CAPACITY_TABLES = ["C1_models", "C2_tests", "C3_unused"]


def capacity_settings(study):
    """What workflow/scripts/capacity_analysis.py takes from a capacity study's config: the declared analysis,
    the main dataset (the first experiment's) and the MoHGE arms on it ("mohge", "mohge+<variant>").
    """
    cfg = study_config(study)
    a, main = cfg["analysis"], cfg["experiments"][0]["dataset"]
    arms = ["mohge"] + [
        f"mohge+{v}"
        for e in cfg["experiments"]
        if e["dataset"] == main and "mohge" in e["families"]
        for v in (e.get("variants") or {})
    ]
    return {
        "reference": a.get("reference_family", "moe"),
        "iso": a.get("iso_family", "moe_equal"),
        "sweep": list(a["sweep"]),
        "mohge": list(dict.fromkeys(arms)),
        "dataset": main,
        "quarter": a.get("quarter_dataset"),
        "alpha": a.get("alpha", 0.05),
        "margin": a.get("equivalence_margin", 0.03),
        "gate_ratio": a.get("gate_ratio", 1.05),
        "gate_slope": a.get("gate_slope", 0.5),
        "unused_share": a.get("unused_share", 0.01),
    }


def study_outputs(study):
    """The study tables and figures of `study`, or nothing when its config declares no analysis."""
    if "analysis" not in study_config(study):
        return []
    if (
        study_config(study)["analysis"].get("design") == "capacity"
    ):  # rules/study.smk: capacity_analysis
        return expand(
            "results/{study}/study/{table}.{ext}",
            study=study,
            table=CAPACITY_TABLES,
            ext=["csv", "md", "tex"],
        ) + expand(
            "figures/{study}/C1_bits_params.{ext}", study=study, ext=["png", "pdf"]
        )
    return (
        expand(
            "results/{study}/study/{table}.{ext}",
            study=study,
            table=STUDY_TABLES,
            ext=["csv", "md"],
        )
        + expand("results/{study}/study/{table}.tex", study=study, table=TEX_TABLES)
        + expand(
            "figures/{study}/{fig}.{ext}",
            study=study,
            fig=STUDY_FIGURES,
            ext=["png", "pdf"],
        )
    )


def study_traces(wildcards):
    """Every traced run's routing summary: planned ones in a full run, the committed ones otherwise."""
    if wildcards.study == STUDY and not FROM_RESULTS:
        return expand(f"{RES}/runs/{{run}}/trace.json", run=trace_runs())
    return sorted(glob.glob(f"results/{wildcards.study}/runs/*/trace.json"))


def study_param(study, key):
    """A value the study's figures take from its config: the main dataset and the declared analysis."""
    cfg = study_config(study)
    analysis = cfg.get("analysis", {})
    return {
        "dataset": cfg["experiments"][0]["dataset"],
        "metric": analysis.get("primary_metric", "test_ppl"),
        "margin": analysis.get("equivalence_margin", 0.03),
        "reference": analysis.get("reference_family", "moe"),
    }[key]
