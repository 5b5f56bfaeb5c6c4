"""Routers: MoHGE's two-level group/expert router and the flat top-k router of the baselines.

MoHGE routing follows the official release step by step (arXiv 2604.23108; docs/method.md §2, steps
G1-G4 and E1-E6). The flat router is Megatron's default top-k softmax router used by the
homogeneous MoE, HMoE and MoDSE baselines.

Legend: T tokens, D model width, G groups, n experts per group, E = G*n experts, K experts per token
(``topk``), Kg groups per token (``group_topk``). Expert ids are in *router order* (group-major:
id g*n + j is member j of group g) everywhere in this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mohge.config import FFNConfig, RouterConfig

from . import route_kernel
from .topk import top_k

Tensor = torch.Tensor


@dataclass
class Routing:
    """What a router hands to the experts and to the losses.

    idx_TK / gates_TK: the selected experts and their weights (the only inputs of the expert compute).
    probs_TE: the dense probabilities the baselines' Switch loss reads (softmax over all E experts).
    group_logits_TG / group_map_TG: MoHGE only, for the Group-Wise Aux Loss (softmax of the logits, and
    which groups each token selected).
    """

    idx_TK: Tensor
    gates_TK: Tensor
    probs_TE: Tensor | None = None
    group_logits_TG: Tensor | None = None
    group_map_TG: Tensor | None = None

    def dense_gates(self, num_experts: int) -> Tensor:
        """The sparse final gates w as a dense [T, E] tensor (zeros off the top-k)."""
        w_TE = self.gates_TK.new_zeros(self.gates_TK.shape[0], num_experts)
        return w_TE.scatter(1, self.idx_TK, self.gates_TK)

    def counts(self, num_experts: int) -> Tensor:
        """Tokens routed to each expert, f_e (int64 [E]): a sum of ones by expert, whose shape does not depend on the
        ids (a compiled graph holds it whole)."""
        idx = self.idx_TK.reshape(-1)
        return idx.new_zeros(num_experts).scatter_add_(0, idx, torch.ones_like(idx))


def _linear_router(d_model: int, rows: int, std: float) -> nn.Linear:
    lin = nn.Linear(d_model, rows, bias=False)
    nn.init.normal_(lin.weight, mean=0.0, std=std)
    return lin


class GroupedRouter(nn.Module):
    """Two-level router: sigmoid group router picks Kg groups, then a global top-k over the combined
    group x intra-group-softmax scores of the experts in those groups."""

    fused = False  # G2-E6 through mohge.model.route_kernel, else top-k's through mohge.model.topk (train.fused)

    def __init__(self, d_model: int, ffn: FFNConfig, router: RouterConfig) -> None:
        super().__init__()
        self.G, self.n, self.E = ffn.num_groups, ffn.experts_per_group, ffn.num_experts
        self.Kg, self.K = router.group_topk, router.topk
        self.group_score, self.gate_mode = router.group_score, router.gate_mode
        self.group_router = _linear_router(d_model, self.G, router.init_std)  # W_G [G, D]
        self.expert_router = _linear_router(d_model, self.E, router.init_std)  # W_E [E, D], group-major
        self.bias_rate = router.expert_bias_rate
        if self.bias_rate:  # docs/method.md §5.6: a state of the model (checkpointed), not a parameter
            self.register_buffer("expert_bias_E", torch.zeros(self.E))
        self.group_bias_rate = router.group_bias_rate
        if self.group_bias_rate:  # §5.7: the same kind of state, one per group
            self.register_buffer("group_bias_G", torch.zeros(self.G))

    @property
    def selection_biased(self) -> bool:
        """Whether a selection bias (§5.6 per expert, §5.7 per group) is updated after each optimizer step."""
        return bool(self.bias_rate or self.group_bias_rate)

    def scores(self, x_TD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Steps G1-G4 and E1-E4: (group logits l^G [T,G], selected-group map [T,G], combined scores c [T,E]).

        c is a probability vector per token, non-zero only on the experts of the selected groups.
        """
        return self._scores(self.group_router(x_TD), self.expert_router(x_TD))

    def _scores(self, lG_TG: Tensor, lE_TE: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`scores` from the group logits l^G [T,G] (G1) and the expert logits [T,E] (E1)."""
        T = lG_TG.shape[0]
        # G2-G4: group logits -> scores -> top-Kg -> normalized group weights p (dense, 0 off the top-Kg).
        if self.group_bias_rate:  # §5.7: the bias moves which groups are selected, never a weight
            gidx_TKg = top_k(lG_TG + self.group_bias_G.to(lG_TG.dtype), self.Kg, self.fused)[1]
        else:
            gidx_TKg = top_k(lG_TG, self.Kg, self.fused)[1]  # sigmoid/softmax are monotone: same top-k
        if self.group_score == "sigmoid":
            s_TKg = torch.sigmoid(lG_TG.gather(1, gidx_TKg))
            if self.Kg > 1:  # Megatron's sigmoid path normalizes only when topk > 1
                s_TKg = s_TKg / (s_TKg.sum(-1, keepdim=True) + 1e-20)
        else:  # Megatron softmax-after-top-k
            s_TKg = torch.softmax(lG_TG.gather(1, gidx_TKg), dim=-1)
        # s's dtype, not l^G's: under CUDA autocast the softmax is computed (and returned) in fp32.
        p_TG = s_TKg.new_zeros(T, self.G).scatter(1, gidx_TKg, s_TKg)
        gmap_TG = torch.zeros(T, self.G, dtype=torch.bool, device=lG_TG.device).scatter(1, gidx_TKg, True)
        # E2-E3: intra-group softmax, scaled by the group weight (the mask is implied by p = 0).
        q_TGn = torch.softmax(lE_TE.view(T, self.G, self.n), dim=-1)
        c_TE = (q_TGn * p_TG[:, :, None]).reshape(T, self.E)
        # E4: renormalize (a no-op up to rounding unless Kg == 1, where p is the raw sigmoid).
        return lG_TG, gmap_TG, c_TE / c_TE.sum(-1, keepdim=True)

    @torch.no_grad()
    def update_selection_bias(self, counts_E: Tensor) -> None:
        """After each optimizer step, from the step's routed tokens per expert ``counts_E`` (the whole global batch).

        §5.6: b_e += u * sign(mean of e's group - count_e), so an expert loaded under its group's mean gains
        selection score and one over it loses. §5.7: b_g += u_G * sign(mean over groups - slots of g), the slots of g
        being the routed slots of its experts, so a group its tokens' top-K leaves empty gains group-selection score.
        """
        counts_Gn = counts_E.float().view(self.G, self.n)
        if self.bias_rate:
            error_Gn = counts_Gn.mean(1, keepdim=True) - counts_Gn
            self.expert_bias_E += self.bias_rate * torch.sign(error_Gn).view(self.E).to(self.expert_bias_E)
        if self.group_bias_rate:
            slots_G = counts_Gn.sum(1)
            self.group_bias_G += self.group_bias_rate * torch.sign(slots_G.mean() - slots_G).to(self.group_bias_G)

    def forward(self, x_TD: Tensor) -> Routing:
        lG_TG, lE_TE = self.group_router(x_TD), self.expert_router(x_TD)  # G1, E1
        if self.fused and route_kernel.fits(lG_TG, lE_TE, self.n, self.Kg, self.K):  # G2-E6 in one kernel
            idx_TK, gates_TK, gmap_TG = route_kernel.grouped_route(
                lG_TG,
                lE_TE,
                self.group_bias_G if self.group_bias_rate else None,
                self.expert_bias_E if self.bias_rate else None,
                self.n,
                self.Kg,
                self.K,
                self.group_score == "softmax",
                self.gate_mode == "product_renorm",
            )
            return Routing(idx_TK=idx_TK, gates_TK=gates_TK, group_logits_TG=lG_TG, group_map_TG=gmap_TG)
        lG_TG, gmap_TG, c_TE = self._scores(lG_TG, lE_TE)
        # E5: global top-k among the experts of the selected groups; unselected experts are masked to
        # -inf rather than trusting their zeros (docs/method.md §2 E5: candidates can underflow to 0 in bf16).
        emap_TE = gmap_TG.repeat_interleave(self.n, dim=1)
        if self.bias_rate:  # §5.6: the bias moves which experts are selected, never a gate
            sel_TE = (c_TE + self.expert_bias_E.to(c_TE.dtype)).masked_fill(~emap_TE, -math.inf)
            idx_TK = top_k(sel_TE, self.K, self.fused)[1]
            topv_TK = c_TE.gather(1, idx_TK)
        else:
            topv_TK, idx_TK = top_k(c_TE.masked_fill(~emap_TE, -math.inf), self.K, self.fused)
        # E6: final gates. softmax_topk_probs = Megatron's softmax over the top-k *probabilities* (the release);
        # product_renorm = the top-k combined scores renormalized to sum to 1 (docs/method.md §10.1).
        if self.gate_mode == "softmax_topk_probs":
            gates_TK = torch.softmax(topv_TK, dim=-1)
        else:
            gates_TK = topv_TK / topv_TK.sum(-1, keepdim=True)
        return Routing(idx_TK=idx_TK, gates_TK=gates_TK, group_logits_TG=lG_TG, group_map_TG=gmap_TG)


class TopKRouter(nn.Module):
    """Flat router over all E experts (homogeneous MoE, HMoE, MoDSE): top-k of the logits, softmax over
    the selected logits (Megatron's default, equal to renormalizing the full softmax over the top-k)."""

    fused = False  # route through mohge.model.route_kernel, else the top-k through mohge.model.topk (train.fused)

    def __init__(self, d_model: int, ffn: FFNConfig, router: RouterConfig) -> None:
        super().__init__()
        self.E, self.K, self.flat_gate = ffn.num_experts, router.topk, router.flat_gate
        self.router = _linear_router(d_model, self.E, router.init_std)

    def forward(self, x_TD: Tensor) -> Routing:
        logits_TE = self.router(x_TD)
        if self.fused and route_kernel.fits_flat(logits_TE, self.K):  # top-k, softmax and gates in one kernel
            idx_TK, gates_TK, probs_TE = route_kernel.flat_route(logits_TE, self.K, self.flat_gate == "probs")
            return Routing(idx_TK=idx_TK, gates_TK=gates_TK, probs_TE=probs_TE)
        topv_TK, idx_TK = top_k(logits_TE, self.K, self.fused)
        probs_TE = F.softmax(logits_TE, dim=-1, dtype=torch.float32)
        if self.flat_gate == "probs":  # docs/method.md §2.4: MoHGE's softmax_topk_probs form
            gates_TK = torch.softmax(probs_TE.gather(1, idx_TK), dim=-1).to(logits_TE.dtype)
        else:
            gates_TK = torch.softmax(topv_TK, dim=-1)
        return Routing(idx_TK=idx_TK, gates_TK=gates_TK, probs_TE=probs_TE)
