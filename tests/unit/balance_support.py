"""One training step of one global batch, however it is split (tests/unit/test_balance_stats.py and its torchrun
worker, tests/unit/balance_worker.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from mohge.config import RunConfig
from mohge.data import TokenStream
from mohge.train.step import compute_loss, set_global_balance

BALANCE_STEP = 1  # a step at which L_G is on (group_aux_start_frac 0: from step 1)
BALANCE_ROWS = 8  # sequences in the global batch


def global_batch(cfg: RunConfig, data_dir: Path, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first :data:`BALANCE_ROWS` sequential windows (every layout of the test reads these)."""
    assert cfg.train.batch_size * world == BALANCE_ROWS
    return TokenStream.open(data_dir, "train").window_batch(0, BALANCE_ROWS, cfg.data_config.seq_len, cfg.train.seed)


def balance_step(model, cfg: RunConfig, x_BS, y_BS, rt, before_micro=lambda m: None) -> float:
    """This rank's part of one training step as the trainers run it (global-batch counts first where configured,
    then the micro-batches' backward passes); returns its mean micro-batch loss."""
    accum = cfg.train.grad_accum
    xs, ys = x_BS.chunk(accum), y_BS.chunk(accum)
    if cfg.loss.balance_stats == "global_batch":
        set_global_balance(model, list(xs), rt, None)
    loss = 0.0
    for m in range(accum):
        before_micro(m)
        total, *_ = compute_loss(model, xs[m], ys[m], cfg, BALANCE_STEP)
        (total / accum).backward()
        loss += total.item() / accum
    return loss
