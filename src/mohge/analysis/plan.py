"""The planner: per-GPU memory, fit and days to finish of a run on a cluster, from the trainer's own sharding plan.

    mohge plan configs/paper.yaml --nodes 4 --gpus-per-node 8 [--gpu-mem 80] [--peak-tflops 989]
        [--mfu 0.4] [--global-batch 512] [--run NAME] [--json OUT]

CONFIG is a workflow config (its first MoHGE run, or ``--run``) or a resolved run config. The layout planned is
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
steps x sequences per step x seq_len, where sequences per step = ``train.batch_size`` per process x GPUs, or
``--global-batch`` (then the per-process batch is global / GPUs, with the config's micro-batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence

import torch

from mohge.config import ConfigError, ModelConfig, ParallelConfig, RunConfig, load_yaml_or_json
from mohge.config.runs import merge_config
from mohge.config.runs import plan as plan_runs
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.model import LanguageModel
from mohge.model.params import count_params
from mohge.train.distributed.flops import model_flops_per_token
from mohge.train.distributed.layout import Layout, check_layout
from mohge.train.distributed.memory import activation_bytes_per_token, ep_weight_copies
from mohge.train.distributed.parallelize import apply_ep, shard_plan

GiB = 1024**3


def load_run(paths: Sequence[str], run: str | None) -> RunConfig:
    """A resolved run config, or one run (``run``, default the first MoHGE one) of merged workflow configs."""
    data: dict = {}
    for p in paths:
        data = merge_config(data, load_yaml_or_json(p))
    if "experiments" not in data:
        return RunConfig.from_dict(data)
    runs = plan_runs(data)
    if run is None:
        run = next((n for n, c in runs.items() if c.family == "mohge"), next(iter(runs)))
    if run not in runs:
        raise ConfigError(f"--run {run!r}: not a run of {list(paths)} (runs: {', '.join(runs)})")
    return runs[run]


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


def eval_host_bytes(cfg: RunConfig, on_cpu: bool) -> float:
    """Host memory of an evaluation or tracing job, by the planner's byte rules: the model is built in fp32 on
    the host and its loaded state dict held beside it (2 x 4 bytes per parameter), plus, when the job runs on the
    CPU, the activations of one evaluation batch in fp32 (twice :func:`activation_bytes`' bf16, a forward under
    no_grad keeps one block's activations: the ``block`` rule), plus 2 GiB for the interpreter, torch and lm-eval."""
    weights = 2 * 4.0 * count_params(cfg.model)["total_sum"]
    tokens = cfg.eval.batch_size * cfg.data_config.seq_len
    acts = 2 * activation_bytes(cfg.model, tokens, block_recompute=True) if on_cpu else 0.0
    return weights + acts + 2 * GiB


COLUMNS = ("params", "grads", "optimizer", "fsdp_buffers", "activations", "total")


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (memory per GPU in GiB)."""
    head = ["nodes x GPUs", "dp_shard x ep", "batch/GPU x accum", *COLUMNS, "fits", "tokens", "days"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        layout = f"{r['dp_shard']} x {r['ep']}" + (f" (x{r['dp_replicate']} repl.)" if r["dp_replicate"] > 1 else "")
        if r["layout"] != "fsdp":
            layout = f"DDP, {r['gpus']} replicas" if r["layout"] == "ddp" else "one process"
        cells = [f"{r['nodes']} x {r['gpus'] // r['nodes']}", layout, f"{r['batch_per_gpu']} x {r['grad_accum']}"]
        cells += [f"{r[k + '_gib']:.1f} GiB" for k in COLUMNS]
        cells += [f"{'yes' if r['fits'] else 'NO'} ({r['gpu_mem_gib']:.0f} GiB)", f"{r['tokens'] / 1e12:.2f} T"]
        cells.append(f"{r['days']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge plan", description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", help="workflow config(s), merged in order, or a resolved run config")
    ap.add_argument("--nodes", type=int, nargs="+", required=True, help="node counts (one table row each)")
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--gpu-mem", type=float, default=80.0, help="GiB per GPU (default 80)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="peak per GPU (default 989: H100 bf16 dense)")
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilization (default 0.4)")
    ap.add_argument("--global-batch", type=int, help="sequences per step, kept on every cluster size")
    ap.add_argument("--run", help="which run of a workflow config (default: the first mohge run)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    for key in ("gpus_per_node", "gpu_mem", "peak_tflops", "mfu"):
        if getattr(args, key) <= 0:
            raise ConfigError(f"--{key.replace('_', '-')}={getattr(args, key)}: must be > 0")
    base = load_run(args.configs, args.run)
    rows = []
    for nodes in args.nodes:
        if nodes <= 0:
            raise ConfigError(f"--nodes {nodes}: must be > 0")
        world = nodes * args.gpus_per_node
        cfg = with_global_batch(base, args.global_batch, world) if args.global_batch else base
        rows.append(plan_row(cfg, nodes, args.gpus_per_node, args.gpu_mem, args.peak_tflops, args.mfu))
    print(
        f"{base.name}: {rows[0]['flops_per_token'] / 1e9:.2f} GFLOPs/token, peak {args.peak_tflops:g} TFLOPs, "
        f"MFU {args.mfu:g}"
    )
    print(table(rows))
    if args.json:
        write_json_atomic(args.json, rows)
    refuse_unfit(base, rows)
    return 0
