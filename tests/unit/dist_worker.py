"""Run under torchrun: save the step-0 gradients of a parallel layout (single-process names, rank 0), then
train the same config with the training loop in the same process group.

    torchrun --nproc-per-node N tests/unit/dist_worker.py GRADS.pt RUN.json OUT DATA
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mohge.config import RunConfig, load_run_config
from mohge.data import TokenStream
from mohge.model import LanguageModel
from mohge.train import trainer as base
from mohge.train.distributed.dcp import export_full
from mohge.train.distributed.layout import check_layout
from mohge.train.distributed.mesh import build_meshes
from mohge.train.distributed.parallelize import parallelize, scale_expert_grads, sync_gradients_on
from mohge.train.distributed.trainer import rank_stream
from mohge.train.runtime import exit_now


def step0_grads(cfg: RunConfig, data_dir: str, out: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    tc, S = cfg.train, cfg.data_config.seq_len
    layout = check_layout(cfg, world)
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = LanguageModel(cfg.model, cfg.loss)
    parallelize(model, layout, build_meshes(layout, "cpu"), torch.device("cpu"))
    stream = rank_stream(TokenStream.open(data_dir, "train"), rank, world, S)
    x_BS, y_BS = stream.get_batch(0, tc.batch_size, S, tc.seed * 1000 + rank)
    micro = tc.batch_size // tc.grad_accum
    reduced_early = torch.zeros(())
    for m in range(tc.grad_accum):
        sync_gradients_on(model, m, tc.grad_accum)
        total, *_ = base.compute_loss(
            model, x_BS[m * micro : (m + 1) * micro], y_BS[m * micro : (m + 1) * micro], cfg, 0
        )
        (total / tc.grad_accum).backward()
        if m < tc.grad_accum - 1:  # no reduce-scatter yet: no sharded gradient anywhere
            reduced_early += sum(p.grad is not None for p in model.parameters())
    dist.all_reduce(reduced_early)
    scale_expert_grads(model, layout)
    grads = export_full(model, cfg.model, layout, grads=True)
    if rank == 0:
        torch.save(grads, out)
        Path(out).with_suffix(".sync.json").write_text(json.dumps({"reduced_before_last_micro": int(reduced_early)}))
    dist.barrier()


if __name__ == "__main__":
    grads_path, config, out, data_dir = sys.argv[1:]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    base.set_deterministic(True)
    cfg = load_run_config(config)
    step0_grads(cfg, data_dir, grads_path)
    rt = base.Runtime(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), None)
    base._train(cfg, Path(out), Path(out) / ".scratch", data_dir, False, rt)
    dist.destroy_process_group()
    exit_now(0)  # no interpreter teardown after the group is destroyed (mohge.train.runtime.exit_now)
