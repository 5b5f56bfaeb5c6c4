"""Sizing of a cluster run: per-GPU memory, whether it fits, and days to finish, by the trainer's own sharding plan.

    mohge sizing configs/paper.yaml [--nodes 1 2 4] [--gpus-per-node 8] [--gpu-mem 80] [--peak-tflops 989]
        [--mfu 0.4] [--global-batch 512] [--run NAME] [--json OUT]

CONFIG is a workflow config (its first MoHGE run, or ``--run``) or a resolved run config. ``--nodes`` and
``--gpus-per-node`` default to the workflow config's ``cluster`` section, the job the workflow submits; a config that
trains on CPUs (``cluster.gpus_per_node: 0``) is refused unless ``--gpus-per-node`` is given, and a resolved run
config, which has no ``cluster`` section, needs both. The layout planned is
the one the trainer runs: the config's ``train.parallel`` section, or without one the DDP replica that
``torchrun -m mohge.train`` trains on every GPU (one process on one GPU). It is checked by
:func:`mohge.train.distributed.check_layout` (a bad one is refused naming the key, exit 2), and a layout that does not
fit ``--gpu-mem`` is refused too, in one line naming ``train.parallel`` (exit 2, after the table). The model is built on
the meta device, each EP rank's share of the experts is taken (:func:`mohge.train.distributed.parallelize.apply_ep`)
and the FSDP2 units are listed by :func:`~mohge.train.distributed.parallelize.shard_plan`, as the trainer does; a
unit's parameters are sharded over its mesh (dense: dp_shard, experts: dp_shard / ep), dim 0 padded to a
multiple of the mesh size as FSDP2 pads it. Per GPU, the largest over the EP ranks:

* params, grads: fp32 shards, 4 + 4 bytes per parameter; optimizer: AdamW's two fp32 moments, 8 bytes;
* fsdp buffers: the largest unit gathered unsharded in bf16 twice (the one running and the one prefetched)
  plus its unsharded fp32 gradient before the reduce-scatter; under gradient accumulation (``grad_accum`` > 1)
  also every unit's unsharded fp32 gradient, held from the first micro-batch to the step's one reduce-scatter
  (:func:`mohge.train.distributed.parallelize.sync_gradients_on`); under DDP (no ``train.parallel``, several
  ranks) the gradient buckets instead, a second fp32 copy of every gradient (4 bytes per parameter);
* activations: the bytes saved for the backward per token of a micro-batch, tensor by tensor
  (:mod:`mohge.train.distributed.memory`, within 10% of a saved-tensor-hook measurement; ``block`` recompute keeps
  only each block's fp32 input plus one block's activations), for the config's expert backend, with EP's
  all_to_all buffers that outlive the forward, plus the bf16 copies of an EP rank's experts that every MoE
  layer keeps for the backward.

Fits: the sum is at most 90% of ``--gpu-mem`` (the rest for the CUDA context, NCCL and fragmentation).
Days: model FLOPs per token (:mod:`mohge.train.distributed.flops`) x tokens / (GPUs x peak x MFU). Tokens are
steps x sequences per step x seq_len. Which batch is held across the layouts is printed above the table: without
``--global-batch`` the per-GPU batch (``train.batch_size`` per process), so the sequences per step and the tokens grow
with the GPUs and the days stay level; with it the global batch (the per-process batch is global / GPUs, with the
config's micro-batch), so every layout trains the same tokens.

Time limit: a workflow config's training job asks SLURM for ``cluster.runtime_min`` minutes on every attempt
(:func:`mohge_studies.config.runs.train_resources`, the train rule's resources). A layout whose days exceed it is warned
about after the table, with what the retry path then does (docs/cluster.md): SLURM's SIGTERM before the limit, a
checkpoint of the current step, exit 143, and a resubmission by Snakemake (the SLURM profile's ``retries``) that resumes
from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import torch
from mohge_studies.config.runs import ClusterConfig, merge_config, train_resources
from mohge_studies.config.runs import plan as plan_runs

from mohge.config import ConfigError, ModelConfig, ParallelConfig, RunConfig, load_yaml_or_json
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.model import LanguageModel
from mohge.train.distributed.flops import model_flops_per_token
from mohge.train.distributed.layout import Layout, check_layout
from mohge.train.distributed.memory import activation_bytes_per_token, ep_weight_copies, eval_host_bytes  # noqa: F401

GiB = 1024**3
# the SLURM profile the docs submit with (docs/cluster.md): its `retries` and the train rule's --signal
ROOT = Path(__file__).resolve().parents[2]
SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"


def load_plan_input(paths: Sequence[str], run: str | None) -> tuple[RunConfig, ClusterConfig | None]:
    """One run (``run``, default the first MoHGE one) of merged workflow configs and their ``cluster`` section, or a
    resolved run config and None (it carries no cluster section)."""
    data: dict = {}
    for p in paths:
        data = merge_config(data, load_yaml_or_json(p))
    if "experiments" not in data:
        return RunConfig.from_dict(data), None
    runs = plan_runs(data)
    if run is None:
        run = next((n for n, c in runs.items() if c.family == "mohge"), next(iter(runs)))
    if run not in runs:
        raise ConfigError(f"--run {run!r}: not a run of {list(paths)} (runs: {', '.join(runs)})")
    return runs[run], ClusterConfig.from_dict(data.get("cluster") or {}, "cluster")


def load_run(paths: Sequence[str], run: str | None) -> RunConfig:
    """A resolved run config, or one run (``run``, default the first MoHGE one) of merged workflow configs."""
    return load_plan_input(paths, run)[0]


def cluster_sizes(
    cluster: ClusterConfig | None, nodes: list[int] | None, gpus_per_node: int | None, where: str
) -> tuple[list[int], int]:
    """The node counts and GPUs per node to plan: the options, else the config's ``cluster`` section; a size that
    cannot be sized is refused naming the key (a CPU config plans no GPU memory: it would print zeros)."""
    if cluster is None and (nodes is None or gpus_per_node is None):
        raise ConfigError(
            f"--nodes, --gpus-per-node: {where} is a resolved run config, which has no cluster section to take them "
            "from: give both"
        )
    if gpus_per_node is None:
        assert cluster is not None
        if cluster.gpus_per_node == 0:
            raise ConfigError(
                f"cluster.gpus_per_node=0: {where} trains on CPUs, and mohge sizing reports GPU memory and days; give "
                "--gpus-per-node G (and --nodes N) to plan its run on GPUs"
            )
        gpus_per_node = cluster.gpus_per_node
    if gpus_per_node <= 0:
        raise ConfigError(f"--gpus-per-node={gpus_per_node}: must be > 0")
    if nodes is None:
        assert cluster is not None
        nodes = [cluster.nodes]
    for n in nodes:
        if n <= 0:
            raise ConfigError(f"--nodes {n}: must be > 0")
    return nodes, gpus_per_node


def with_global_batch(cfg: RunConfig, global_batch: int, world: int) -> RunConfig:
    """``cfg`` with the per-process batch that makes ``global_batch`` sequences per step on ``world`` ranks."""
    if global_batch % world:
        raise ConfigError(f"--global-batch {global_batch}: not divisible by the {world} GPUs")
    per_rank, micro = global_batch // world, cfg.train.batch_size // cfg.train.grad_accum
    micro = math.gcd(per_rank, micro)
    train = dataclasses.replace(cfg.train, batch_size=per_rank, grad_accum=per_rank // micro)
    return dataclasses.replace(cfg, train=train)


def _shard_numel(p: torch.Tensor, mesh_size: int) -> int:
    rows = math.ceil(p.shape[0] / mesh_size) if p.ndim else 1
    return rows * (p.numel() // max(p.shape[0], 1) if p.ndim else 1)


def activation_bytes(cfg: ModelConfig, tokens: int, block_recompute: bool, ep: bool = False) -> float:
    """Activations of a micro-batch of ``tokens`` tokens: the bytes saved for the backward per token of
    :mod:`mohge.train.distributed.memory` (checked against a measurement), for the config's expert backend."""
    return tokens * activation_bytes_per_token(cfg, cfg.ffn.backend, ep=ep, block_recompute=block_recompute)


def run_layout(cfg: RunConfig, world: int) -> Layout:
    """The layout the trainer runs on ``world`` ranks: ``train.parallel``, or without it a whole replica per rank
    (DDP under torchrun, one process at world 1), planned as dp_shard 1 and ep 1."""
    if cfg.train.parallel is not None:
        return check_layout(cfg, world)
    replica = dataclasses.replace(cfg.train, parallel=ParallelConfig(dp_shard=1, ep=1))
    return check_layout(dataclasses.replace(cfg, train=replica), world)


def memory_per_gpu(cfg: RunConfig, layout: Layout) -> dict[str, float]:
    """Bytes per GPU by kind, the largest over the EP ranks, from the trainer's FSDP2 units on the meta device
    (or, without ``train.parallel``, the whole replica of DDP with its gradient buckets)."""
    ddp = cfg.train.parallel is None
    worst: dict[str, float] = {}
    from mohge.train.distributed.parallelize import apply_ep, shard_plan  # FSDP2: only when a layout is planned

    for ep_rank in range(layout.ep):
        with torch.device("meta"):
            model = LanguageModel(cfg.model, cfg.loss)
        apply_ep(model, layout, ep_rank)
        sharded, biggest = 0, 0
        local_experts = sum(p.numel() for n, p in model.named_parameters() if ".experts.local." in n)
        # under accumulation FSDP2 reduce-scatters once per step: until then every unit keeps its unsharded
        # gradient, accumulated in fp32 (reduce_dtype) over the micro-batches
        held = 4.0 * sum(p.numel() for p in model.parameters()) if cfg.train.grad_accum > 1 else 0.0
        for unit in shard_plan(model):
            size = layout.dp_shard if unit.mesh == "dense" else layout.dp_shard_mod_ep
            sharded += sum(_shard_numel(p, size) for _, p in unit.params)
            biggest = max(biggest, sum(p.numel() for _, p in unit.params))
        if not worst or sharded > worst["params"] / 4:
            worst = {
                "params": 4.0 * sharded,
                "grads": 4.0 * sharded,
                "optimizer": 8.0 * sharded,
                "fsdp_buffers": (4.0 * sharded if layout.world > 1 else 0.0) if ddp else (2 * 2 + 4) * biggest + held,
                "ep_weight_copies": ep_weight_copies(local_experts),
            }
    micro = cfg.train.batch_size // cfg.train.grad_accum
    tokens = micro * cfg.data_config.seq_len
    recompute = layout.activation_checkpointing == "block"
    # EP's stacked bf16 expert copies are kept for the backward beside the activations
    worst["activations"] = activation_bytes(cfg.model, tokens, recompute, ep=layout.ep > 1) + worst.pop(
        "ep_weight_copies"
    )
    worst["total"] = sum(worst.values())
    return worst


def plan_row(cfg: RunConfig, nodes: int, gpus_per_node: int, gpu_mem: float, peak: float, mfu: float) -> dict:
    world = nodes * gpus_per_node
    layout = run_layout(cfg, world)
    mem = memory_per_gpu(cfg, layout)
    S = cfg.data_config.seq_len
    tokens = cfg.train.steps * cfg.train.batch_size * world * S
    fpt = model_flops_per_token(cfg.model, S)
    days = fpt * tokens / (world * peak * 1e12 * mfu) / 86400
    return {
        "run": cfg.name,
        "nodes": nodes,
        "gpus": world,
        "dp_replicate": layout.dp_replicate,
        "dp_shard": layout.dp_shard,
        "ep": layout.ep,
        "layout": "fsdp" if cfg.train.parallel is not None else ("ddp" if world > 1 else "single"),
        "batch_per_gpu": cfg.train.batch_size,
        "grad_accum": cfg.train.grad_accum,
        "global_batch": cfg.train.batch_size * world,
        **{f"{k}_gib": v / GiB for k, v in mem.items()},
        "gpu_mem_gib": gpu_mem,
        "fits": mem["total"] <= 0.9 * gpu_mem * GiB,
        "tokens": tokens,
        "flops_per_token": fpt,
        "total_flops": fpt * tokens,
        "mfu": mfu,
        "peak_tflops": peak,
        "days": days,
    }


def refuse_unfit(cfg: RunConfig, rows: list[dict]) -> None:
    """A ConfigError in one line naming ``train.parallel`` when its layout does not fit on a planned cluster size."""
    unfit = [r for r in rows if not r["fits"]]
    if not unfit:
        return
    r = max(unfit, key=lambda r: r["total_gib"])
    where = ", ".join(f"{u['nodes']} x {u['gpus'] // u['nodes']}" for u in unfit)
    need = f"{r['total_gib']:.1f} GiB per GPU on {where} GPUs, over 90% of --gpu-mem {r['gpu_mem_gib']:g}"
    par = cfg.train.parallel
    if par is None:
        raise ConfigError(
            f"train.parallel: unset, so torchrun trains a whole DDP replica of {cfg.name} on every GPU: {need}; "
            "add a train.parallel section (FSDP2 dp_shard, expert-parallel ep)"
        )
    raise ConfigError(
        f"train.parallel: dp_shard={par.dp_shard}, ep={r['ep']}, activation_checkpointing="
        f"{par.activation_checkpointing} does not fit {cfg.name}: {need}; shard over more ranks, raise ep "
        "or recompute activations (activation_checkpointing: block)"
    )


COLUMNS = ("params", "grads", "optimizer", "fsdp_buffers", "activations", "total")


def fmt_gib(gib: float) -> str:
    """Memory with a unit that shows it: 47.1 GiB, 12.3 MiB, 0.5 KiB (a small config is not a row of zeros)."""
    if gib == 0:
        return "0"
    for unit, scale in (("GiB", 1.0), ("MiB", 2**-10), ("KiB", 2**-20)):
        if gib >= 0.1 * scale or unit == "KiB":
            return f"{gib / scale:.1f} {unit}"
    raise AssertionError


def fmt_count(n: float, unit: str = "") -> str:
    """1.07 T, 3.2 G, 45.1 M, 8.2 k, 512."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= 0.1 * scale and (prefix != "T" or n >= 1e11):
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def fmt_days(days: float) -> str:
    """9.6 days, 5.3 h, 12 min, under a minute."""
    if days >= 1:
        return f"{days:.1f} days"
    if days * 24 >= 1:
        return f"{days * 24:.1f} h"
    minutes = days * 24 * 60
    return f"{minutes:.0f} min" if minutes >= 1 else "under a minute"


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (memory per GPU)."""
    head = ["nodes x GPUs", "dp_shard x ep", "batch/GPU x accum", "seq/step", *COLUMNS, "fits", "tokens", "time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        layout = f"{r['dp_shard']} x {r['ep']}" + (f" (x{r['dp_replicate']} repl.)" if r["dp_replicate"] > 1 else "")
        if r["layout"] != "fsdp":
            layout = f"DDP, {r['gpus']} replicas" if r["layout"] == "ddp" else "one process"
        cells = [f"{r['nodes']} x {r['gpus'] // r['nodes']}", layout, f"{r['batch_per_gpu']} x {r['grad_accum']}"]
        cells.append(str(r["global_batch"]))
        cells += [fmt_gib(r[k + "_gib"]) for k in COLUMNS]
        cells += [f"{'yes' if r['fits'] else 'NO'} ({r['gpu_mem_gib']:.0f} GiB)", fmt_count(r["tokens"])]
        cells.append(fmt_days(r["days"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_note(cfg: RunConfig, global_batch: int | None, rows: list[dict]) -> str:
    """Which batch the rows hold across the layouts, and what follows for the tokens and the days."""
    if global_batch:
        return (
            f"batch: the global batch is held at {global_batch} sequences per step (--global-batch), the per-GPU "
            f"batch is {global_batch} / GPUs: every layout trains the same {fmt_count(rows[0]['tokens'])} tokens, "
            "and more GPUs take fewer days"
        )
    tokens = sorted({r["tokens"] for r in rows})
    grow = (
        f"so the sequences per step and the tokens grow with the GPUs ({fmt_count(tokens[0])} to "
        f"{fmt_count(tokens[-1])} tokens here) and the days stay level"
        if len(tokens) > 1
        else "so the sequences per step and the tokens grow with the GPUs and the days stay level"
    )
    return (
        f"batch: the per-GPU batch is held at train.batch_size = {cfg.train.batch_size} sequences per GPU, {grow}; "
        "--global-batch N holds the sequences per step instead"
    )


def slurm_retry_path(profile: Path = SLURM_PROFILE) -> tuple[int | None, int | None]:
    """The SLURM profile's ``retries`` and the seconds of the train rule's ``--signal=TERM@S`` (None: not found)."""
    if not profile.is_file():
        return None, None
    data = load_yaml_or_json(profile)
    retries = data.get("retries")
    extra = str(((data.get("set-resources") or {}).get("train") or {}).get("slurm_extra", ""))
    signal = re.search(r"--signal=(?:B:)?TERM@(\d+)", extra)
    return (retries if isinstance(retries, int) else None), (int(signal.group(1)) if signal else None)


def time_limit_warning(rows: list[dict], cluster: ClusterConfig, profile: Path = SLURM_PROFILE) -> list[str]:
    """Lines of a warning when a row's days exceed the time limit the workflow's training job asks SLURM for: the
    rows over it and the attempts each needs, what the retry path then does, and the limit of one job ([]: every
    row fits in one job)."""
    limit_min = train_resources(cluster)["runtime"]
    over = [r for r in rows if r["attempts"] > 1]
    if not over:
        return []
    retries, signal_s = slurm_retry_path(profile)
    term = f"SIGTERM {signal_s} s before the limit" if signal_s else "SIGTERM at the limit"
    shown = profile.parent.relative_to(ROOT) if profile.is_relative_to(ROOT) else profile.parent
    retry = f"retries: {retries} in {shown}" if retries is not None else "the SLURM profile's retries"
    lines = [
        f"warning: the plan exceeds the training job's time limit, cluster.runtime_min = {limit_min} min "
        f"({fmt_days(limit_min / 1440)} per attempt):",
        "  "
        + "; ".join(
            f"{r['nodes']} x {r['gpus'] // r['nodes']}: {fmt_days(r['days'])}, {r['attempts']} attempts" for r in over
        ),  # fmt: skip
    ]
    text = (
        f"Such a run lives on the retry path (docs/cluster.md): SLURM sends {term}, mohge.train finishes its step, "
        f"checkpoints it and exits 143, and Snakemake resubmits the job ({retry}), which waits in the queue again and "
        "resumes from that checkpoint."
    )
    need = max(r["attempts"] for r in over)
    if retries is not None and need > retries + 1:
        text += (
            f" With {retries} retries a job gets {retries + 1} attempts: a run that needs {need} stops unfinished; "
            "raise cluster.runtime_min or the profile's retries."
        )
    own = [r for r in over if (r["nodes"], r["gpus"] // r["nodes"]) == (cluster.nodes, cluster.gpus_per_node)]
    r = own[0] if own else max(over, key=lambda r: r["days"])
    text += (
        f" One job of {r['nodes']} x {r['gpus'] // r['nodes']} would need cluster.runtime_min >= "
        f"{math.ceil(r['days'] * 1440)}, where the site allows it."
    )
    return lines + textwrap.wrap(text, width=118, initial_indent="  ", subsequent_indent="  ")


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge sizing", description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", help="workflow config(s), merged in order, or a resolved run config")
    ap.add_argument("--nodes", type=int, nargs="+", help="node counts, one table row each (default: cluster.nodes)")
    ap.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: cluster.gpus_per_node)")
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU (default 80)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="peak per GPU (default 989: H100 bf16 dense)")
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilization (default 0.4)")
    ap.add_argument(
        "--global-batch", type=int, help="sequences per step, held on every layout (default: the per-GPU batch is held)"
    )
    ap.add_argument("--run", help="which run of a workflow config (default: the first mohge run)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    for key in ("gpu_mem", "peak_tflops", "mfu"):
        if getattr(args, key) <= 0:
            raise ConfigError(f"--{key.replace('_', '-')}={getattr(args, key)}: must be > 0")
    if args.global_batch is not None and args.global_batch <= 0:
        raise ConfigError(f"--global-batch={args.global_batch}: must be > 0")
    base, cluster = load_plan_input(args.configs, args.run)
    node_counts, gpus_per_node = cluster_sizes(cluster, args.nodes, args.gpus_per_node, " + ".join(args.configs))
    rows = []
    for nodes in node_counts:
        world = nodes * gpus_per_node
        cfg = with_global_batch(base, args.global_batch, world) if args.global_batch else base
        row = plan_row(cfg, nodes, gpus_per_node, args.gpu_mem, args.peak_tflops, args.mfu)
        if cluster is not None:
            row["job_runtime_min"] = train_resources(cluster)["runtime"]
            row["attempts"] = max(1, math.ceil(row["days"] * 1440 / row["job_runtime_min"]))
        rows.append(row)
    print(
        f"{base.name}: {fmt_count(rows[0]['flops_per_token'], 'FLOPs')}/token, peak {args.peak_tflops:g} TFLOPs, "
        f"MFU {args.mfu:g}"
    )
    print(batch_note(base, args.global_batch, rows))
    if cluster is not None:
        size = (
            f"{cluster.nodes} x {cluster.gpus_per_node} GPUs (cluster.nodes x cluster.gpus_per_node)"
            if cluster.gpus_per_node
            else f"{cluster.nodes} node(s) without GPUs (cluster.gpus_per_node = 0; the rows plan GPUs)"
        )
        runtime = train_resources(cluster)["runtime"]
        print(f"job: the workflow asks SLURM for {size} for {runtime} min per attempt (cluster.runtime_min)")
    print(table(rows))
    for line in time_limit_warning(rows, cluster) if cluster is not None else []:
        print(line)
    if args.json:
        write_json_atomic(args.json, rows)
    refuse_unfit(base, rows)
    return 0
