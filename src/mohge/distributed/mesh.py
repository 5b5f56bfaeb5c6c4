"""The DeviceMesh of a layout: dims (dp_replicate, dp_shard_mod_ep, ep), with dp_shard = (dp_shard_mod_ep, ep)
flattened, as torchtitan builds it. Dense weights are sharded over ``dense_mesh`` (dp_shard, replicated over
dp_replicate), expert weights over ``expert_mesh`` (dp_shard_mod_ep only), tokens exchanged over ``ep``.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .layout import Layout

DIMS = ("dp_replicate", "dp_shard_mod_ep", "ep")


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The world mesh (needs the default process group, started by the trainer)."""
    shape = (layout.dp_replicate, layout.dp_shard_mod_ep, layout.ep)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=DIMS)
    mesh["dp_shard_mod_ep", "ep"]._flatten("dp_shard")
    return mesh


def dense_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """FSDP2 mesh of every weight but the experts: 1-D (shard) or 2-D (replicate, shard) for HSDP."""
    return mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]


def expert_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """FSDP2 mesh of the expert weights: the dimension orthogonal to EP (plus the replicas)."""
    return mesh["dp_replicate", "dp_shard_mod_ep"] if layout.dp_replicate > 1 else mesh["dp_shard_mod_ep"]
