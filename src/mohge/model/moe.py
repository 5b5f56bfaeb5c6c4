"""The MoE feed-forward layer of every family: MoHGE, homogeneous MoE, HMoE and MoDSE.

    y = SharedExpert(x) + sum_{e in TopK(x)} w_e(x) * E_e(x)            (docs/method.md §1.3)

* ``mohge``: two-level router (groups, then experts), Group-Wise Aux Loss + Intra-Group Experts Aux Loss,
  experts of G widths. Where the experts live (the all-size allocation's router-order -> physical-order map,
  docs/method.md §4) does not change a single-process layer's output; it is :mod:`mohge.model.allocation`'s, used by
  the expert-parallel layer and the utilization study.
* ``moe``: one width, flat top-k router, Switch balance loss (Megatron's ``aux_loss``).
* ``hmoe``: several widths, flat router, size-weighted balance loss favouring small experts (HMoE).
* ``modse``: several widths in pairs of constant total width, flat router, Switch loss, pair placement.

Legend: B batch, S sequence, T = B*S tokens, D model width, E experts, K experts per token, G groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from mohge.config import ConfigError, FFNConfig, LossConfig, RouterConfig
from mohge.config.sizes import moe_layer_cost

from . import fused as _fused
from .experts import RoutedExperts, SwiGLU
from .losses import group_aux_loss, group_cost_weights, intra_group_aux_loss, switch_aux_loss, weighted_aux
from .routing import GroupedRouter, Routing, TopKRouter

Tensor = torch.Tensor


@dataclass
class LayerStats:
    """Per-layer routing outcome of one forward pass, for losses, logs and traces."""

    aux: dict[str, Tensor]  # raw aux losses (no coefficients), with gradient
    counts_E: Tensor  # tokens per expert, router order (int64, no gradient)
    routing: Routing | None = None  # kept only when the layer is asked to record
    counts_G: Tensor | None = None  # MoHGE: tokens whose top-Kg set holds each group (int64, no gradient)

    def balance_counts(self) -> Tensor:
        """The counts every balance loss of the layer reads, as one float vector: f_E, then f_G where the layer
        has groups (what :attr:`MoELayer.balance_counts` takes back, summed over a global batch)."""
        parts = [self.counts_E] if self.counts_G is None else [self.counts_E, self.counts_G]
        return torch.cat(parts).double()


class MoELayer(nn.Module):
    """The MoE layer of every family, built from its config sections; ``forward`` returns the output and the
    :class:`LayerStats` (raw aux losses: :func:`~mohge.model.losses.weighted_aux` weighs them).

    The sections are checked against each other here, so a layer built outside :class:`~mohge.config.ModelConfig`
    is refused at construction (a ConfigError naming the key and the value), never at its first forward.
    """

    fused = False  # route, aux losses and experts through mohge.model.fused (train.fused: mohge.model.fused.use_fused)

    def __init__(
        self, d_model: int, ffn: FFNConfig, router: RouterConfig, loss: LossConfig, std: float, out_std: float
    ) -> None:
        super().__init__()
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
            raise ConfigError(f"d_model={d_model!r}: must be an integer > 0")
        if ffn.kind == "dense":
            raise ConfigError(f"{ffn.key('kind')}='dense': a dense FFN has no experts (mohge.model.experts.SwiGLU)")
        router.check_against(ffn)
        loss.check_against(ffn)
        self.ffn_cfg, self.router_cfg, self.loss_cfg, self.d_model = ffn, router, loss, d_model
        self.kind, self.E = ffn.kind, ffn.num_experts
        self.router = (GroupedRouter if ffn.kind == "mohge" else TopKRouter)(d_model, ffn, router)
        self.experts = RoutedExperts(d_model, ffn.expert_widths, ffn.experts_per_group, std, out_std, ffn.backend)
        self.shared = SwiGLU(d_model, ffn.shared_expert_width, std, out_std) if ffn.shared_expert_width else None
        widths_E = torch.tensor(ffn.per_expert_widths, dtype=torch.float32)
        self.register_buffer("width_E", widths_E, persistent=False)
        self.register_buffer("size_weight_E", widths_E / widths_E.mean(), persistent=False)
        self.register_buffer(
            "omega_G", torch.tensor(group_cost_weights(ffn, loss), dtype=torch.float32), persistent=False
        )
        self.record = False
        # global-batch statistics (docs/method.md §5.5): the mean counts per micro-batch and rank of this step's
        # whole batch, [E] or [E + G] as LayerStats.balance_counts orders them; None: this micro-batch's own
        self.balance_counts: Tensor | None = None

    def cost_per_token(self, slots_E: Sequence[float] | Tensor | None = None) -> dict[str, int | float]:
        """Parameters, activated parameters and FLOPs per token of this layer (:func:`~mohge.config.sizes.
        moe_layer_cost`): under uniform routing, or under the routed slots per expert ``slots_E`` (``counts_E``)."""
        if isinstance(slots_E, Tensor):
            slots_E = slots_E.tolist()
        return moe_layer_cost(self.d_model, self.ffn_cfg, self.router_cfg.topk, slots_E)

    def aux_losses(self, r: Routing) -> dict[str, Tensor]:
        ffn, rc, lc = self.ffn_cfg, self.router_cfg, self.loss_cfg
        f = self.balance_counts
        f_E, f_G = (None, None) if f is None else (f[: self.E], f[self.E :])
        if self.kind == "mohge":
            return {
                "group_aux": group_aux_loss(r.group_logits_TG, r.group_map_TG, self.omega_G, rc.group_topk, f_G),
                "expert_aux": intra_group_aux_loss(
                    r, self.E, ffn.num_groups, rc.group_topk, rc.topk, lc.expert_aux_mode, f_E
                ),
            }
        counts_E = r.counts(self.E) if f_E is None else f_E
        if self.kind == "hmoe":
            return {"hmoe_penalty": switch_aux_loss(r.probs_TE, counts_E, rc.topk, self.size_weight_E)}
        return {"expert_aux": switch_aux_loss(r.probs_TE, counts_E, rc.topk)}

    def forward(self, x_BSD: Tensor, mask_BS: Tensor | None = None) -> tuple[Tensor, LayerStats]:
        """``mask_BS`` (bool, True: a real token) leaves padding out: only the real tokens are routed, computed and
        counted, in the expert and group counts and in every aux loss, so the outputs of the real tokens, the losses
        and the counts are the layer's on those tokens alone; a masked token's output is 0 (the shared expert skips
        it too), and ``stats.routing`` holds the real tokens' rows, in order."""
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(B * S, D)
        if mask_BS is None:
            y_TD, stats = self._route(x_TD)
            return y_TD.view(B, S, D), stats
        if mask_BS.dtype != torch.bool or mask_BS.shape != (B, S):
            raise ValueError(
                f"mask of shape {tuple(mask_BS.shape)} and dtype {mask_BS.dtype}: expected a bool tensor of shape "
                f"{(B, S)} (True: a real token)"
            )
        keep_T = mask_BS.reshape(B * S)
        y_RD, stats = self._route(x_TD[keep_T])  # R real tokens, in order
        y_TD = y_RD.new_zeros(B * S, D)
        y_TD[keep_T] = y_RD
        return y_TD.view(B, S, D), stats

    def _route(self, x_TD: Tensor) -> tuple[Tensor, LayerStats]:
        """Route, compute and count the tokens ``x_TD`` (T may be 0: an empty output, zero losses, zero counts)."""
        if self.fused:
            r, aux = _fused.route(self, x_TD)
            y_TD = _fused.experts(self.experts, x_TD, r.idx_TK, r.gates_TK)
        else:
            r, aux = self.router(x_TD), None
            y_TD = self.experts(x_TD, r.idx_TK, r.gates_TK)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)
        stats = LayerStats(
            aux=aux if aux is not None else self.aux_losses(r) if self.training else {},
            counts_E=r.counts(self.E).detach(),
            routing=r if self.record else None,
            counts_G=None if r.group_map_TG is None else r.group_map_TG.sum(0).long().detach(),
        )
        return y_TD, stats


class MoHGELayer(MoELayer):
    """MoHGE's feed-forward layer as a block of one's own model (docs/api.md): ``y, aux = layer(x, mask)``.

    ``x`` is [..., D]; ``y`` has its shape, and ``aux`` is the layer's weighted auxiliary loss in training mode, L_G +
    L_E with their coefficients ``group_aux_coeff`` and ``expert_aux_coeff`` (docs/method.md §5.4: add it to the LM
    loss), and 0 in eval mode. ``mask`` (optional, bool of x's shape without the last dim, True: a real token) keeps
    padding out, as :meth:`MoELayer.forward` says: ``y`` and ``aux`` on the real tokens are those of ``layer(x[mask])``,
    and a masked token's output is 0. The defaults fit a small model (d_model 64 to 256): 4 groups of 4 experts, widths
    64..256 in arithmetic progression as the release's, each token picks 2 groups and 4 experts among their 8, and a
    shared expert of width 256 (0: none). Every argument is checked here against the others; a bad one is a
    :class:`~mohge.config.ConfigError` naming it and its value (``topk=9: exceeds the experts reachable in the selected
    groups ...``). ``expert_widths`` is a list or a tuple.

    L_G is on at every forward unless ``forward`` gets ``step`` and ``total_steps``: then it follows the release's
    schedule, on once step > total_steps * ``group_aux_start_frac`` (docs/method.md §6). The parameters, their
    names and the numbers are :class:`MoELayer`'s with ``FFNConfig(kind="mohge")``, whose sections (``ffn_cfg``,
    ``router_cfg``, ``loss_cfg``) this layer holds; every other knob (gate mode, group score, the loss variants)
    is set through those sections and :class:`MoELayer`.
    """

    def __init__(
        self,
        d_model: int,
        *,
        expert_widths: Sequence[int] = (64, 128, 192, 256),
        experts_per_group: int = 4,
        topk: int = 4,
        group_topk: int = 2,
        shared_expert_width: int = 256,
        expert_aux_coeff: float = 5e-3,
        group_aux_coeff: float = 1e-5,
        group_aux_start_frac: float = 0.5,
        init_std: float = 0.02,
        out_std: float | None = None,
        router_init_std: float = 0.008,
        backend: str = "auto",
    ) -> None:
        if not isinstance(expert_widths, list | tuple) or not expert_widths:
            raise ConfigError(f"expert_widths={expert_widths!r}: expected a list or tuple of widths, one per group")
        if isinstance(experts_per_group, bool) or not isinstance(experts_per_group, int) or experts_per_group <= 0:
            raise ConfigError(f"experts_per_group={experts_per_group!r}: must be an integer > 0")
        for name, value in (("init_std", init_std), ("out_std", out_std)):
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise ConfigError(f"{name}={value!r}: must be a number > 0")
        ffn = FFNConfig(
            kind="mohge",
            num_experts=experts_per_group * len(expert_widths),
            expert_widths=tuple(expert_widths),
            shared_expert_width=shared_expert_width,
            placement="contiguous",  # where experts live matters only under expert parallelism
            backend=backend,
        )
        router = RouterConfig(topk=topk, group_topk=group_topk, init_std=router_init_std)
        loss = LossConfig(
            expert_aux_coeff=expert_aux_coeff,
            group_aux_coeff=group_aux_coeff,
            group_aux_start_frac=group_aux_start_frac,
        )
        super().__init__(d_model, ffn, router, loss, init_std, init_std if out_std is None else out_std)

    def forward(  # type: ignore[override]
        self, x: Tensor, mask: Tensor | None = None, step: int | None = None, total_steps: int | None = None
    ) -> tuple[Tensor, Tensor]:
        if (step is None) != (total_steps is None):
            raise ValueError("give both step and total_steps (L_G's schedule), or neither (L_G on)")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"input of shape {tuple(x.shape)}: its last dim is not d_model={self.d_model}")
        if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:-1]):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} and dtype {mask.dtype}: expected a bool tensor of shape "
                f"{tuple(x.shape[:-1])} (True: a real token)"
            )
        mask_1T = None if mask is None else mask.reshape(1, -1)
        y_1TD, stats = super().forward(x.reshape(1, -1, self.d_model), mask_1T)  # T = every token of x
        y = y_1TD.view(x.shape)
        if not stats.aux:  # eval mode: no aux losses
            return y, x.new_zeros(())
        if step is None:  # no schedule: step 1 of "0 steps" is past int(0 * start_frac) = 0, so L_G counts
            step, total_steps = 1, 0
        return y, weighted_aux(stats.aux, self.loss_cfg, step, total_steps)


# Routed slots per width class and expert, for the training log (mohge.train.step) and the traces

UNUSED_SHARE = 0.01  # an expert is unused below 1 % of a uniform share of the routed slots (the studies' definition)


def routing_summary(
    counts_LE: torch.Tensor,
    widths_E: Sequence[int],
    num_groups: int,
    topk: int,
    rank_of_expert: Sequence[int] | None = None,
) -> dict[str, list[Any]]:
    """From routed slots per expert [L, E] (router order), per layer:

    * ``group_usage`` [G] = slots of each width class / all slots; ``mean_expert_width`` = sum_e share_e * width_e
      (the mean width of one routed slot); ``activated_expert_width`` = topk * that (the routed FFN width a token
      activates);
    * ``expert_load`` = max_e slots_e / mean_e slots_e (1 is a perfectly even load); ``unused_experts`` = experts
      with under :data:`UNUSED_SHARE` of a uniform share of the slots;
    * with ``rank_of_expert`` (the placement's rank of each expert), ``rank_flops`` = max / mean over ranks of the
      routed FLOPs each rank holds (slots x width: an expert's FLOPs per slot are proportional to its width)."""
    counts_LE = counts_LE.double().cpu()
    L, E = counts_LE.shape
    share_LE = counts_LE / counts_LE.sum(1, keepdim=True).clamp_min(1)
    width_E = torch.tensor(widths_E, dtype=torch.float64)
    mean_L = (share_LE * width_E).sum(1)
    out = {
        "group_usage": share_LE.view(L, num_groups, -1).sum(2).tolist(),
        "mean_expert_width": mean_L.tolist(),
        "activated_expert_width": (mean_L * topk).tolist(),
        "expert_load": (share_LE.max(1).values * E).tolist(),
        "unused_experts": (share_LE < UNUSED_SHARE / E).sum(1).tolist(),
    }
    if rank_of_expert is not None:
        ranks = max(rank_of_expert) + 1
        flops_LR = counts_LE.new_zeros(L, ranks).index_add_(1, torch.tensor(rank_of_expert), counts_LE * width_E)
        out["rank_flops"] = (flops_LR.max(1).values / flops_LR.mean(1).clamp_min(1e-30)).tolist()
    return out
