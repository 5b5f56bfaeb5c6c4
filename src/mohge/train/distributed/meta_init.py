"""The model built on the meta device, sharded, then materialised: each rank allocates only its own shards
(torchtitan's order: ``with torch.device("meta")``, parallelize, ``to_empty``, initialise).

:func:`build_on_meta` builds the model's structure with no storage and notes torch's RNG state, the state the
whole model would be built from on one process. After :func:`mohge.train.distributed.parallelize.parallelize`
(EP drops the other ranks' experts, FSDP2 shards the rest, all still on meta), :func:`materialize`:

1. allocates this rank's shards (``to_empty``: FSDP2 gives each sharded parameter its local piece);
2. restores the RNG state and builds the model's top-level parts
   (:func:`mohge.model.transformer.model_parts`: embed, each block, norm, head) one at a time, on the CPU, in
   construction order, so every part draws from the RNG exactly as it does when the whole model is built at
   once: the weights equal the single-process ones bit for bit;
3. copies from each part this rank's piece of every parameter (an EP layer's experts: the rows ``w1.<c>[j]`` of
   its own experts e = c * n + j; an FSDP2 parameter: its shard, cut by ``distribute_tensor`` without any
   communication), then drops the part.

So a rank holds its shards plus one part (at most one FSDP unit: a block, or the embedding) at any time, never
the whole model. Buffers: those built for real at parallelize time (EP's expert-id tables) are kept; the rest
come from the parts (the MoE width tables) and from :func:`mohge.model.transformer.model_rope_tables`.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from mohge.config import RunConfig
from mohge.model.transformer import LanguageModel, model_parts, model_rope_tables

from .ep_layer import ExpertParallelExperts


def build_on_meta(cfg: RunConfig) -> tuple[LanguageModel, torch.Tensor]:
    """(the model on the meta device, torch's CPU RNG state it would have been built from)."""
    rng = torch.random.get_rng_state()
    with torch.device("meta"):
        model = LanguageModel(cfg.model, cfg.loss)
    return model, rng


def _put(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's piece of ``full`` (the whole parameter) into ``param`` (a DTensor shard or a tensor)."""
    full = full.to(param.device)
    if isinstance(param, DTensor):
        piece = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(piece)
    else:
        param.copy_(full)


@torch.no_grad()
def materialize(model: LanguageModel, rng: torch.Tensor, device: torch.device) -> None:
    """Give ``model`` (built by :func:`build_on_meta`, then parallelized) its initial weights, this rank's
    shards only; leaves torch's RNG where building the whole model would have left it."""
    kept = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    ep = {n: m for n, m in model.named_modules() if isinstance(m, ExpertParallelExperts)}
    filled: set[str] = set()
    torch.random.set_rng_state(rng)
    for name, make in model_parts(model.cfg, model.loss_cfg):
        part = make()
        if part is None:
            continue
        for sub, full in part.named_parameters():
            key = f"{name}.{sub}"
            prefix, _, tail = key.rpartition(".")  # an EP layer: "blocks.i.ffn.experts.w1" "." "<c>"
            owner, _, w = prefix.rpartition(".")
            if owner in ep and w in ("w1", "w2"):
                n = full.shape[0]
                for j in range(n):
                    local = f"{owner}.local.{int(tail) * n + j}.{w}"
                    if local in params:  # one of this rank's experts
                        _put(params[local], full[j])
                        filled.add(local)
            else:
                _put(params[key], full)
                filled.add(key)
        for sub, buf in part.named_buffers():
            if f"{name}.{sub}" in buffers and f"{name}.{sub}" not in kept:
                buffers[f"{name}.{sub}"].copy_(buf)
        del part
    for n, b in kept.items():
        buffers[n].copy_(b)
    cos, sin = model_rope_tables(model.cfg)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    missing = sorted(set(params) - filled)
    assert not missing, f"parameters left uninitialised: {missing[:5]}"
