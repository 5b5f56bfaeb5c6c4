"""What the training loop leaves to the layout it runs on, and the layout of one process or DDP.

The loop (:func:`mohge.train.trainer._train`) is written once, against :class:`Parallelism`; a layout supplies
what differs between one process, DDP and FSDP2 + expert parallelism (as torchtitan's ``parallelize`` step does):

* ``build``            the model on this rank, wrapped for the layout (``net`` runs the forward)
* ``micro_batch``      the gradient sync under accumulation: one gradient reduction per step, after the last
                       micro-batch
* ``reduce_grads``     what the gradients need after the backward, before clipping
* ``clip_grad_norm``   the global gradient norm, clipped
* ``save``, ``resume`` checkpoints; every layout's hold the same state: weights, AdamW state, the data position,
                       and per rank its RNG states and its log-window meter (:class:`mohge.train.step.WindowMeter`),
                       so a resumed run's first log row covers its whole window
* ``heldout``          the held-out loss (rank 0's is the one logged)
* ``export``           the final ``model.safetensors``, in the single-process names
* ``measure``, ``log_columns``, ``summary_columns``   what the layout adds to the log rows and the summary

:class:`Replicated` is one process, or DDP: every rank holds the whole model and reads the whole train split.
:class:`mohge.train.distributed.trainer.Sharded` is FSDP2 + expert parallelism with DCP checkpoints.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from mohge.config import RunConfig
from mohge.data import TokenStream
from mohge.model import LanguageModel
from mohge.model.moe import LayerStats

from . import checkpoint as ckpt
from .heldout import heldout_loss
from .runtime import Runtime, wrap_ddp
from .step import WindowMeter


@dataclass(frozen=True)
class Resumed:
    """Where a run starts: the step, the checkpoint folder, its data position (data.json) and this rank's
    log-window meter (:meth:`WindowMeter.state`; None: an empty window). The defaults: a fresh start."""

    step: int = 0
    path: Path | None = None
    data: dict[str, Any] | None = None
    meter: dict[str, Any] | None = None


def own(per_rank: list[Any], rt: Runtime) -> Any:
    """This rank's entry of a checkpoint's per-rank list: its own at the same world size (an exact resume),
    rank 0's on another."""
    return per_rank[rt.rank] if len(per_rank) == rt.world else per_rank[0]


class Parallelism:
    """A layout of the training loop over the ranks of ``rt`` (module docstring); a subclass defines every method
    that raises NotImplementedError here."""

    model: nn.Module  # the model as built (build)
    net: nn.Module  # what runs the forward: the model, or its wrapper (build)

    def __init__(self, cfg: RunConfig, rt: Runtime, scratch: Path) -> None:
        self.cfg, self.rt, self.scratch = cfg, rt, scratch
        self.resolved = ckpt.resolved_config(cfg)

    def train_stream(self, stream: TokenStream) -> TokenStream:
        """The part of the train split this rank samples from."""
        return stream

    def build(self) -> nn.Module:
        """Build the model of the seeded RNG on this rank's device (``self.model``, ``self.net``); returns it."""
        raise NotImplementedError

    def micro_batch(self, m: int, micro_batches: int) -> contextlib.AbstractContextManager:
        """The context of micro-batch ``m``'s forward and backward: gradients are reduced after the last one only."""
        raise NotImplementedError

    def reduce_grads(self) -> None:
        """After the step's backward, before clipping."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global gradient norm before clipping; clipped to ``max_norm`` when > 0."""
        raise NotImplementedError

    def save(self, step: int, opt: torch.optim.Optimizer, meter: WindowMeter, data: dict[str, Any]) -> Path:
        """Checkpoint the state after ``step`` steps (a collective); returns its folder on every rank."""
        raise NotImplementedError

    def resume(self, opt: torch.optim.Optimizer, require: bool) -> Resumed:
        """Load the newest valid checkpoint into the model, ``opt`` and the RNGs (a collective)."""
        raise NotImplementedError

    def heldout(self, data_dir: Path, batch_size: int) -> dict[str, float] | None:
        """The validation loss (:func:`mohge.train.heldout.heldout_loss`); rank 0's at least (a collective)."""
        raise NotImplementedError

    def export(self, path: Path) -> None:
        """Write the final weights in the single-process names (a collective)."""
        raise NotImplementedError

    def measure(self, meter: WindowMeter, layers: list[LayerStats]) -> None:
        """Add what the layout measures of one micro-batch's forward to ``meter``."""

    def log_columns(self, row: dict[str, Any], meter: WindowMeter) -> dict[str, Any]:
        """The layout's columns of a log row (a collective where they need every rank)."""
        return {}

    def summary_columns(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The layout's entries of the summary (rank 0)."""
        return {}


class Replicated(Parallelism):
    """One process, or DDP over the world: every rank holds the whole model; checkpoints are SCRATCH/step_*
    (:mod:`mohge.train.checkpoint`), written by rank 0 with every rank's RNG states and meter."""

    def build(self) -> nn.Module:
        self.model = LanguageModel(self.cfg.model, self.cfg.loss).to(self.rt.device)
        self.net = wrap_ddp(self.model, self.rt) if self.rt.world > 1 else self.model
        return self.model

    def micro_batch(self, m: int, micro_batches: int) -> contextlib.AbstractContextManager:
        if self.rt.world > 1 and m < micro_batches - 1:
            return self.net.no_sync()
        return contextlib.nullcontext()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm or float("inf"))

    def save(self, step: int, opt: torch.optim.Optimizer, meter: WindowMeter, data: dict[str, Any]) -> Path:
        ranks = [{"rng": ckpt.capture_rng(), "meter": meter.state()}]
        if self.rt.world > 1:
            mine, ranks = ranks[0], [None] * self.rt.world
            torch.distributed.all_gather_object(ranks, mine)
        if self.rt.main:
            rngs, meters = [r["rng"] for r in ranks], [r["meter"] for r in ranks]
            state = {"optimizer": opt.state_dict(), "scheduler": {"step": step}, "rng": rngs, "meters": meters}
            keep = self.cfg.train.keep_checkpoints
            ckpt.save_checkpoint(self.scratch, step, self.model.state_dict(), state, self.resolved, keep, data)
        self.rt.barrier()
        return self.scratch / ckpt.step_dir_name(step)

    def resume(self, opt: torch.optim.Optimizer, require: bool) -> Resumed:
        rt = self.rt
        found = ckpt.resume_point(self.scratch, self.resolved, rt.main, rt.world, rt.device, require)
        if found is None:
            return Resumed()
        self.model.load_state_dict(found["model"])
        opt.load_state_dict(found["state"]["optimizer"])
        ckpt.restore_rng(own(found["state"]["rng"], rt))
        meters = found["state"].get("meters")
        return Resumed(found["step"], found["path"], found["data"], own(meters, rt) if meters else None)

    def heldout(self, data_dir: Path, batch_size: int) -> dict[str, float] | None:
        tc, val = self.cfg.train, None
        if self.rt.main:  # the whole model is on rank 0: the others wait
            S = self.cfg.data_config.seq_len
            val = heldout_loss(self.model, data_dir, "val", batch_size, S, tc.eval_batches, self.rt.autocast)
        self.rt.barrier()
        return val

    def export(self, path: Path) -> None:
        if self.rt.main:
            ckpt.write_model(path, self.model.state_dict())
