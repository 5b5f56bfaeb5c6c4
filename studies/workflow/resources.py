"""SLURM sizes and launchers of the workflow's jobs, functions of the config's `cluster` section and the run:
a smoke config asks for minutes, the paper config for its nodes and GPUs (docs/cluster.md)."""

from __future__ import annotations

import math

from mohge_studies.config.runs import ClusterConfig, UtilizationConfig, train_resources  # noqa: F401 (the train rule's sizes)

from mohge.config import DataConfig, RunConfig
from mohge.train.distributed.memory import eval_host_bytes


def train_launcher(cluster: ClusterConfig) -> str:
    """One process: python; one node with several GPUs: torchrun --standalone; several nodes: the rule's own
    srun starts one torchrun per node (the job declares `mpi`, so the plugin runs the rule outside any step and
    this srun is the job's only step), which meet through a c10d rendezvous on the step's first host. The host
    is read inside each task from SLURM_STEP_NODELIST, which srun sets: the jobstep plugin removes the job's
    SLURM_* variables (SLURM_JOB_ID aside) from the rule's environment."""
    nodes, gpus = cluster.nodes, cluster.gpus_per_node
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


def eval_gpus(cluster: ClusterConfig) -> int:
    """Evaluation and tracing use one GPU when the config trains on GPUs."""
    return min(1, cluster.gpus_per_node)


def eval_mem_mb(run: RunConfig, cluster: ClusterConfig) -> int:
    """Host memory of an evaluate or trace job (MiB, SLURM's --mem unit) from the model's size, by the sizing's
    byte rules (:func:`mohge.train.distributed.memory.eval_host_bytes`, torch-free): fp32 weights and their loaded
    copy, the activations of one evaluation batch when the job runs on the CPU, and the runtime. The same on every
    attempt."""
    return math.ceil(eval_host_bytes(run, on_cpu=eval_gpus(cluster) == 0) / 2**20)


def eval_runtime(cluster: ClusterConfig, attempt: int) -> int:
    """Minutes of an evaluate, trace or inference job: a tenth of training's, at least 30, growing with the
    attempt."""
    return max(30, cluster.runtime_min // 10) * attempt


def data_job_minutes(data: DataConfig, attempt: int, hub_minutes: int) -> int:
    """A data job's runtime: 20 minutes for the small local sources, ``hub_minutes`` for a streamed hf corpus,
    growing with the attempt."""
    return (hub_minutes if data.source == "hf" else 20) * attempt


def utilization_nproc(run: RunConfig, util: UtilizationConfig) -> int:
    """Ranks of the measured per-rank expert time of a run (utilization.measure_nproc, MoHGE runs only; 0: the
    analytic placement alone)."""
    return util.measure_nproc if util.measure_nproc > 0 and run.family == "mohge" else 0


def utilization_one_device(cluster: ClusterConfig, nproc: int) -> bool:
    """A config that trains on GPUs, fewer of them on a node than the measurement's ranks, times the ranks in turns on
    one GPU (``mohge utilization --one-device``); CPU configs and nodes with a GPU per rank launch the ranks."""
    return 0 < cluster.gpus_per_node < nproc
