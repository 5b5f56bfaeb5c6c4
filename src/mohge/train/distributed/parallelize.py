"""Apply a layout to a model: expert parallelism, activation checkpointing, then FSDP2, in
torchtitan's order (``parallelize_llama`` / ``apply_fsdp``).

1. EP (ep > 1): every MoE layer's :class:`mohge.model.experts.RoutedExperts` is replaced by this rank's share,
   :class:`.ep.ExpertParallelExperts` (experts chosen by the configured placement).
2. Activation checkpointing (``block``): each transformer block recomputes its forward in the backward
   (``torch.distributed._composable.checkpoint``, which keeps the parameter names).
3. FSDP2 (:func:`shard_plan` lists the units, the sizing counts the same list): each MoE layer's experts
   over the expert mesh (dims orthogonal to EP), each block and the root over the dense mesh.
   ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on CUDA, fp32 on a CPU.

Gradient scale. Every rank's loss is the mean over its own tokens; FSDP divides the reduced gradients by
the number of ranks it reduces over, which gives the mean over all ranks for dense weights. An expert
receives gradient from the tokens of all ``ep`` ranks of its EP group, and is reduced over the
``world / ep`` other groups, so it must be divided by the whole world instead: :func:`scale_expert_grads`
multiplies it by 1 / ep after the backward (torchtitan sets ``set_gradient_divide_factor``, which needs
NCCL's PREMUL_SUM; gloo has none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from mohge.model import LanguageModel
from mohge.model.experts import RoutedExperts

from .ep_layer import ExpertParallelExperts, from_routed
from .layout import Layout
from .mesh import Meshes


@dataclass
class ShardUnit:
    """One ``fully_shard`` call: its module, which mesh (``expert`` or ``dense``) and its own parameters."""

    name: str
    module: nn.Module
    mesh: str
    params: list[tuple[str, nn.Parameter]]


def apply_ep(model: LanguageModel, layout: Layout, ep_rank: int, group=None) -> None:
    """Replace every MoE layer's experts by this EP rank's share (no-op at ep = 1)."""
    if layout.ep == 1:
        return
    for layer in model.moe_layers():
        assert isinstance(layer.experts, RoutedExperts)
        layer.experts = from_routed(layer.experts, layout.rank_of_expert, ep_rank, group)


def shard_plan(model: LanguageModel) -> list[ShardUnit]:
    """The FSDP2 units, innermost first: experts (EP layers only), blocks, root. Each parameter belongs to the
    first unit whose module holds it, as with nested ``fully_shard`` calls."""
    units: list[tuple[str, nn.Module, str]] = []
    for i, block in enumerate(model.blocks):
        if isinstance(getattr(block.ffn, "experts", None), ExpertParallelExperts):
            units.append((f"blocks.{i}.ffn.experts", block.ffn.experts, "expert"))
        units.append((f"blocks.{i}", block, "dense"))
    units.append(("", model, "dense"))
    seen: set[int] = set()
    out = []
    for name, module, mesh in units:
        params = [(n, p) for n, p in module.named_parameters() if id(p) not in seen]
        seen.update(id(p) for _, p in params)
        out.append(ShardUnit(name, module, mesh, params))
    return out


def parallelize(model: LanguageModel, layout: Layout, meshes: Meshes, device: torch.device) -> list[ShardUnit]:
    """Apply EP, activation checkpointing and FSDP2 to ``model`` in place; returns the FSDP units."""
    apply_ep(model, layout, meshes.ep.get_local_rank(), meshes.ep.get_group())
    if not any(p.is_meta for p in model.parameters()):  # a meta model is materialised after sharding (.meta_init)
        model.to(device)  # this rank's share only: the experts of other EP ranks are gone
    for block in model.blocks:
        if layout.activation_checkpointing == "block":
            from torch.distributed._composable import checkpoint

            checkpoint(block)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda" else None
    units = shard_plan(model)
    for unit in units:
        kwargs = {"mp_policy": mp} if mp is not None else {}
        fully_shard(unit.module, mesh=getattr(meshes, unit.mesh), reshard_after_forward=unit.name != "", **kwargs)
    return units


def sync_gradients_on(model: nn.Module, micro: int, micro_batches: int) -> None:
    """Under gradient accumulation, FSDP2 reduce-scatters (and HSDP all-reduces) only after the last micro-batch
    of a step: before it, each unit keeps its unsharded gradient and the next backward adds to it (the same sums,
    one collective per unit and step instead of one per micro-batch; the price is one unsharded gradient per
    unit held between micro-batches)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(micro == micro_batches - 1)  # recurses into every nested FSDP unit


@torch.no_grad()
def scale_expert_grads(model: nn.Module, layout: Layout) -> None:
    """Expert gradients from the sum over the EP group to the mean over the world (module docstring)."""
    if layout.ep == 1:
        return
    for m in model.modules():
        if isinstance(m, ExpertParallelExperts):
            for p in m.parameters():
                if p.grad is not None:
                    p.grad.mul_(1.0 / layout.ep)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float, layout: Layout) -> torch.Tensor:
    """The global gradient norm over all ranks' shards (clipped to ``max_norm`` when > 0), as
    ``torch.nn.utils.clip_grad_norm_`` gives one process: dense and expert shards live on different meshes,
    so the squares are summed locally and all-reduced once; replicas (HSDP) are counted once."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    local = [_local(g) for g in grads]
    device = local[0].device if local else torch.device("cpu")
    sq = torch.zeros((), device=device, dtype=torch.float32)
    for g in local:
        sq += g.float().pow(2).sum()
    dist.all_reduce(sq)
    total = (sq / layout.dp_replicate).sqrt()
    if max_norm > 0 and math.isfinite(total.item()):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in local:
            g.mul_(coef.to(g.dtype))
    return total
