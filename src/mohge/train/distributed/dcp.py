"""Sharded checkpoints through ``torch.distributed.checkpoint``, with the guarantees of :mod:`mohge.train.checkpoint`.

Layout of ``SCRATCH/dcp`` (the single-process checkpoints of ``SCRATCH/step_*`` are untouched)::

    step_00000050/        the state after 50 optimizer steps
      .metadata, *.distcp   DCP: model and AdamW state, sharded as trained, keyed by parameter name
      rng_00000.pt ...      each rank's RNG states (mohge.train.checkpoint.capture_rng)
      meter_00000.pt ...    each rank's log-window meter (mohge.train.step.WindowMeter.state), as the
                            single-process state.pt holds them
      data.json             the data position {"step": 50, "world_size": W, "order": ...}: random batches are a
                            pure function of (seed, step, rank, world); sequential ones add the global "window"
                            to read next ("epoch", "shard", "offset" say where), which any world size resumes
      config.json           the resolved run config
      manifest.json         sha256 and size of every file above; written last, by rank 0
    .tmp-step_00000050-PID/   a save in progress, renamed to step_00000050 in one os.replace once complete

So a save is atomic and checksummed, and the previous ``keep_checkpoints`` are kept, exactly as a
single-process save (the folder listing, verification, pruning and stale-temp removal are
:mod:`mohge.train.checkpoint`'s own functions). DCP keys are parameter names, and the experts of an EP layer are
named by their router id (:mod:`.ep`), so a checkpoint loads into another world size, FSDP degree or EP size:
DCP reads whichever saved chunks overlap each rank's new shards.

:func:`write_safetensors` writes the final ``model.safetensors`` in the single-process names (that of
:func:`mohge.train.checkpoint.load_trained`, EP experts stacked back into their width classes), streamed from the
shards one parameter at a time to rank 0 (:func:`iter_full`): no rank ever holds the whole model, and no
``gather_object`` (which on NCCL stages world x the largest object on rank 0's GPU).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import struct
from collections.abc import Iterator
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

from mohge.config import ModelConfig
from mohge.core.atomic import atomic_path, write_bytes_atomic, write_json_atomic
from mohge.core.knobs import load_json_file
from mohge.model import LanguageModel

from .. import checkpoint as ckpt
from .ep_layer import ExpertParallelExperts
from .layout import Layout

log = logging.getLogger("mohge.train.distributed.dcp")

REQUIRED = (".metadata", "data.json", "config.json")


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def _broadcast(value: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box)
    return box[0]


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save(
    root: Path,
    step: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    resolved: dict,
    keep: int,
    data: dict[str, Any] | None = None,
    meter: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/step_{step:08d}`` from every rank (a collective); returns the folder. ``data`` is the data
    position (``mohge.data.stream.TrainBatches.position``) that data.json holds, ``meter`` this rank's log-window
    meter."""
    rank, world = dist.get_rank(), dist.get_world_size()
    final = root / ckpt.step_dir_name(step)
    tmp = root / _broadcast(f".tmp-{final.name}-{os.getpid()}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(model, opt), checkpoint_id=tmp)
    write_bytes_atomic(tmp / f"rng_{rank:05d}.pt", _torch_bytes(ckpt.capture_rng()))
    if meter is not None:
        write_bytes_atomic(tmp / f"meter_{rank:05d}.pt", _torch_bytes(meter))
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


def _load_rank_file(path: Path) -> Any:
    """A per-rank file of a checkpoint (verified by its manifest): tensors and plain values only."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as err:  # a resealed file of other than tensors and plain values: never weights_only=False
        raise ckpt.CheckpointError(
            f"{path} does not load as tensors and plain values ({type(err).__name__}); it was not written by "
            "mohge.train"
        ) from err


def resume(
    root: Path, resolved: dict, model: nn.Module, opt: torch.optim.Optimizer, require: bool
) -> tuple[int, Path | None, dict[str, Any] | None, dict[str, Any] | None]:
    """Load the newest valid checkpoint of ``root`` into ``model`` and ``opt`` (collective): (step, folder, its
    data position, this rank's log-window meter), or (0, None, None, None) when there is none (CheckpointError
    with ``require``). Rank 0 verifies and chooses."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        ckpt.remove_stale_temps(root)
    found = _broadcast(str(ckpt.find_latest_valid(root, REQUIRED)[0] or "") if rank == 0 else "")
    if not found:
        if require:
            raise ckpt.CheckpointError(f"--require-resume: no valid checkpoint in {root}")
        return 0, None, None, None
    path = Path(found)
    saved = load_json_file(path / "config.json", "checkpoint file")
    ckpt.check_same_run(_without_parallel(saved), _without_parallel(resolved), path)
    state = _state(model, opt)
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    data = load_json_file(path / "data.json", "checkpoint file")
    # the same rank's RNG and meter at the same world size (exact resume); rank 0's otherwise
    own = rank if data["world_size"] == world else 0
    ckpt.restore_rng(_load_rank_file(path / f"rng_{own:05d}.pt"))
    meter_path = path / f"meter_{own:05d}.pt"
    meter = _load_rank_file(meter_path) if meter_path.is_file() else None
    if data["world_size"] != world and rank == 0:
        log.warning("resuming a checkpoint of %d ranks on %d: resharded", data["world_size"], world)
    return int(data["step"]), path, data, meter


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def single_process_shapes(cfg: ModelConfig) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Name -> (shape, dtype) of every entry of the single-process state dict (a meta model: no storage)."""
    with torch.device("meta"):
        plain = LanguageModel(cfg)
    return {k: (v.shape, v.dtype) for k, v in plain.state_dict().items()}


def iter_full(
    model: nn.Module, cfg: ModelConfig, layout: Layout, grads: bool = False
) -> Iterator[tuple[str, int, torch.Tensor | None]]:
    """The model's parameters (or gradients) under single-process names, one piece at a time, as
    (name, j, tensor): j = -1 for a whole tensor; an EP layer's ``w1.<c>`` / ``w2.<c>`` [n, ...] comes as its n
    experts in order, j = 0 .. n-1. The tensor (on the model's device) is rank 0's only, None on the others.
    A collective: every rank iterates it to the end. Names in sorted order (that of the safetensors file).

    Dense parameters are all-gathered from their shards (each rank holds one whole parameter for a moment);
    an expert is gathered over its EP rank's expert mesh, then its holder (coordinates (0, 0, rho): rank rho)
    sends it to rank 0 (point to point, no ``gather_object``), so rank 0 never holds more than one parameter
    of the model beside its own shards."""
    rank = dist.get_rank()
    ep = {n: m for n, m in model.named_modules() if isinstance(m, ExpertParallelExperts)}
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())  # persistent state beside the weights (a router's selection bias)
    n = cfg.ffn.experts_per_group
    for name, (shape, dtype) in sorted(single_process_shapes(cfg).items()):
        prefix, _, c = name.rpartition(".")
        owner, _, w = prefix.rpartition(".")
        if name in buffers:
            if not grads:  # replicated on every rank: rank 0's copy is the whole state
                yield name, -1, buffers[name].detach() if rank == 0 else None
            continue
        if owner not in ep or w not in ("w1", "w2"):
            t = params[name].grad if grads else params[name]
            full = _full(t)
            yield name, -1, full if rank == 0 else None
            continue
        for j in range(n):
            e = int(c) * n + j
            holder = layout.rank_of_expert[e]  # the EP rank of expert e, at dp_replicate = dp_shard_mod_ep = 0
            local = params.get(f"{owner}.local.{e}.{w}")
            piece = None
            if local is not None:  # this rank holds a shard of expert e: gather it over the expert mesh
                piece = _full(local.grad if grads else local)
                if rank == holder and holder != 0:
                    dist.send(piece.contiguous(), dst=0)
            if rank == 0 and holder != 0:
                piece = torch.empty(shape[1:], dtype=dtype, device=next(iter(params.values())).device)
                dist.recv(piece, src=holder)
            yield name, j, piece if rank == 0 else None


def export_full(
    model: nn.Module, cfg: ModelConfig, layout: Layout, grads: bool = False
) -> dict[str, torch.Tensor] | None:
    """The whole model (or, with ``grads``, its gradients) under single-process names on rank 0, None on the
    other ranks; a collective. For tests and small models: the final model is written by
    :func:`write_safetensors`, which never holds the whole model."""
    whole: dict[str, torch.Tensor] = {}
    experts: dict[str, list[torch.Tensor]] = {}
    for name, j, t in iter_full(model, cfg, layout, grads):
        if t is not None:
            if j < 0:
                whole[name] = t.cpu()
            else:
                experts.setdefault(name, []).append(t.cpu())
    if dist.get_rank() != 0:
        return None
    return {**whole, **{k: torch.stack(v) for k, v in experts.items()}}


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def safetensors_header(shapes: dict[str, tuple[torch.Size, torch.dtype]]) -> tuple[bytes, list[str]]:
    """The header of a safetensors file of tensors of these shapes (one dtype), laid out in sorted name order as
    ``safetensors.torch.save`` lays them out: 8-byte little-endian length, JSON, spaces to a multiple of 8."""
    dtypes = {dt for _, dt in shapes.values()}
    assert len(dtypes) == 1, dtypes  # one dtype: then save() orders by name alone
    names, offset, entries = sorted(shapes), 0, {}
    for k in names:
        shape, dt = shapes[k]
        size = math.prod(shape) * dt.itemsize
        entries[k] = {"dtype": _SAFETENSORS_DTYPES[dt], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, names


def write_safetensors(path: Path, model: nn.Module, cfg: ModelConfig, layout: Layout) -> None:
    """Write the consolidated ``model.safetensors`` (single-process names, the bytes ``safetensors.torch.save``
    would write for the whole state dict) from rank 0, streamed one parameter (one expert) at a time from
    :func:`iter_full`; atomic (a temporary file, then one rename). A collective."""
    header, _ = safetensors_header(single_process_shapes(cfg))
    if dist.get_rank() != 0:
        for _ in iter_full(model, cfg, layout):
            pass
        return
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header)
        for _, _, t in iter_full(model, cfg, layout):
            fh.write(t.cpu().contiguous().numpy().data)
