"""The parallel layout of a run: how ``world`` ranks split into FSDP shards, replicas and expert-parallel groups.

Every rank is a data-parallel rank: it reads its own disjoint part of the data. Dense weights are sharded by
FSDP2 over ``dp_shard`` ranks and replicated over ``dp_replicate = world / dp_shard`` (HSDP when > 1).
Expert parallelism borrows its ``ep`` ranks from the ``dp_shard`` dimension (as torchtitan does): the
``ep`` ranks of a group exchange tokens with ``all_to_all_single`` and each holds ``E / ep`` experts of every
MoE layer, chosen by ``model.ffn.placement`` (:mod:`mohge.model.allocation`); the expert weights are then sharded
by FSDP only over the orthogonal ``dp_shard_mod_ep = dp_shard / ep`` ranks. Mesh, rank r at coordinates::

    (dp_replicate, dp_shard_mod_ep, ep),   r = (rep * dp_shard_mod_ep + d) * ep + e

so an EP group is ``ep`` consecutive ranks (inside one node whenever ep <= GPUs per node).

:func:`check_layout` refuses a layout that cannot run, before anything starts, with one line naming the key.
It needs no process group: the trainer and the sizing (:mod:`mohge_studies.analysis.sizing`) call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from mohge.config import ConfigError, ParallelConfig, RunConfig
from mohge.model.allocation import place


@dataclass(frozen=True)
class Layout:
    world: int
    dp_replicate: int
    dp_shard: int
    ep: int
    activation_checkpointing: str
    peak_tflops: float
    rank_of_expert: tuple[int, ...]  # router id -> EP rank; () for a dense model or ep = 1

    @property
    def dp_shard_mod_ep(self) -> int:
        return self.dp_shard // self.ep

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp_replicate, dp_shard_mod_ep, ep) coordinates of ``rank``."""
        rest, e = divmod(rank, self.ep)
        rep, d = divmod(rest, self.dp_shard_mod_ep)
        return rep, d, e


def _refuse(key: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {why}")


def check_layout(cfg: RunConfig, world: int) -> Layout:
    """The layout of ``cfg.train.parallel`` on ``world`` ranks, or a ConfigError naming the offending key."""
    par = cfg.train.parallel or ParallelConfig()
    ffn = cfg.model.ffn
    if world < 1:
        raise _refuse("world size", world, "needs at least one rank")
    dp_shard = world if par.dp_shard == -1 else par.dp_shard
    if world % dp_shard:
        raise _refuse("train.parallel.dp_shard", par.dp_shard, f"must divide the world size {world}")
    ep_key, ep = ("train.parallel.ep", par.ep) if par.ep else ("model.ffn.ep_size", ffn.ep_size)
    if ep > 1 and cfg.model.moe_layers == 0:
        raise _refuse(ep_key, ep, "expert parallelism needs MoE layers (the model has none)")
    if dp_shard % ep:
        raise _refuse(
            ep_key, ep, f"must divide train.parallel.dp_shard={dp_shard} (EP ranks are taken from the FSDP ranks)"
        )
    ranks: tuple[int, ...] = ()
    if ep > 1:
        E, G = ffn.num_experts, ffn.num_groups
        if E % ep:
            raise _refuse(ep_key, ep, f"must divide the number of experts {ffn.experts_per_group} x {G} groups = {E}")
        per_rank = E // ep
        if ffn.placement == "flop_lpt":
            raise _refuse("model.ffn.placement", ffn.placement, "needs measured loads; not a training placement")
        if ffn.placement == "all_size" and per_rank % 2 and per_rank % G:
            raise _refuse(ep_key, ep, f"all_size needs E/ep (={per_rank}) even or a multiple of G={G}")
        try:
            ranks = tuple(place(ffn.placement, ffn.per_expert_widths, ep, experts_per_group=ffn.experts_per_group))
        except ValueError as err:  # e.g. all_size or modse_pairs with an odd G
            raise _refuse("model.ffn.placement", ffn.placement, str(err)) from err
    return Layout(
        world=world,
        dp_replicate=world // dp_shard,
        dp_shard=dp_shard,
        ep=ep,
        activation_checkpointing=par.activation_checkpointing,
        peak_tflops=par.peak_tflops,
        rank_of_expert=ranks,
    )
