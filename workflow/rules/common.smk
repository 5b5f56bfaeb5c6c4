# Validation, wildcard constraints and input functions; no rules here. What a config plans (its runs, committed
# runs, targets, settings and job sizes) is mohge_studies.workflow.WorkflowPlan, tested without Snakemake
# (tests/unit/test_workflow_plan.py).
import glob
import json
import os
import re
import sys

from mohge.config import to_dict
from mohge_studies.workflow.checkout import asked_targets
from mohge_studies.design import rules_files
from mohge_studies.workflow.plan import digest, plan_or_refuse

# Asked for `figures` alone, the workflow holds only the table and figure rules: the committed CSVs are their
# sources, so no training, evaluation or collect job can enter the plan.
FROM_RESULTS = asked_targets(sys.argv) == {"figures"}
# The workflow's own checkout, also when it is included as a module: job inputs and listed folders are read
# from here, not through source_path (whose runtime copies get a new mtime each time and so rerun jobs).
CHECKOUT = os.path.relpath(
    os.path.join(workflow.current_basedir.get_path_or_uri(secret_free=True), "..", "..")
)
CONFIGS = os.path.normpath(os.path.join(CHECKOUT, "configs"))
# the rules of every declared analysis (mohge_studies.DESIGNS), relative to the checkout (the Snakefile includes them)
DESIGN_RULES = rules_files()
# Under --sdm conda, each env's post-deploy script (workflow/envs/*.post-deploy.sh) installs this checkout into it
os.environ.update(MOHGE_CHECKOUT=os.path.abspath(CHECKOUT))
with open(workflow.source_path("../schemas/config.schema.json")) as fh:
    SCHEMA = json.load(fh)
# a config mistake is one line naming the key (exit 2); any other exception is a bug and keeps its traceback
PLAN = plan_or_refuse(
    config,
    configfiles=workflow.overwrite_configfiles,
    cli_config=workflow.config_settings.config,
    schema=SCHEMA,
    checkout=CHECKOUT,
    from_results=FROM_RESULTS,
)
COMMITTED = PLAN.committed

RUNS, STUDY, RES, WORK, LOGS = PLAN.runs, PLAN.study, PLAN.res, PLAN.work, PLAN.logs
CLUSTER = PLAN.cluster
MADE = PLAN.made
if COMMITTED:
    print(
        f"study {STUDY}: {len(COMMITTED)} of {len(RUNS)} runs are committed and read from {RES}/runs/ as they are"
        " (MOHGE_RERUN_COMMITTED=1 makes them again)",
        file=sys.stderr,
    )


wildcard_constraints:
    # the runs the rules make: every run but the committed ones ("(?!)" matches nothing)
    run="|".join(map(re.escape, MADE)) or "(?!)",
    dataset="|".join(map(re.escape, PLAN.datasets)),
    study="[A-Za-z0-9][A-Za-z0-9_-]*",


# ------------------------------------------------ input functions and params (wildcards -> mohge_studies.workflow)


def data_parts(wildcards):
    return PLAN.data_parts(wildcards.dataset)


def data_dir(wildcards):
    return PLAN.data_dir(wildcards.run)


def data_meta(wildcards):
    return f"{data_dir(wildcards)}/meta.json"


def data_job_minutes(dataset, attempt, hub_minutes):
    return PLAN.data_job_minutes(dataset, attempt, hub_minutes)


def dataset_section(dataset):
    return PLAN.dataset_section(dataset)


def dataset_config_json(dataset):
    return json.dumps(dataset_section(dataset), sort_keys=True) + "\n"


def train_section(run):
    return PLAN.train_section(run)


def run_config_json(run):
    return PLAN.run_config_json(run)


def train_config_json(run):
    return json.dumps(train_section(run), sort_keys=True, indent=2) + "\n"


def train_digest(wildcards):
    return digest(train_section(wildcards.run))


def eval_mem_mb(wildcards):
    return PLAN.eval_mem_mb(wildcards.run)


def eval_runtime(wildcards, attempt):
    return PLAN.eval_runtime(attempt)


def study_traces(wildcards):
    return PLAN.study_traces(wildcards.study, glob.glob)


def study_logs(wildcards):
    return PLAN.study_logs(wildcards.study, glob.glob)


def study_param(study, key):
    return PLAN.study_param(study, key)


def bench_csv(wildcards):
    return PLAN.in_checkout(PLAN.study_settings(wildcards.study)["bench_csv"])
