"""Sharded checkpoints through ``torch.distributed.checkpoint``, with the guarantees of :mod:`mohge.checkpoint`.

Layout of ``SCRATCH/dcp`` (the single-process checkpoints of ``SCRATCH/step_*`` are untouched)::

    step_00000050/        the state after 50 optimizer steps
      .metadata, *.distcp   DCP: model and AdamW state, sharded as trained, keyed by parameter name
      rng_00000.pt ...      each rank's RNG states (mohge.checkpoint.capture_rng)
      data.json             the data position {"step": 50, "world_size": W, "order": ...}: random batches are a
                            pure function of (seed, step, rank, world); sequential ones add the global "window"
                            to read next ("epoch", "shard", "offset" say where), which any world size resumes
      config.json           the resolved run config
      manifest.json         sha256 and size of every file above; written last, by rank 0
    .tmp-step_00000050-PID/   a save in progress, renamed to step_00000050 in one os.replace once complete

So a save is atomic and checksummed, and the previous ``keep_checkpoints`` are kept, exactly as a
single-process save (the folder listing, verification, pruning and stale-temp removal are
:mod:`mohge.checkpoint`'s own functions). DCP keys are parameter names, and the experts of an EP layer are
named by their router id (:mod:`.ep`), so a checkpoint loads into another world size, FSDP degree or EP size:
DCP reads whichever saved chunks overlap each rank's new shards.

:func:`export_full` gathers the model into the single-process names (``model.safetensors`` of
:func:`mohge.checkpoint.load_trained`): EP experts are stacked back into their width classes.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from .. import checkpoint as ckpt
from ..atomic import write_bytes_atomic, write_json_atomic
from ..config import ModelConfig
from ..strict import load_json_file
from .ep import ExpertParallelExperts
from .layout import Layout

log = logging.getLogger("mohge.distributed.dcp")

REQUIRED = (".metadata", "data.json", "config.json")


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def _broadcast(value: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box)
    return box[0]


def save(
    root: Path,
    step: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    resolved: dict,
    keep: int,
    data: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/step_{step:08d}`` from every rank (a collective); returns the folder. ``data`` is the data
    position (``mohge.data.stream.TrainBatches.position``) that data.json holds."""
    rank, world = dist.get_rank(), dist.get_world_size()
    final = root / ckpt.step_dir_name(step)
    tmp = root / _broadcast(f".tmp-{final.name}-{os.getpid()}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(model, opt), checkpoint_id=tmp)
    buf = io.BytesIO()
    torch.save(ckpt.capture_rng(), buf)
    write_bytes_atomic(tmp / f"rng_{rank:05d}.pt", buf.getvalue())
    dist.barrier()
    if rank == 0:
        write_json_atomic(tmp / "data.json", {**(data or {}), "step": step, "world_size": world})
        write_json_atomic(tmp / "config.json", resolved)
        files = {
            p.name: {"sha256": ckpt.sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        write_json_atomic(tmp / ckpt.MANIFEST, {"format_version": 1, "step": step, "files": files})
        ckpt._fsync_dir(tmp)
        if final.exists():  # a folder of the same step left by an earlier attempt of this run
            shutil.rmtree(final)
        os.replace(tmp, final)
        ckpt._fsync_dir(root)
        ckpt.prune_checkpoints(root, keep)
    dist.barrier()
    return final


def _without_parallel(d: dict) -> dict:
    """The layout may change between a save and its resumption (DCP reshards)."""
    return {**d, "train": {k: v for k, v in d["train"].items() if k != "parallel"}}


def resume(
    root: Path, resolved: dict, model: nn.Module, opt: torch.optim.Optimizer, require: bool
) -> tuple[int, Path | None, dict[str, Any] | None]:
    """Load the newest valid checkpoint of ``root`` into ``model`` and ``opt`` (collective): (step, folder, its
    data position), or (0, None, None) when there is none (CheckpointError with ``require``). Rank 0 verifies
    and chooses."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        ckpt.remove_stale_temps(root)
    found = _broadcast(str(ckpt.find_latest_valid(root, REQUIRED)[0] or "") if rank == 0 else "")
    if not found:
        if require:
            raise ckpt.CheckpointError(f"--require-resume: no valid checkpoint in {root}")
        return 0, None, None
    path = Path(found)
    saved = load_json_file(path / "config.json", "checkpoint file")
    ckpt.check_same_run(_without_parallel(saved), _without_parallel(resolved), path)
    state = _state(model, opt)
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    data = load_json_file(path / "data.json", "checkpoint file")
    # the same rank's RNG at the same world size (exact resume); rank 0's otherwise
    rng = path / f"rng_{rank if data['world_size'] == world else 0:05d}.pt"
    try:
        rng_state = torch.load(rng, weights_only=True)
    except Exception as err:  # a resealed file of other than tensors and plain values: never weights_only=False
        raise ckpt.CheckpointError(
            f"{rng} does not load as tensors and plain values ({type(err).__name__}); it was not written by mohge.train"
        ) from err
    ckpt.restore_rng(rng_state)
    if data["world_size"] != world and rank == 0:
        log.warning("resuming a checkpoint of %d ranks on %d: resharded", data["world_size"], world)
    return int(data["step"]), path, data


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()


def export_full(
    model: nn.Module, cfg: ModelConfig, layout: Layout, grads: bool = False
) -> dict[str, torch.Tensor] | None:
    """The whole model (or, with ``grads``, its gradients) under single-process names on rank 0, None on the
    other ranks; a collective. (Every entry of the state dict is a parameter: the buffers are not persistent.)"""
    ep_prefixes = [n + "." for n, m in model.named_modules() if isinstance(m, ExpertParallelExperts)]
    named = [(k, p.grad if grads else p) for k, p in model.named_parameters()]
    is_expert = {k: any(k.startswith(p) for p in ep_prefixes) for k, _ in named}
    dense = {k: _full(v) for k, v in named if not is_expert[k]}  # over the dense mesh: all ranks alike
    experts = {k: _full(v) for k, v in named if is_expert[k]}  # over each EP rank's expert mesh
    # one holder of each EP rank's experts sends them: the ranks at dp_replicate = dp_shard_mod_ep = 0
    holder = layout.coords(dist.get_rank())[:2] == (0, 0)
    parts: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(experts if holder else {}, parts, dst=0)
    if dist.get_rank() != 0:
        return None
    merged = {k: v for part in parts for k, v in part.items()}
    n = cfg.ffn.experts_per_group
    for prefix in ep_prefixes:  # "blocks.i.ffn.experts." : local.<e>.w1 -> w1.<class> [n, 2H, D]
        for c in range(len(cfg.ffn.expert_widths)):
            for w in ("w1", "w2"):
                dense[f"{prefix}{w}.{c}"] = torch.stack([merged[f"{prefix}local.{c * n + j}.{w}"] for j in range(n)])
    return dense
