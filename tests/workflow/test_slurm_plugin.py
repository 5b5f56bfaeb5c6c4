"""The SLURM path as the executor plugin really drives it (slow): the real snakemake-executor-plugin-slurm and its
jobstep plugin, with logging fakes of sbatch, srun, squeue, sacct, scontrol and sinfo on PATH (fake_slurm/).

The fake sbatch runs each job script at once, as SLURM would on the job's first node: the jobstep plugin starts
inside the "job", and the fake srun runs its command once per task with the variables SLURM gives a task. The
data jobs run for real (a tiny graded corpus); training stops at the rule's command: a fake torchrun records
what it was given and writes the files the rule expects, so nothing trains. What only a real cluster shows
(scheduling, GPU binding, the c10d rendezvous across hosts, NCCL) is listed in docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from test_workflow import BIN, SNAKEMAKE, copy_workflow

FAKES = Path(__file__).resolve().parent / "fake_slurm"
RUN = "graded-mohge-s0"
TARGET = f"work/fakeslurm/runs/{RUN}/model.safetensors"
TWO_NODES = {"nodes": 2, "gpus_per_node": 8, "cpus_per_task": 4, "mem_gb": 64, "runtime_min": 120}
ONE_NODE = {"nodes": 1, "gpus_per_node": 8, "cpus_per_task": 4, "mem_gb": 64, "runtime_min": 120}


def write_config(work: Path, cluster: dict) -> str:
    """The smoke config reduced to one MoHGE run, with the given `cluster` section."""
    cfg = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    cfg.update(
        study="fakeslurm", cluster=cluster, experiments=[{"dataset": "graded", "families": ["mohge"], "seeds": [0]}]
    )
    (work / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    return "cluster.yaml"


def slurm_snakemake(work: Path, state: Path, configfile: str, **env: str) -> subprocess.CompletedProcess:
    """`snakemake --profile workflow/profiles/slurm` with the fakes first on PATH, status checks every second."""
    state.mkdir(exist_ok=True)
    path = os.pathsep.join([str(FAKES), str(BIN), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "FAKE_SLURM_DIR": str(state), **env}
    args = [TARGET, "--profile", "workflow/profiles/slurm", "--configfile", configfile]
    args += ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"]
    args += ["--latency-wait", "2"]
    return subprocess.run([*SNAKEMAKE, *args], cwd=work, env=env, capture_output=True, text=True, timeout=900)


def jobs(state: Path) -> dict[str, dict]:
    """SLURM job id -> its rule (from the plugin's --comment), its sbatch argv, and every call made inside it."""
    out: dict[str, dict] = {}
    for line in (state / "calls.jsonl").read_text().splitlines():
        call = json.loads(line)
        if call["cmd"] == "sbatch":
            comment = call["argv"][call["argv"].index("--comment") + 1]
            rule = comment.removeprefix("rule_").split("_wildcards_")[0]
            argv = [a for a in call["argv"] if not a.startswith("--wrap=")]
            out[call["jobid"]] = {"rule": rule, "sbatch": argv, "calls": []}
        elif call["env"].get("SLURM_JOB_ID") in out:
            out[call["env"]["SLURM_JOB_ID"]]["calls"].append(call)
    return out


def of(job: dict, cmd: str) -> list[dict]:
    return [c for c in job["calls"] if c["cmd"] == cmd]


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    """The data jobs and a two-node training (failing once on a lost node, so Snakemake retries it)."""
    work = copy_workflow(tmp_path_factory.mktemp("slurm"))
    state = work / "fake-slurm-state"
    out = slurm_snakemake(work, state, write_config(work, TWO_NODES), FAKE_TORCHRUN_FAIL_ONCE="1")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return work, state


@pytest.mark.slow
def test_two_nodes_one_allocation_one_torchrun_per_node_no_nested_step(two_node_run):
    work, state = two_node_run
    all_jobs = jobs(state)
    train = [j for j in all_jobs.values() if j["rule"] == "train"]
    assert len(train) == 2, [j["rule"] for j in all_jobs.values()]  # the failed attempt and its retry
    for job in train:
        sbatch = job["sbatch"]
        # one allocation of 2 nodes, one task per node, 8 GPUs on each node
        assert {"--nodes=2", "--ntasks=2", "--gres=gpu:8", "--cpus-per-task=4"} <= set(sbatch), sbatch
        assert not [a for a in sbatch if a.startswith(("--gpus=", "--ntasks-per-gpu", "--ntasks-per-node"))], sbatch
        # the config's limits on every attempt: a retry re-queues, it does not ask for more
        assert sbatch[sbatch.index("--mem") + 1] == str(64 * 1024) and sbatch[sbatch.index("-t") + 1] == "120"
        # the jobstep plugin prepends no srun (the rule declares `mpi`): the rule's own srun is the only step
        (srun,) = of(job, "srun")
        assert srun["argv"][:4] == ["--nodes", "2", "--ntasks-per-node", "1"], srun["argv"]
        assert not srun["nested"] and "SLURM_STEP_ID" not in srun["env"]
        assert srun["command"][:2] == ["sh", "-c"]
        # one torchrun per node, in that one step, meeting on the step's first host
        runs = of(job, "torchrun")
        assert sorted(r["env"]["SLURM_NODEID"] for r in runs) == ["0", "1"]
        assert {r["env"]["SLURM_STEP_ID"] for r in runs} == {"0"}
        for r in runs:
            argv = r["argv"]
            assert argv[:4] == ["--nnodes", "2", "--nproc-per-node", "8"], argv
            assert argv[argv.index("--rdzv-endpoint") + 1] == "node001:29500"
            assert argv[argv.index("--rdzv-id") + 1] == r["env"]["SLURM_JOB_ID"]
            assert argv[argv.index("-m") + 1] == "mohge.train" and argv[argv.index("--gpus") + 1] == "8"
    # the other jobs are single-node CPU jobs: the jobstep plugin's one `srun -n1` step each, nothing nested
    others = [j for j in all_jobs.values() if j["rule"] != "train"]
    assert {j["rule"] for j in others} >= {"data_tokenizer", "prepare_data"}
    for job in others:
        assert "--ntasks=1" in job["sbatch"] and not [a for a in job["sbatch"] if "gpu" in a], job["sbatch"]
        (srun,) = of(job, "srun")
        assert srun["argv"][0] == "-n1" and "--nodes=1" in srun["argv"] and not srun["nested"], srun["argv"]
    calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    assert not [c for c in calls if c["cmd"] == "srun" and c["nested"]]
    assert (work / "results" / "fakeslurm" / "runs" / RUN / "summary.json").exists()


@pytest.mark.slow
def test_one_node_gpu_job_is_one_jobstep_srun_around_torchrun(two_node_run):
    """One node with 8 GPUs (the same workdir: only training reruns, its launcher changed): --gpus=8 and no task
    count, as TOOLING.md says since plugin 2.7.1; the jobstep's `srun -n1` is the step, torchrun runs inside it."""
    work, _ = two_node_run
    state = work / "fake-slurm-state-1"
    out = slurm_snakemake(work, state, write_config(work, ONE_NODE))
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    (job,) = jobs(state).values()
    assert job["rule"] == "train"
    sbatch = job["sbatch"]
    assert {"--gpus=8", "--nodes=1", "--cpus-per-task=4"} <= set(sbatch), sbatch
    assert not [a for a in sbatch if a.startswith(("--ntasks", "--gres"))], sbatch
    (srun,) = of(job, "srun")
    assert srun["argv"][0] == "-n1" and "--gpus=8" in srun["argv"] and "--nodes=1" in srun["argv"], srun["argv"]
    assert not srun["nested"]
    (run,) = of(job, "torchrun")
    assert run["argv"][:3] == ["--standalone", "--nproc-per-node", "8"], run["argv"]
    assert run["env"]["SLURM_STEP_ID"] == "0"  # inside the jobstep's step, the only one
