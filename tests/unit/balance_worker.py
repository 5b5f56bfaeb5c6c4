"""Under torchrun: one step's loss and gradients of a parallel layout, the global batch split over the ranks, for
each run config given (tests/unit/test_balance_stats.py).

    torchrun --nproc-per-node N tests/unit/balance_worker.py DATA OUT.pt RUN.json [RUN.json ...]
"""

from __future__ import annotations

import functools
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
from balance_support import balance_step, global_batch

from mohge.config import load_run_config
from mohge.model import LanguageModel
from mohge.train.distributed.dcp import export_full
from mohge.train.distributed.layout import check_layout
from mohge.train.distributed.mesh import build_meshes
from mohge.train.distributed.parallelize import parallelize, scale_expert_grads, sync_gradients_on
from mohge.train.runtime import Runtime, exit_now, set_deterministic


def main() -> None:
    data_dir, out, *configs = sys.argv[1:]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    set_deterministic(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = Runtime(rank, world, torch.device("cpu"), None)
    results = []
    for config in configs:
        cfg = load_run_config(config)
        layout = check_layout(cfg, world)
        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        torch.manual_seed(cfg.train.seed)
        model = LanguageModel(cfg.model, cfg.loss)
        parallelize(model, layout, build_meshes(layout, "cpu"), torch.device("cpu"))
        x_BS, y_BS = (t.chunk(world)[rank] for t in global_batch(cfg, data_dir, world))
        sync = functools.partial(sync_gradients_on, model, micro_batches=cfg.train.grad_accum)
        loss = torch.tensor(balance_step(model, cfg, x_BS, y_BS, rt, sync))
        dist.all_reduce(loss)
        scale_expert_grads(model, layout)
        grads = export_full(model, cfg.model, layout, grads=True)
        results.append({"loss": loss.item() / world, "grads": grads})
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_now(0)  # no interpreter teardown after the group is destroyed (mohge.train.runtime.exit_now)
