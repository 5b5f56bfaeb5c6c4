"""Training on several processes with PyTorch's own stack, composed as torchtitan composes it.

* :mod:`.layout`   the parallel layout of a run (``train.parallel``) checked against a world size
* :mod:`.mesh`     the DeviceMesh (dp_replicate, dp_shard_mod_ep, ep) and its submeshes
* :mod:`.ep_layer`  the expert-parallel expert layer (``all_to_all_single`` dispatch and combine, autograd)
* :mod:`.ep_equivalence`  that layer against the single-process experts, under torchrun (used by the tests)
* :mod:`.parallelize`  expert parallelism, activation checkpointing and FSDP2 applied to a model
* :mod:`.meta_init`  the model built on the meta device and materialised per rank after sharding
* :mod:`.dcp`      sharded, atomic, checksummed checkpoints through ``torch.distributed.checkpoint``
* :mod:`.trainer`  the sharded layout of the training loop (``python -m mohge.train`` under torchrun with a layout)
* :mod:`.flops`    model FLOPs per token and per-rank expert FLOPs, for MFU and the sizing
* :mod:`.memory`   activation bytes saved for the backward per token, for the sizing

* :mod:`.gpu_check` the losses of the parallel stack against one process on GPUs
  (``python -m mohge.train.distributed.gpu_check``)

Nothing is imported here until asked for: ``Layout`` and ``check_layout`` come from :mod:`.layout` on first use, so
:mod:`.memory` (torch-free) loads without torch; :mod:`.layout`, :mod:`.flops` and :mod:`.memory` need no process
group (the sizing uses them).
Part of the training layer (mohge.train): may import core, config, model, data, mohge.kernels and mohge.train.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .layout import Layout, check_layout

__all__ = ["Layout", "check_layout"]


def __getattr__(name: str):
    if name in __all__:
        from . import layout

        return getattr(layout, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
