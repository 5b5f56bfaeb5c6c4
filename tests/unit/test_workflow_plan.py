"""What a workflow config plans (mohge_studies.workflow), without Snakemake: run names, committed runs of a growing
study, the targets of `all`, study settings read through the typed sections, job sizes as functions of the config, and
the refusals that happen while the workflow is parsed, before any job runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import config_path
from mohge_studies.config.runs import (
    BEST_SHOT,
    SELECTION,
    AnalysisConfig,
    ClusterConfig,
    UtilizationConfig,
    merge_config,
    plan,
)
from mohge_studies.design import design
from mohge_studies.workflow import (
    WorkflowPlan,
    check_configfiles,
    checkout,
    resources,
    settings,
    targets,
    validated_runs,
)
from mohge_studies.workflow.plan import digest, from_snakemake

from mohge.config import ConfigError, load_yaml_or_json

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "workflow" / "schemas" / "config.schema.json").read_text())


def study_config(name: str) -> dict:
    """The config file ``name`` (configs/<name>.yaml, else studies/<name>/config.yaml) merged over
    configs/config.yaml, as --configfile merges it."""
    base = load_yaml_or_json(ROOT / "configs" / "config.yaml")
    return base if name == "config" else merge_config(base, load_yaml_or_json(config_path(name)))


def workflow_plan(config: dict, tracked=lambda folder: [], **kw) -> WorkflowPlan:
    return WorkflowPlan(config, plan(config, preflight=False), checkout=str(ROOT), tracked=tracked, **kw)


@pytest.fixture(scope="module")
def smoke() -> dict:
    return study_config("smoke")


def test_run_names_are_dataset_family_variant_seed_of_every_experiment(smoke):
    wp = workflow_plan(smoke)
    names = set(wp.runs)
    for exp in smoke["experiments"]:
        for fam in exp["families"]:
            seeds = exp.get("seeds", [0])
            for seed in seeds.get(fam, seeds.get("default", [0])) if isinstance(seeds, dict) else seeds:
                assert f"{exp['dataset']}-{fam}-s{seed}" in names, (fam, seed)
    assert wp.study == "smoke" and (wp.res, wp.work, wp.logs) == ("results/smoke", "work/smoke", "logs/smoke")
    assert wp.datasets == sorted({e["dataset"] for e in smoke["experiments"]})
    assert wp.made == list(wp.runs) and wp.committed == set()  # no `analysis` section: nothing is committed
    ablations = workflow_plan(study_config("ablations"))
    assert "shakespeare-mohge-renorm-s1" in ablations.runs  # {dataset}-{family}-{variant}-s{seed}


def test_a_hyphenated_variant_is_refused_at_plan_time_naming_key_and_value(smoke):
    bad = copy.deepcopy(smoke)
    bad["experiments"][0]["variants"] = {"my-var": {}}
    with pytest.raises(ConfigError, match=r"^experiments\[0\]\.variants='my-var': '-' separates the parts"):
        validated_runs(bad, SCHEMA)


def test_a_seq_len_longer_than_the_facts_held_out_split_is_refused_at_plan_time():
    cap = study_config("capacity")
    ds = cap["experiments"][0]["dataset"]
    data = cap["datasets"][ds]
    fact = data.get("facts_key_len", 2) + data.get("facts_value_len", 2) + 1
    held_out = data["facts_num"] * fact + data.get("num_shards", 1)  # every shard opens with one end-of-text
    bad = copy.deepcopy(cap)
    bad["datasets"][ds]["seq_len"] = (held_out // fact + 1) * fact  # a multiple of the fact length, too long
    with pytest.raises(
        ConfigError, match=rf"^datasets\.{ds}\.seq_len={bad['datasets'][ds]['seq_len']}: .*val and test"
    ):
        plan(bad, preflight=False)


def test_the_schema_agrees_with_the_plan_and_names_the_key(smoke):
    assert set(validated_runs(smoke, SCHEMA)) == set(plan(smoke, preflight=False))
    narrowed = {**SCHEMA, "properties": {**SCHEMA["properties"], "study": {"type": "string", "maxLength": 2}}}
    with pytest.raises(ConfigError, match=r"^study='smoke': fails the schema's 'maxLength' \(2\)"):
        validated_runs(smoke, narrowed)


def test_a_config_file_without_its_own_study_is_refused(tmp_path):
    (tmp_path / "mine.yaml").write_text("train: {steps: 3}\n")
    with pytest.raises(ConfigError, match=r"^study: '.*mine\.yaml' sets no top-level `study:`"):
        check_configfiles([str(tmp_path / "mine.yaml")], {})
    check_configfiles([str(tmp_path / "mine.yaml")], {"study": "mine"})
    (tmp_path / "big.yaml").write_text("study: big\n" + "#" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"more than the 1048576"):
        check_configfiles([str(tmp_path / "big.yaml")], {})


# ---------------------------------------------------------------- committed runs


def commit_runs(wp: WorkflowPlan, runs: list[str], root: Path) -> set[str]:
    """Every per-run result of ``runs`` written under ``root`` (config.json: the run's resolved config)."""
    files = set()
    for run in runs:
        for f in targets.per_run_results(wp.res, run, wp.traced):
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text(wp.run_config_json(run) if f.endswith("config.json") else "{}\n")
            files.add(f)
    return files


def test_committed_runs_are_those_with_every_result_tracked_and_todays_config(tmp_path, monkeypatch, smoke):
    monkeypatch.chdir(tmp_path)
    cap = merge_config(smoke, {"analysis": {}})  # a pre-declared study: it grows over sittings
    first = workflow_plan(cap)
    kept = [first.traced[0], next(r for r in first.runs if r not in first.traced)]  # a traced run and another
    tracked = commit_runs(first, kept, tmp_path)
    wp = workflow_plan(cap, tracked=lambda folder: sorted(f for f in tracked if f.startswith(folder)))
    assert wp.committed == set(kept)
    assert wp.made == [r for r in wp.runs if r not in kept]
    assert wp.pending_run_outputs() == [f"results/smoke/runs/{r}/metrics.json" for r in wp.made]
    assert wp.inference_runs() == wp.made  # a committed run's weights are not in the checkout
    # a file not tracked: that run is made again
    lost = {f for f in tracked if f != f"results/smoke/runs/{kept[0]}/trace.json"}
    assert workflow_plan(cap, tracked=lambda folder: sorted(lost)).committed == {kept[1]}
    # its recorded config differs from today's: made again
    path = tmp_path / f"results/smoke/runs/{kept[1]}/config.json"
    recorded = json.loads(path.read_text())
    recorded["train"]["lr"] *= 2
    path.write_text(json.dumps(recorded))
    assert workflow_plan(cap, tracked=lambda folder: sorted(tracked)).committed == {kept[0]}
    # a reproduction, the figures target, a study without `analysis`: no committed run
    for kw in ({"rerun_committed": True}, {"from_results": True}):
        assert workflow_plan(cap, tracked=lambda folder: sorted(tracked), **kw).committed == set()
    no_analysis = {k: v for k, v in cap.items() if k != "analysis"}
    assert workflow_plan(no_analysis, tracked=lambda folder: sorted(tracked)).committed == set()


def test_a_committed_study_is_refused_to_any_other_config(tmp_path, smoke):
    files = ["results/default/runs.csv"]
    default = study_config("config")
    workflow_plan(default, tracked=lambda folder: files).guard_committed_study()  # the config that made it
    other = {**default, "cluster": {"nodes": 1, "gpus_per_node": 8}}  # where it runs, not what: the same study
    workflow_plan(other, tracked=lambda folder: files).guard_committed_study()
    changed = merge_config(default, {"train": {"steps": default["train"]["steps"] + 1}})
    with pytest.raises(ConfigError, match=r"^study='default': results/default/ holds 1 committed files, made by"):
        workflow_plan(changed, tracked=lambda folder: files).guard_committed_study()
    workflow_plan(smoke, tracked=lambda folder: []).guard_committed_study()  # nothing committed under results/smoke


def test_from_snakemake_refuses_before_planning_and_reads_the_rerun_switch(smoke, tmp_path):
    (tmp_path / "nostudy.yaml").write_text("train: {steps: 3}\n")
    with pytest.raises(ConfigError, match="sets no top-level `study:`"):
        from_snakemake(smoke, [str(tmp_path / "nostudy.yaml")], {}, SCHEMA, str(ROOT), False)
    cap = study_config("capacity")
    wp = from_snakemake(cap, [], {}, SCHEMA, str(ROOT), True, environ={"MOHGE_RERUN_COMMITTED": "1"})
    assert wp.rerun_committed and wp.from_results


# ---------------------------------------------------------------- targets


def test_targets_of_all_follow_the_config(smoke):
    wp = workflow_plan(smoke)
    assert len(wp.tables()) == 12 and all(f.startswith("results/smoke/tables/T") for f in wp.tables())
    assert targets.figures("x", kernels=False) == targets.expand(
        "figures/x/{f}.{e}", f=targets.FIGURES, e=["png", "pdf"]
    )
    assert "figures/x/F6_kernels.pdf" in targets.figures("x", kernels=True)
    assert wp.study_outputs() == []  # no `analysis` section
    assert wp.inference_runs() == list(wp.runs)  # the default's inference section is inherited
    assert wp.inference_outputs() == targets.inference_outputs("smoke") and wp.inference_outputs("other") == []
    assert wp.all_targets() == wp.tables() + wp.figures() + wp.inference_outputs()
    claims = design("claims").outputs("claims")
    assert "results/claims/study/S10_token_q3.html" in claims and "results/claims/study/S5_tasks.tex" not in claims
    assert "figures/claims/F12_study_controls.png" in claims
    capacity = design("capacity").outputs("capacity")
    assert len(capacity) == 6 * 4 + 2 and "figures/capacity/C1_bits_params.pdf" in capacity
    opted_out = merge_config(smoke, {"inference": {"enabled": False}})
    assert workflow_plan(opted_out).inference_outputs() == []


def test_training_logs_are_every_planned_run_s_in_a_full_run_and_the_committed_ones_otherwise(smoke):
    """The idle figure and C3 read each run's train_log.jsonl: in a full run of the config, every run it plans (the
    train rule makes them); for another study, or asked for `figures` alone, the ones under results/ (a glob)."""
    listed = lambda pattern: [pattern.replace("*", "b"), pattern.replace("*", "a")]  # noqa: E731
    wp = workflow_plan(smoke)
    assert wp.study_logs("smoke", listed) == [f"results/smoke/runs/{r}/train_log.jsonl" for r in wp.runs]
    assert wp.study_logs("claims", listed) == [f"results/claims/runs/{r}/train_log.jsonl" for r in "ab"]
    assert (
        workflow_plan(smoke, from_results=True).study_logs("smoke", listed)[0] == "results/smoke/runs/a/train_log.jsonl"
    )


def test_kernel_figure_only_with_a_gpu_measurement(tmp_path):
    path = tmp_path / "k.csv"
    assert not checkout.measured_kernels(str(path))
    path.write_text("device,tflops\ncpu,1.0\n")
    assert not checkout.measured_kernels(str(path))
    path.write_text("device,tflops\nNVIDIA H200,\n")
    assert not checkout.measured_kernels(str(path))
    path.write_text("device,tflops\ncpu,1.0\nNVIDIA H200,310.5\n")
    assert checkout.measured_kernels(str(path))


def test_traced_runs_are_the_first_seed_of_each_moe_model_or_every_seed(smoke):
    runs = plan(smoke, preflight=False)
    first = settings.trace_runs(runs, UtilizationConfig())
    assert all(runs[r].family != "dense" for r in first)
    keys = [(runs[r].dataset, runs[r].family, runs[r].variant) for r in first]
    assert len(keys) == len(set(keys))
    every = settings.trace_runs(runs, UtilizationConfig(trace_all_seeds=True))
    assert set(first) < set(every) == {r for r, c in runs.items() if c.family != "dense"}
    assert runs[settings.util_source(runs, smoke)].family == "mohge"
    dataset = next(iter(runs.values())).dataset
    untraced = UtilizationConfig(trace_all_seeds=True, untraced_datasets=(dataset,))
    kept = settings.trace_runs(runs, untraced)
    assert kept == sorted(r for r in every if runs[r].dataset != dataset) and len(kept) < len(every)


def test_asked_targets_read_only_a_snakemake_command_line():
    assert checkout.asked_targets(["/env/bin/snakemake", "-n", "--cores", "1", "figures"]) == {"figures"}
    assert checkout.asked_targets(["/env/lib/snakemake/__main__.py", "figures", "all"]) == {"figures", "all"}
    assert checkout.asked_targets(["/env/bin/pytest", "figures"]) == set()


# ---------------------------------------------------------------- study settings: the typed sections' defaults


def test_study_settings_take_every_default_from_the_typed_sections(smoke):
    declared = merge_config(smoke, {"analysis": {}})
    a = AnalysisConfig()
    assert settings.study_param(declared, "margin") == a.equivalence_margin
    assert settings.study_param(declared, "metric") == a.primary_metric
    assert settings.study_param(declared, "balance_bar") == a.balance_bar
    assert settings.study_param(declared, "ep_sizes") == list(smoke["utilization"]["ep_sizes"])
    bare = {k: v for k, v in smoke.items() if k != "utilization"}
    assert settings.study_param(bare, "ep_sizes") == list(UtilizationConfig().ep_sizes)
    assert settings.study_param(smoke, "dataset") == smoke["experiments"][0]["dataset"]
    assert settings.design(smoke) is None and settings.design(declared) == "claims"


def test_capacity_settings_are_the_declared_analysis_without_selection_or_best_shot_runs():
    cap = study_config("capacity")
    s = design("capacity").settings(cap)
    assert workflow_plan(cap).design_settings("capacity") == s
    declared = cap["analysis"]
    assert s["margin"] == declared["equivalence_margin"] and s["sweep"] == declared["sweep"]
    assert s["dataset"] == cap["experiments"][0]["dataset"] and s["mohge"][0] == "mohge"
    assert not any(m.startswith(("mohge+" + SELECTION, "mohge+" + BEST_SHOT)) for m in s["mohge"])
    assert s["mohge"] == ["mohge", "mohge+ae5e2"]  # the first analysis's arms, as C2 reports them
    assert len(s["mohge"]) == len(set(s["mohge"]))


def test_other_studies_settings_come_from_the_config_that_names_them(smoke):
    wp = workflow_plan(smoke)
    claims = wp.study_config("claims")
    assert claims["study"] == "claims" and "analysis" in claims
    assert wp.study_source("claims").startswith(claims["experiments"][0]["dataset"] + "-mohge-")
    assert wp.study_settings("nowhere")["config"] == {"study": "nowhere"}
    assert wp.study_settings("nowhere")["bench_csv"] == "results/bench/kernels.csv"
    assert wp.study_outputs("capacity")[-1] == "figures/capacity/C1_bits_params.pdf"


# ---------------------------------------------------------------- resources


def test_training_resources_follow_the_cluster_section():
    one = ClusterConfig()
    assert resources.train_resources(one) == {"nodes": 1, "mem_mb": 4096, "runtime": 60, "gpu": 0}
    assert resources.train_launcher(one) == "python -m"
    node = ClusterConfig(gpus_per_node=4)
    assert resources.train_launcher(node) == "torchrun --standalone --nproc-per-node 4 -m"
    multi = ClusterConfig(nodes=2, gpus_per_node=8, mem_gb=480, runtime_min=10080)
    res = resources.train_resources(multi)
    want = {"nodes": 2, "mem_mb": 480 * 1024, "runtime": 10080, "mpi": "srun", "tasks": 2, "tasks_per_gpu": 0}
    assert res == {**want, "gres": "gpu:8"}
    assert resources.train_launcher(multi).startswith("srun --nodes 2 --ntasks-per-node 1")
    assert "gres" not in resources.train_resources(ClusterConfig(nodes=2))


def test_evaluation_and_data_job_sizes_are_functions_of_the_config(smoke):
    wp = workflow_plan(smoke)
    run = next(iter(wp.runs))
    assert wp.eval_gpus() == 0 and wp.eval_runtime(1) == 30 and wp.eval_runtime(2) == 60
    assert resources.eval_runtime(ClusterConfig(runtime_min=10080), 1) == 1008
    cpu, gpu = wp.eval_mem_mb(run), resources.eval_mem_mb(wp.runs[run], ClusterConfig(gpus_per_node=1))
    assert cpu > gpu > 2048  # the CPU job holds an evaluation batch's activations too; 2 GiB of runtime in both
    ds = wp.datasets[0]
    assert wp.data_job_minutes(ds, 2, 120) == 40  # a local source: 20 minutes an attempt
    assert wp.data_parts(ds) == [f"work/smoke/data/{ds}/shards/part-00000.json"]


def test_the_utilization_job_measures_mohge_runs_on_the_configured_ranks(smoke):
    wp = workflow_plan(smoke)
    nproc = smoke["utilization"]["measure_nproc"]
    for run, cfg in wp.runs.items():
        flags = wp.utilization_measure(run)
        assert flags == (["--measure", "--nproc", nproc] if cfg.family == "mohge" else []), run
        assert wp.utilization_nproc(run) == (nproc if cfg.family == "mohge" else 0)
    off = workflow_plan(merge_config(smoke, {"utilization": {"measure_nproc": 0}}))
    assert not any(off.utilization_measure(r) for r in off.runs)


def test_run_and_dataset_sections_hash_what_they_depend_on(smoke):
    wp = workflow_plan(smoke)
    run = next(iter(wp.runs))
    assert "eval" not in wp.train_section(run) and json.loads(wp.run_config_json(run))["name"] == run
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1}) != digest({"a": 1})
    assert wp.dataset_section(wp.runs[run].dataset) == {"data": wp.runs[run].data}
    assert wp.data_dir(run) == f"work/smoke/data/{wp.runs[run].dataset}"
    assert wp.inference_args()[-2:] == ["--eval-batches", str(smoke["inference"].get("eval_batches", 8))]


def test_only_a_config_mistake_is_a_one_line_config_error_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """The Snakefile's plan (workflow/rules/common.smk calls plan_or_refuse): a ConfigError is `config error: ...` on
    stderr and exit 2; any other exception, ValueError included, propagates with its traceback."""
    from mohge_studies.workflow import plan as plan_module

    def mistake(*args, **kwargs):
        raise ConfigError("train.steps=0: must be > 0")

    monkeypatch.setattr(plan_module, "from_snakemake", mistake)
    with pytest.raises(SystemExit) as done:
        plan_module.plan_or_refuse({}, configfiles=[], cli_config={}, schema={}, checkout=".", from_results=False)
    assert done.value.code == 2 and capsys.readouterr().err == "config error: train.steps=0: must be > 0\n"

    def bug(*args, **kwargs):
        raise ValueError("operands could not be broadcast together")

    monkeypatch.setattr(plan_module, "from_snakemake", bug)
    with pytest.raises(ValueError, match="broadcast"):
        plan_module.plan_or_refuse({}, configfiles=[], cli_config={}, schema={}, checkout=".", from_results=False)
    assert (ROOT / "workflow" / "rules" / "common.smk").read_text().count("plan_or_refuse(") == 1


def test_a_one_gpu_node_times_the_measured_ranks_in_turns_on_its_gpu(smoke):
    """Fewer GPUs on the node than measured ranks: one process on the GPU (`--one-device`), one thread, one GPU; a CPU
    config and a node with a GPU per rank launch the ranks."""
    nproc = smoke["utilization"]["measure_nproc"]
    one = workflow_plan(merge_config(smoke, {"cluster": {"gpus_per_node": 1}}))
    cpu, full = workflow_plan(smoke), workflow_plan(merge_config(smoke, {"cluster": {"gpus_per_node": nproc}}))
    for run, cfg in one.runs.items():
        if cfg.family != "mohge":
            assert one.utilization_measure(run) == [] and one.utilization_gpus(run) == 0
            continue
        assert one.utilization_measure(run) == ["--measure", "--nproc", nproc, "--one-device"]
        assert one.utilization_threads(run) == 1 and one.utilization_gpus(run) == 1
        assert cpu.utilization_measure(run) == full.utilization_measure(run) == ["--measure", "--nproc", nproc]
        assert cpu.utilization_threads(run) == full.utilization_threads(run) == nproc
        assert cpu.utilization_gpus(run) == full.utilization_gpus(run) == 0
