"""`mohge bench train` times the step the trainer takes: its loss is mohge.train.step.compute_loss's."""

from __future__ import annotations

import copy

import torch
from conftest import tiny_model_config
from mohge_studies.bench.train import Trainer

from mohge.config import LossConfig, RunConfig, TrainConfig
from mohge.train.step import compute_loss


def test_the_timed_step_minimizes_the_trainers_loss():
    """Every aux term with its own coefficient (group_aux at loss.group_aux_coeff, not at expert_aux_coeff), as the
    trainer weighs them at the last step of the bench's schedule (10 steps), where every term is on."""
    cfg = tiny_model_config(vocab_size=300)
    t = Trainer(cfg, batch=2, seq=8)
    run = RunConfig(
        model=cfg,
        loss=LossConfig(),
        train=TrainConfig(steps=10, warmup_steps=1),
        data={"vocab_size": 300, "seq_len": 8},
    )
    want, _, aux, _ = compute_loss(copy.deepcopy(t.model), t.x, t.y, run, 9)
    assert run.loss.group_aux_coeff != run.loss.expert_aux_coeff and aux > 0
    assert torch.equal(t.step(), want.detach())
