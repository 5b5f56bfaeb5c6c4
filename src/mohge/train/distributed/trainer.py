"""The sharded layout of the training loop: what ``python -m mohge.train`` runs on under torchrun (WORLD_SIZE > 1)
when the run config has a ``train.parallel`` section.

The loop is :func:`mohge.train.trainer._train`, the same on every layout (objective, optimizer, schedule, log rows,
non-finite guard, checkpoint cadence, final outputs); :class:`Sharded` supplies what differs
(:mod:`mohge.train.parallelism`):

* the model is built on the meta device, parallelized (:func:`.parallelize.parallelize`: EP, activation
  checkpointing, FSDP2), then each rank materialises its own shards (:mod:`.meta_init`: the same seed,
  so the same initial weights as one process; no rank ever holds more than its shards and one block);
* gradients are reduce-scattered once a step, after the last micro-batch (:func:`.parallelize.sync_gradients_on`);
  expert gradients are scaled to the mean over the world and the norm is taken over every rank's shards
  (:func:`.parallelize.scale_expert_grads`, :func:`.parallelize.clip_grad_norm`);
* every rank reads a disjoint part of the train split (``train.data_order``): random: rank r of W samples its
  windows only from tokens [r N / W, (r + 1) N / W), step s drawing ``get_batch(s, batch_size, seq_len,
  seed * 1000 + r)`` there; sequential: rank r reads the r-th ``batch_size`` of the next ``batch_size x W``
  windows of the whole split (:class:`mohge.data.stream.TrainBatches`), the global position checkpointed, so a
  run resumed on another world size reads on from the next window;
* checkpoints are sharded (:mod:`.dcp`, under SCRATCH/dcp); the held-out loss is computed on the sharded model by
  every rank; the final ``model.safetensors`` is streamed from the shards to rank 0 one parameter at a time
  (:func:`.dcp.write_safetensors`);
* log rows add ``model_flops_per_token``, ``mfu`` (against ``train.parallel.peak_tflops`` per device),
  ``expert_flops_per_rank`` (training FLOPs of each rank's local experts per step, mean over the window) with its
  max / mean ``expert_flops_max_mean``, and under expert parallelism the measured ``expert_seconds_per_rank`` with
  ``expert_seconds_max_mean`` (:data:`LOG_COLUMNS`); the summary adds ``mfu``, ``model_flops_per_token`` and the
  ``layout``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from mohge.config import ConfigError, RunConfig
from mohge.data import TokenStream
from mohge.model import LanguageModel
from mohge.model.moe import LayerStats

from ..heldout import heldout_loss
from ..parallelism import Parallelism, Resumed
from ..runtime import Runtime
from ..step import WindowMeter
from . import dcp
from .ep_layer import ExpertParallelExperts
from .flops import expert_flops, model_flops_per_token
from .layout import Layout, check_layout
from .mesh import build_meshes
from .meta_init import build_on_meta, materialize
from .parallelize import clip_grad_norm, parallelize, scale_expert_grads, sync_gradients_on

log = logging.getLogger("mohge.train.distributed")

# The log row's columns this layout adds (:meth:`Sharded.log_columns`; the expert seconds under expert parallelism).
LOG_COLUMNS = (
    "model_flops_per_token",
    "mfu",
    "expert_flops_per_rank",
    "expert_flops_max_mean",
    "expert_seconds_per_rank",
    "expert_seconds_max_mean",
)


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


class Sharded(Parallelism):
    """FSDP2 + expert parallelism over the layout ``cfg.train.parallel`` (checked against the world at once,
    before anything starts), with DCP checkpoints (module docstring)."""

    def __init__(self, cfg: RunConfig, rt: Runtime, scratch: Path) -> None:
        self.layout = check_layout(cfg, rt.world)
        super().__init__(cfg, rt, scratch)
        self.flops_per_token = model_flops_per_token(cfg.model, cfg.data_config.seq_len)

    def train_stream(self, stream: TokenStream) -> TokenStream:
        if self.cfg.train.data_order == "random":
            return rank_stream(stream, self.rt.rank, self.rt.world, self.cfg.data_config.seq_len)
        return stream

    def build(self) -> nn.Module:
        model, rng = build_on_meta(self.cfg)  # no storage yet: each rank materialises its own shards after sharding
        parallelize(model, self.layout, build_meshes(self.layout, self.rt.device.type), self.rt.device)
        materialize(model, rng, self.rt.device)  # the same initial weights as one process, one part at a time
        if self.rt.main:
            log.info("layout %s on %s", self.layout, self.rt.device)
        self.model = self.net = model
        return model

    def micro_batch(self, m: int, micro_batches: int) -> contextlib.AbstractContextManager:
        sync_gradients_on(self.model, m, micro_batches)  # one reduce-scatter a step, after the last micro-batch
        return contextlib.nullcontext()

    def reduce_grads(self) -> None:
        scale_expert_grads(self.model, self.layout)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm(self.model, max_norm, self.layout)

    def save(self, step: int, opt: torch.optim.Optimizer, meter: WindowMeter, data: dict[str, Any]) -> Path:
        keep = self.cfg.train.keep_checkpoints
        return dcp.save(self.scratch / "dcp", step, self.model, opt, self.resolved, keep, data, meter.state())

    def resume(self, opt: torch.optim.Optimizer, require: bool) -> Resumed:
        step, path, data, meter = dcp.resume(self.scratch / "dcp", self.resolved, self.model, opt, require)
        return Resumed(step, path, data, meter)

    def heldout(self, data_dir: Path, batch_size: int) -> dict[str, float] | None:
        tc, S = self.cfg.train, self.cfg.data_config.seq_len  # every rank: the sharded model, the same batches
        return heldout_loss(self.model, data_dir, "val", batch_size, S, tc.eval_batches, self.rt.autocast)

    def export(self, path: Path) -> None:
        dcp.write_safetensors(path, self.model, self.cfg.model, self.layout)

    def measure(self, meter: WindowMeter, layers: list[LayerStats]) -> None:
        meter.expert_flops += step_expert_flops(self.model, layers)

    def log_columns(self, row: dict[str, Any], meter: WindowMeter) -> dict[str, Any]:
        per_step = meter.expert_flops / meter.steps
        return throughput(row, self.flops_per_token, per_step, self.layout, self.rt.device, self.model, meter.steps)

    def summary_columns(self, summary: dict[str, Any]) -> dict[str, Any]:
        layout, tps = self.layout, summary["tokens_per_s"]
        return {
            "mfu": mfu(tps, self.flops_per_token, layout),
            "model_flops_per_token": self.flops_per_token,
            "layout": {"dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "ep": layout.ep},
        }


def mfu(tokens_per_s: float | None, flops_per_token: float, layout: Layout) -> float | None:
    """Model FLOPs utilisation against ``train.parallel.peak_tflops`` per device (None without either)."""
    if not tokens_per_s or not layout.peak_tflops:
        return None
    return tokens_per_s * flops_per_token / (layout.world * layout.peak_tflops * 1e12)


def throughput(
    row: dict,
    fpt: float,
    expert_flops_rank: torch.Tensor,
    layout: Layout,
    device: torch.device,
    model: torch.nn.Module,
    steps: int,
) -> dict:
    """Log columns (a collective): model FLOPs per token, MFU, each rank's expert FLOPs per step (analytic, from the
    rows it received) and, under expert parallelism, each rank's measured seconds of local expert compute per step
    (forward passes, :class:`ComputeTimer`), with the max / mean over ranks of both: whether the analytic balance
    is the one the ranks experience."""
    timers = [m.timer for m in model.modules() if isinstance(m, ExpertParallelExperts)]
    mine = torch.tensor([float(expert_flops_rank), sum(t.take() for t in timers) / steps])
    per_rank = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(layout.world)]
    dist.all_gather(per_rank, mine.to(device, torch.float64))
    flops, seconds = ([float(r[i]) for r in per_rank] for i in (0, 1))
    out = {
        "model_flops_per_token": fpt,
        "mfu": mfu(row.get("tokens_per_s"), fpt, layout),
        "expert_flops_per_rank": flops,
    }
    out["expert_flops_max_mean"] = max(flops) / (sum(flops) / len(flops)) if sum(flops) > 0 else None
    if timers:
        out["expert_seconds_per_rank"] = seconds
        out["expert_seconds_max_mean"] = max(seconds) / (sum(seconds) / len(seconds)) if sum(seconds) > 0 else None
    return out
