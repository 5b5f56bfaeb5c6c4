# Validation, wildcard constraints and input functions; no rules here.
import csv
import functools
import glob
import hashlib
import json
import math
import os
import re
import reprlib
import subprocess
import sys

import jsonschema

from mohge.config import SPLITS, DataConfig, load_run_config, load_yaml_or_json, to_dict
from mohge.config.runs import ClusterConfig, merge_config, plan, train_resources


def refuse(message):
    """A config mistake: one line naming the key on stderr, no stack frames, no schema dump."""
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(2)


def bounded_configfiles(paths):
    """Every --configfile read again by mohge's bounded loader (size, depth, expanded aliases, duplicate keys)
    before anything walks Snakemake's copy: an alias bomb or a 1 GB file is refused here in one line.
    """
    for path in paths:
        try:
            load_yaml_or_json(path)
        except ValueError as err:
            refuse(str(err))


def schema_message(err):
    """One line from a jsonschema error, built from its parts: never repr(instance), which for a shared (aliased)
    structure is the whole expansion."""
    where = ".".join(str(p) for p in err.absolute_path) or "config"
    short = reprlib.Repr(maxlevel=2, maxlist=4, maxdict=4, maxstring=40, maxother=40)
    allowed = short.repr(err.validator_value)
    return f"{where}={short.repr(err.instance)}: fails the schema's {err.validator!r} ({allowed})"


def checked_plan(config):
    """mohge.config.runs.plan, the validator `python -m mohge.runs list` runs, then the schema generated from the same
    declarations (which must then agree; tests/workflow feed the same configs to both).
    """
    try:
        runs = plan(config)
    except ValueError as err:  # ConfigError included
        refuse(str(err))
    with open(workflow.source_path("../schemas/config.schema.json")) as fh:
        schema = json.load(fh)
    err = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(config)
    )
    if err is not None:
        refuse(schema_message(err))
    return runs


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
bounded_configfiles(workflow.overwrite_configfiles)
own_study(workflow.overwrite_configfiles)
RUNS = checked_plan(config)
# One root per config (its `study`): no config can write over another's committed results.
STUDY = config.get("study", "default")
RES = f"results/{STUDY}"
WORK = f"work/{STUDY}"
LOGS = f"logs/{STUDY}"

DATASETS = sorted({cfg.dataset for cfg in RUNS.values()})
UTIL = config.get("utilization", {})


def utilization_nproc(run):
    """Ranks of the measured per-rank expert time of a run (utilization.measure_nproc, MoHGE runs only; 0: the
    analytic placement alone)."""
    nproc = int(UTIL.get("measure_nproc", 0))
    return nproc if nproc > 0 and RUNS[run].family == "mohge" else 0


# SLURM sizes of a training job; a CPU machine runs the default (one process, no GPU).
CLUSTER = to_dict(ClusterConfig.from_dict(config.get("cluster") or {}, "cluster"))


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


def tracked(folder):
    """Files git tracks under `folder` of the working directory ([] outside a git work tree, or without git)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", folder],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [f for f in out.stdout.split("\0") if f] if out.returncode == 0 else []


def recorded_config(study):
    """(config, file) a committed study was run with: configs/config.yaml, merged with the file of configs/ that
    names the study (as --configfile merges it); (None, None) when no file names it."""
    default = os.path.join(CONFIGS, "config.yaml")
    base = load_yaml_or_json(default)
    if base.get("study", "default") == study:
        return base, default
    for path in sorted(glob.glob(os.path.join(CONFIGS, "*.yaml"))):
        data = load_yaml_or_json(path)
        if data.get("study") == study:
            return merge_config(base, data), path
    return None, None


def guard_committed_study(study, config):
    """A study whose results/<study>/ git tracks is only run with the config that made it (the `cluster`
    section aside: where it runs, not what): any other config is refused before any job is planned.
    """
    files = tracked(f"results/{study}")
    if not files:
        return
    recorded, source = recorded_config(study)

    def strip(c):
        return {k: v for k, v in c.items() if k != "cluster"}

    if recorded is not None and strip(recorded) == strip(config):
        return
    differs = sorted(
        k
        for k in set(strip(config)) | set(strip(recorded or {}))
        if config.get(k) != (recorded or {}).get(k)
    )
    refuse(
        f"study={study!r}: results/{study}/ holds {len(files)} committed files, made by "
        f"{os.path.relpath(source) if source else 'a config not in configs/'}, and this config differs from it "
        f"(in {', '.join(differs) or 'its source'}); name another study (a top-level `study:` in your config, "
        "or --config study=NAME) so that the committed results stay as they are"
    )


if not FROM_RESULTS:
    guard_committed_study(STUDY, config)


def per_run_results(run, traced):
    """What a finished run leaves in results/<study>/: the files collect, the study tables and the figures read
    (the routing summary and its utilization tables only for a traced run)."""
    files = [
        f"{RES}/runs/{run}/{name}"
        for name in (
            "config.json",
            "summary.json",
            "train_log.jsonl",
            "metrics.json",
            "params.json",
        )
    ]
    if run in traced:
        files += [f"{RES}/runs/{run}/trace.json"] + [
            f"{RES}/utilization/{run}/{name}.csv" for name in ("summary", "analytic")
        ]
    return files


def committed_runs():
    """The runs of a pre-declared study (a config with an `analysis` section: it grows over sittings) whose
    results git tracks, all of per_run_results, with a committed config.json that is today's resolved config of
    the run (as today's code reads it: a key added since, at its default, is no change). They are sources: no
    rule makes them, so a clone extends the study (new arms, their data prepared again) without retraining
    them. A run whose config changed is not committed and reruns. MOHGE_RERUN_COMMITTED=1 makes every run again
    (a reproduction: `git diff results/` then shows what moved).
    """
    if (
        FROM_RESULTS
        or "analysis" not in config
        or os.environ.get("MOHGE_RERUN_COMMITTED", "") not in ("", "0")
    ):
        return set()
    have, traced, kept = set(tracked(RES)), set(trace_runs()), set()
    for run in RUNS:
        if not all(f in have for f in per_run_results(run, traced)):
            continue
        try:
            recorded = load_run_config(f"{RES}/runs/{run}/config.json")
        # ConfigError included: a key the config schema does not know
        except (OSError, ValueError):
            continue
        if resolved(recorded) == resolved(RUNS[run]):
            kept.add(run)
    return kept


def resolved(cfg):
    """A run config as the code reads it: a key added since a run was recorded counts at its default."""
    return {**to_dict(cfg), "data": to_dict(cfg.data_config)}


COMMITTED = committed_runs()
# the runs the rules make: every run but the committed ones ("(?!)" matches nothing)
MADE = [r for r in RUNS if r not in COMMITTED]
if COMMITTED:
    print(
        f"study {STUDY}: {len(COMMITTED)} of {len(RUNS)} runs are committed and read from {RES}/runs/ as they are"
        " (MOHGE_RERUN_COMMITTED=1 makes them again)",
        file=sys.stderr,
    )


def pending_run_outputs():
    """Evaluated results of a growing study's declared runs not yet committed, as targets of `all`: its plan
    trains them even while its collected CSVs, made from the committed runs, are up to date.
    """
    if not COMMITTED or FROM_RESULTS:
        return []
    return expand(f"{RES}/runs/{{run}}/metrics.json", run=MADE)


wildcard_constraints:
    run="|".join(map(re.escape, MADE)) or "(?!)",
    dataset="|".join(map(re.escape, DATASETS)),
    study="[A-Za-z0-9][A-Za-z0-9_-]*",


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
    """One process: python; one node with several GPUs: torchrun --standalone; several nodes: the rule's own
    srun starts one torchrun per node (the job declares `mpi`, so the plugin runs the rule outside any step and
    this srun is the job's only step), which meet through a c10d rendezvous on the step's first host. The host
    is read inside each task from SLURM_STEP_NODELIST, which srun sets: the jobstep plugin removes the job's
    SLURM_* variables (SLURM_JOB_ID aside) from the rule's environment."""
    nodes, gpus = CLUSTER["nodes"], CLUSTER["gpus_per_node"]
    if nodes > 1:
        first_host = '$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)'
        return (
            f"srun --nodes {nodes} --ntasks-per-node 1 --kill-on-bad-exit=1 sh -c"
            f" 'exec torchrun --nnodes {nodes} --nproc-per-node {gpus} --rdzv-backend c10d"
            f' --rdzv-endpoint "{first_host}:29500" --rdzv-id "$SLURM_JOB_ID" -m "$@"\' torchrun'
        )
    if gpus > 1:
        return f"torchrun --standalone --nproc-per-node {gpus} -m"
    return "python -m"


# the train rule's SLURM sizes (mohge.config.runs.train_resources; the planner reads the same runtime)
TRAIN_RESOURCES = train_resources(ClusterConfig.from_dict(CLUSTER, "cluster"))


def eval_gpus():
    """Evaluation and tracing use one GPU when the config trains on GPUs."""
    return min(1, CLUSTER["gpus_per_node"])


@functools.lru_cache
def eval_mem_mb(run):
    """Host memory of an evaluate or trace job (MiB, SLURM's --mem unit) from the model's size, by the planner's
    byte rules (mohge.analysis.plan.eval_host_bytes): fp32 weights and their loaded copy, the activations of one
    evaluation batch when the job runs on the CPU, and the runtime. The same on every attempt.
    """
    from mohge.analysis.plan import eval_host_bytes

    return math.ceil(eval_host_bytes(RUNS[run], on_cpu=eval_gpus() == 0) / 2**20)


def eval_runtime(wildcards, attempt):
    """Minutes: a tenth of training's, at least 30, growing with the attempt."""
    return max(30, CLUSTER["runtime_min"] // 10) * attempt


def all_tables(study=STUDY):
    return expand(
        "results/{study}/tables/{table}.{ext}",
        study=study,
        table=["T1_main", "T2_params", "T3_balance"],
        ext=["csv", "md", "tex", "html"],
    )


FIGURES = [
    "F1_curves",
    "F2_quality_params",
    "F3_groups_by_level",
    "F4_gpu_load",
    "F5_width",
]


def measured_kernels(study):
    """Whether the study's kernel benchmark CSV holds a GPU measurement (a row with a device that is not a CPU and
    a TFLOP/s value): only then is F6 part of the study's figures; a placeholder never is.
    """
    path = in_checkout(study_settings(study)["bench_csv"])
    if not os.path.isfile(path):
        return False
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return any(
        (r.get("device") or "").strip()
        and "cpu" not in r["device"].lower()
        and (r.get("tflops") or "").strip()
        for r in rows
    )


def all_figures(study=STUDY):
    figs = FIGURES + (["F6_kernels"] if measured_kernels(study) else [])
    return expand(
        "figures/{study}/{fig}.{ext}", study=study, fig=figs, ext=["png", "pdf"]
    )


# ------------------------------------------------ a study with an `analysis` section (rules/study.smk)

STUDY_TABLES = [
    "S1_models",
    "S2_tests",
    "S3_balance",
    "S4_difficulty",
    "S5_tasks",
    "S6_balance_decision",
    "S7_unused_experts",
    "S8_controls",  # the arms declared after the results; S9, S10: Q3's dose and token-level record
    "S9_q3_dose",
    "S10_token_q3",
]
# S5 (tasks, with the reason each is or is not reported), S6, S7, S9 and S10 stay csv/md
TEX_TABLES = STUDY_TABLES[:4] + ["S8_controls"]
STUDY_FIGURES = [
    "F7_study_quality",
    "F8_study_tests",
    "F9_study_balance",
    "F10_study_frontier",
    "F11_study_difficulty",
    "F12_study_controls",  # S8's paired tests (the control arms declared after the results)
]


def study_config(study):
    return config if study == STUDY else study_settings(study)["config"]


CAPACITY_TABLES = ["C1_models", "C2_tests", "C3_unused"]


# variants of selection runs on a held-out seed: in no test (docs/study.md)
SELECTION = "sel_"


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
        if not v.startswith(SELECTION)
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
            ext=["csv", "md", "tex", "html"],
        ) + expand(
            "figures/{study}/C1_bits_params.{ext}", study=study, ext=["png", "pdf"]
        )
    return (
        expand(
            "results/{study}/study/{table}.{ext}",
            study=study,
            table=STUDY_TABLES,
            ext=["csv", "md", "html"],
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
        "balance_ep": analysis.get("balance_ep", 4),
        "balance_bar": analysis.get("balance_bar", 1.10),
    }[key]


# ------------------------------------------------ inference records (a config with an `inference` section)


def inference_runs():
    """The runs with an inference record: every run this config makes, when its config has an `inference`
    section (a committed run's weights are not in the checkout)."""
    from mohge.config.runs import InferenceConfig

    asked = (
        "inference" in config
        and InferenceConfig.from_dict(config["inference"], "inference").enabled
    )
    return list(MADE) if asked and not FROM_RESULTS else []


def inference_args():
    """The `inference` section as flags of python -m mohge.bench inference (a knob without points is left out)."""
    from mohge.config.runs import InferenceConfig

    inf = InferenceConfig.from_dict(config.get("inference") or {}, "inference")
    args = []
    for key in ("group_topk", "bar_widest", "topk"):
        points = getattr(inf.knob_points, key)
        if points:
            args += [f"--{key.replace('_', '-')}", *map(str, points)]
    args += ["--prompt-lengths", *map(str, inf.prompt_lengths)]
    args += ["--batch-sizes", *map(str, inf.batch_sizes)]
    args += ["--decode-tokens", str(inf.decode_tokens), "--reps", str(inf.reps)]
    return args + ["--eval-batches", str(inf.eval_batches)]


def inference_outputs(study=STUDY):
    """T4 and F13 of this config's study when it makes inference records, else nothing."""
    if study != STUDY or not inference_runs():
        return []
    return expand(
        "results/{study}/tables/T4_inference.{ext}", study=study, ext=["csv", "md"]
    ) + expand("figures/{study}/F13_inference.{ext}", study=study, ext=["png", "pdf"])
