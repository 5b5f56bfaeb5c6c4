"""Run under torchrun: each rank's peak host memory while the model is built (meta device, parallelized, then
materialised) and while the final model.safetensors is written; OUT/rank_<r>.json per rank, OUT/model.safetensors.

    torchrun --nproc-per-node N tests/unit/dist_memory_worker.py RUN.json OUT

Peaks are Linux's VmHWM (peak resident set), reset before each phase by writing 5 to /proc/self/clear_refs,
less the resident set at the start of the phase.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from mohge.config import load_run_config
from mohge.train.distributed.dcp import write_safetensors
from mohge.train.distributed.layout import check_layout
from mohge.train.distributed.mesh import build_meshes
from mohge.train.distributed.meta_init import build_on_meta, materialize
from mohge.train.distributed.parallelize import parallelize
from mohge.train.runtime import exit_now


def memory() -> dict[str, int]:
    """Resident set and its peak, bytes."""
    status = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", status).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def start_phase() -> int:
    Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from the current resident set
    return memory()["VmRSS"]


if __name__ == "__main__":
    config, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    cfg = load_run_config(config)
    layout = check_layout(cfg, dist.get_world_size())
    meshes = build_meshes(layout, "cpu")  # before the phase: the meshes' own groups are not the model
    # and torch's one-time imports that the first meta tensor and the first DTensor pull in (~100 MB of code)
    with torch.device("meta"):
        torch.nn.Linear(2, 2)
    distribute_tensor(torch.zeros(4), meshes.dense, [Shard(0)], src_data_rank=None).full_tensor()
    torch.manual_seed(cfg.train.seed)
    dist.barrier()
    base = start_phase()
    model, rng = build_on_meta(cfg)
    parallelize(model, layout, meshes, torch.device("cpu"))
    materialize(model, rng, torch.device("cpu"))
    build_peak = memory()["VmHWM"] - base
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * 4 for p in model.parameters())
    # gloo builds a pair's buffers on its first point-to-point message: before the phase, as the imports above
    # (a fixed cost of the process group, not of the model; the export's recvs come from every EP holder)
    for src in range(1, dist.get_world_size()):
        if rank == src:
            dist.send(torch.zeros(4), dst=0)
        elif rank == 0:
            dist.recv(torch.empty(4), src=src)
    dist.barrier()
    base = start_phase()
    write_safetensors(out / "model.safetensors", model, cfg.model, layout)
    export_peak = memory()["VmHWM"] - base
    record = {"build_peak": build_peak, "export_peak": export_peak, "local_param_bytes": local}
    (out / f"rank_{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()
    exit_now(0)  # no interpreter teardown after the group is destroyed (mohge.train.runtime.exit_now)
