"""The DeviceMeshes of a layout, built as torchtitan builds them: a world mesh (dp_replicate, dp_shard), whose
dp_shard dimension is unflattened into (dp_shard_mod_ep, ep). Dense weights are sharded over ``dense``
(dp_shard, replicated over dp_replicate), expert weights over ``expert`` (dp_shard_mod_ep only, plus the
replicas), tokens are exchanged over ``ep``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .layout import Layout


@dataclass
class Meshes:
    world: DeviceMesh  # (dp_replicate, dp_shard)
    dense: DeviceMesh  # FSDP2 mesh of every weight but the experts: 1-D, or 2-D (replicate, shard) = HSDP
    expert: DeviceMesh  # FSDP2 mesh of the expert weights: the dimension orthogonal to EP (plus the replicas)
    ep: DeviceMesh  # the EP group of this rank


def build_meshes(layout: Layout, device_type: str) -> Meshes:
    """The meshes of ``layout`` (needs the default process group, started by the trainer)."""
    world = init_device_mesh(
        device_type, (layout.dp_replicate, layout.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard")
    )
    # dp_shard by its index: torch 2.11 refuses a dimension given by a name it has (pytorch/pytorch#176443).
    split = world._unflatten(1, (layout.dp_shard_mod_ep, layout.ep), ("dp_shard_mod_ep", "ep"))
    rep = layout.dp_replicate > 1
    return Meshes(
        world=world,
        dense=world if rep else world["dp_shard"],
        expert=split["dp_replicate", "dp_shard_mod_ep"] if rep else split["dp_shard_mod_ep"],
        ep=split["ep"],
    )
