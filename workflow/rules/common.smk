# Validation, wildcard constraints and input functions; no rules here.
import json
import os

from mohge.config import to_dict
from mohge.runs import plan

# Jobs import mohge from this checkout, also inside the per-rule conda environments (--sdm conda).
os.environ.update(PYTHONPATH=os.path.join(workflow.basedir, "src"))  # set, never read

# Every run's config is resolved and validated now, at parse time: a bad config fails before any job.
RUNS = plan(config)
DATASETS = sorted({cfg.dataset for cfg in RUNS.values()})
MAIN_DATASET = config["experiments"][0]["dataset"]
UTIL = config.get("utilization", {})


wildcard_constraints:
    run="|".join(RUNS),
    dataset="|".join(DATASETS),


def run_config_json(wildcards):
    """The resolved config as a string: a params entry, so a changed config reruns the run."""
    return json.dumps(to_dict(RUNS[wildcards.run]), sort_keys=True)


def dataset_config_json(wildcards):
    cfg = next(c for c in RUNS.values() if c.dataset == wildcards.dataset)
    return json.dumps({"data": cfg.data}, sort_keys=True)


def data_dir(wildcards):
    return f"work/data/{RUNS[wildcards.run].dataset}"


def data_meta(wildcards):
    return f"{data_dir(wildcards)}/meta.json"


def trace_runs():
    """Runs whose routing traces feed the utilization study and F3: the first seed of each MoE model, or
    every seed of every MoE model with `utilization.trace_all_seeds` (balance with CIs over seeds)."""
    if UTIL.get("trace_all_seeds", False):
        return sorted(r for r, c in RUNS.items() if c.family != "dense")
    first = {}
    for name, c in RUNS.items():
        key = (c.dataset, c.family, c.variant)
        if c.family != "dense" and (
            key not in first or c.train.seed < RUNS[first[key]].train.seed
        ):
            first[key] = name
    return sorted(first.values())


def in_checkout(path):
    """A relative path from the config, read from the workdir when it is there, else from the checkout."""
    return (
        path
        if os.path.isabs(path) or os.path.exists(path)
        else os.path.join(workflow.basedir, path)
    )


def util_source():
    """The routing trace F4 shows: MoHGE on the main dataset (its first seed), else the first traced run."""
    traced = trace_runs()
    mohge = [
        r
        for r in traced
        if RUNS[r].family == "mohge" and RUNS[r].dataset == MAIN_DATASET
    ]
    return (mohge or traced or [""])[0]


def launcher(resources):
    """torchrun for multi-GPU jobs (the SLURM profile sets `gpu`), plain python otherwise."""
    gpus = int(resources.get("gpu", 0))
    if gpus > 1:
        return f"torchrun --standalone --nproc_per_node={gpus} -m"
    return "python -m"


def all_tables():
    return expand(
        "results/tables/{table}.{ext}",
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


def all_figures():
    return expand("figures/{fig}.{ext}", fig=FIGURES, ext=["png", "pdf"])
