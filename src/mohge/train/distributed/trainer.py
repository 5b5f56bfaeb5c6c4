"""The training loop on a parallel layout: what ``python -m mohge.train`` runs under torchrun (WORLD_SIZE > 1)
when the run config has a ``train.parallel`` section.

The objective, optimizer, schedule, clipping, log rows, non-finite guard and final outputs are those of
:mod:`mohge.train` (its functions are reused); what changes:

* the model is built on the meta device, parallelized (:func:`.parallelize.parallelize`: EP, activation
  checkpointing, FSDP2), then each rank materialises its own shards (:mod:`.meta_init`: the same seed,
  so the same initial weights as one process; no rank ever holds more than its shards and one block);
* every rank reads a disjoint part of the train split (``train.data_order``): random: rank r of W samples its
  windows only from tokens [r N / W, (r + 1) N / W), step s drawing ``get_batch(s, batch_size, seq_len,
  seed * 1000 + r)`` there; sequential: rank r reads the r-th ``batch_size`` of the next ``batch_size x W``
  windows of the whole split (:class:`mohge.data.stream.TrainBatches`), the global position checkpointed, so a
  run resumed on another world size reads on from the next window;
* checkpoints are sharded (:mod:`.dcp`, under SCRATCH/dcp); the final ``model.safetensors`` is streamed from
  the shards to rank 0 one parameter at a time (:func:`.dcp.write_safetensors`), the final validation loss
  computed on the sharded model;
* log rows add ``model_flops_per_token``, ``mfu`` (against ``train.parallel.peak_tflops`` per device) and
  ``expert_flops_per_rank`` (training FLOPs of each rank's local experts per step, mean over the window).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from mohge.config import ConfigError, RunConfig
from mohge.core.atomic import write_json_atomic, write_text_atomic
from mohge.data import TokenStream
from mohge.data.stream import TrainBatches
from mohge.model import LanguageModel
from mohge.model.moe import LayerStats

from .. import checkpoint as ckpt
from .. import step as training
from ..heldout import heldout_loss
from ..runtime import GracefulStop, Runtime, Stopped
from ..setup import FINAL_FILES, check_data, data_seal, finish, resolve_data
from . import dcp
from .ep_layer import ExpertParallelExperts
from .flops import expert_flops, model_flops_per_token
from .layout import Layout, check_layout
from .mesh import build_meshes
from .meta_init import build_on_meta, materialize
from .parallelize import clip_grad_norm, parallelize, scale_expert_grads, sync_gradients_on

log = logging.getLogger("mohge.train.distributed")


def rank_stream(stream: TokenStream, rank: int, world: int, seq_len: int) -> TokenStream:
    """This rank's disjoint share of ``stream``: tokens [rank N / world, (rank + 1) N / world)."""
    n = len(stream)
    lo, hi = rank * n // world, (rank + 1) * n // world
    if hi - lo < seq_len + 1:
        raise ConfigError(
            f"train.parallel: {world} ranks leave {hi - lo} train tokens per rank ({stream.path} has {n}); "
            f"each needs at least data.seq_len + 1 = {seq_len + 1}"
        )
    part = copy.copy(stream)
    part.tokens = stream.tokens[lo:hi]
    part.levels = None if stream.levels is None else stream.levels[lo:hi]
    return part


def step_expert_flops(model: LanguageModel, layers: list[LayerStats]) -> torch.Tensor:
    """Training FLOPs of this rank's routed experts in the last forward (rows it processed x widths)."""
    total = torch.zeros((), dtype=torch.float64)
    for layer, stats in zip(model.moe_layers(), layers, strict=True):
        ex = layer.experts
        if isinstance(ex, ExpertParallelExperts):  # the rows this rank received from its EP group
            rows, widths = ex.rows_local, ex.local_widths
        else:  # no EP: this rank computes the experts of its own tokens
            rows, widths = stats.counts_E, layer.ffn_cfg.per_expert_widths
        total += expert_flops(rows.cpu(), torch.tensor(widths), model.cfg.d_model)
    return total


def train_parallel(
    cfg: RunConfig,
    out: Path,
    scratch: Path,
    data: str | None,
    require_resume: bool,
    rt: Runtime,
    stop: GracefulStop | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` on the layout ``cfg.train.parallel`` over the world of ``rt``; returns the summary."""
    stop = stop or GracefulStop()
    layout = check_layout(cfg, rt.world)
    wall0, tc = time.perf_counter(), cfg.train
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    scratch.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data(cfg, data, scratch, rt)
    if rt.main:  # before the first step, as one process does: a changed shard or tokenizer is named, not trained on
        check_data(cfg, data_dir, scratch)
    rt.barrier()
    S = cfg.data_config.seq_len
    stream = TokenStream.open(data_dir, "train")
    if tc.data_order == "random":
        stream = rank_stream(stream, rt.rank, rt.world, S)
    resolved = ckpt.resolved_config(cfg)
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model, rng = build_on_meta(cfg)  # no storage yet: each rank materialises its own shards after sharding
    parallelize(model, layout, build_meshes(layout, rt.device.type), rt.device)
    materialize(model, rng, rt.device)  # the same initial weights as one process, one part at a time
    opt = training.build_optimizer(model, tc)
    dcp_root = scratch / "dcp"
    start, last_good, position = dcp.resume(dcp_root, resolved, model, opt, require_resume)
    if last_good is not None:
        log.info("resuming from %s (step %d of %d, data %s)", last_good, start, tc.steps, position)
    window0 = ckpt.start_window(position, tc.data_order, last_good)
    batches = TrainBatches(stream, tc.data_order, tc.batch_size, S, tc.seed, rt.rank, rt.world, start, window0)
    log_path = scratch / "train_log.jsonl"
    rows = training.read_log(log_path, start)
    if rt.main:
        write_text_atomic(log_path, "".join(json.dumps(r) + "\n" for r in rows))
    rt.barrier()
    if rt.main:
        log.info("layout %s on %s", layout, rt.device)
    model.train()
    micro_B, tokens_per_step = tc.batch_size // tc.grad_accum, tc.batch_size * S * rt.world
    fpt = model_flops_per_token(cfg.model, S)
    meter, trained_tokens, train_time = training.WindowMeter(), 0, 0.0
    flops_window = torch.zeros((), dtype=torch.float64)
    bar = tqdm(total=tc.steps, initial=start, disable=not rt.main, desc=cfg.name, unit="step", mininterval=30)
    log_fh = open(log_path, "a") if rt.main else None  # noqa: SIM115 (closed below)
    try:
        with stop.in_loop():
            for s in range(start, tc.steps):
                t0 = time.perf_counter()
                lr = training.lr_at(s, tc)
                for group in opt.param_groups:
                    group["lr"] = lr
                x_BS, y_BS = batches.batch(s)
                sums = torch.zeros(3, device=rt.device)
                for m in range(tc.grad_accum):
                    sync_gradients_on(model, m, tc.grad_accum)  # one reduce-scatter a step, after the last micro-batch
                    xm, ym = (t[m * micro_B : (m + 1) * micro_B].to(rt.device) for t in (x_BS, y_BS))
                    with torch.autocast(rt.device.type, dtype=rt.autocast, enabled=rt.autocast is not None):
                        total, lm, aux, layers = training.compute_loss(model, xm, ym, cfg, s)
                    (total / tc.grad_accum).backward()
                    sums += torch.stack([total, lm, aux]).detach().float() / tc.grad_accum
                    meter.add_micro(layers)
                    flops_window += step_expert_flops(model, layers)
                scale_expert_grads(model, layout)
                dist.all_reduce(sums)
                sums /= rt.world
                gnorm = clip_grad_norm(model, tc.grad_clip, layout)
                vals = training.optimizer_step(s, sums, gnorm, opt, rt, last_good)
                dt = time.perf_counter() - t0
                train_time += dt
                trained_tokens += tokens_per_step
                meter.add_step(vals, tokens_per_step, dt)
                bar.update(1)
                if (s + 1) % tc.log_every == 0 or s + 1 == tc.steps:
                    row = meter.row(s, lr, cfg, rt, (s + 1) * tokens_per_step)
                    row.update(throughput(row, fpt, flops_window / meter.steps, layout, rt.device))
                    if tc.data_order == "sequential":  # where the next step reads (epoch, shard, offset for humans)
                        row["data"] = batches.position(s + 1)
                    meter, flops_window = training.WindowMeter(), torch.zeros((), dtype=torch.float64)
                    bar.set_postfix(training.progress(row))
                    if rt.main:
                        rows.append(row)
                        log_fh.write(json.dumps(row) + "\n")
                        log_fh.flush()
                if tc.eval_every and (s + 1) % tc.eval_every == 0:  # every rank: the sharded model, the same batches
                    with torch.no_grad():
                        val = heldout_loss(model, data_dir, "val", micro_B, S, tc.eval_batches, rt.autocast)
                    if rt.main:
                        rows.append({"step": s, "val_loss": val["loss"], "val_ppl": val["ppl"]})
                        log_fh.write(json.dumps(rows[-1]) + "\n")
                        log_fh.flush()
                signum = stop.requested(rt)  # SIGTERM / SIGINT on any rank: every rank checkpoints this step
                if (s + 1) % tc.ckpt_every == 0 or s + 1 == tc.steps or signum:
                    last_good = dcp.save(
                        dcp_root, s + 1, model, opt, resolved, tc.keep_checkpoints, batches.position(s + 1)
                    )
                if signum:
                    raise Stopped(signum, s + 1, last_good)
    finally:
        bar.close()
        if log_fh is not None:
            log_fh.close()
    # the final outputs from the shards: the validation loss on every rank, the weights streamed to rank 0
    # one parameter at a time (no rank holds the whole model)
    with torch.no_grad():
        val = heldout_loss(model, data_dir, "val", micro_B, S, tc.eval_batches, rt.autocast)
    if rt.main:
        (out / ckpt.MANIFEST).unlink(missing_ok=True)  # a folder being rewritten is unsealed until the end
    dcp.write_safetensors(out / "model.safetensors", model, cfg.model, layout)
    summary: dict[str, Any] = {}
    if rt.main:
        summary = finish(
            cfg, out, data_dir, None, rt, rows, resolved, start, micro_B, trained_tokens, train_time, val=val
        )
        summary["data_position"] = batches.position(tc.steps)  # random: the step; sequential: window, epoch, ...
        tps = summary["tokens_per_s"]
        mfu = tps * fpt / (rt.world * layout.peak_tflops * 1e12) if tps and layout.peak_tflops else None
        summary.update(
            mfu=mfu,
            model_flops_per_token=fpt,
            layout={"dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "ep": layout.ep},
        )
        summary["wall_time_s"] = time.perf_counter() - wall0
        write_json_atomic(out / "summary.json", summary)
        ckpt.write_manifest(out, list(FINAL_FILES), data_seal(data_dir))  # last: the folder is complete and sealed
        log.info("done: %s", json.dumps(summary))
    rt.barrier()
    return summary


def throughput(row: dict, fpt: float, expert_flops_rank: torch.Tensor, layout: Layout, device: torch.device) -> dict:
    """Log columns: model FLOPs per token, MFU, each rank's expert FLOPs per step (a collective)."""
    per_rank = [torch.zeros((), dtype=torch.float64, device=device) for _ in range(layout.world)]
    dist.all_gather(per_rank, expert_flops_rank.to(device, torch.float64))
    tps = row.get("tokens_per_s")
    mfu = tps * fpt / (layout.world * layout.peak_tflops * 1e12) if tps and layout.peak_tflops else None
    return {"model_flops_per_token": fpt, "mfu": mfu, "expert_flops_per_rank": [float(f) for f in per_rank]}
