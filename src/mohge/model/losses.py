"""Auxiliary losses, per MoE layer and micro-batch, *without* their coefficients.

The layer returns the raw values (what Megatron logs as ``load_balancing_loss`` and
``load_group_balancing_loss``, i.e. divided by the coefficient); :func:`weighted_aux` multiplies them by
the coefficients of :class:`~mohge.config.LossConfig`, with the group loss's schedule, and the trainer adds
the sum to the LM loss (docs/method.md §5.4: L_total = L_LM + sum_layers (L_G + L_E)).

Legend: T tokens, G groups, E experts, K experts per token, Kg groups per token.
"""

from __future__ import annotations

import torch

from mohge.config import FFNConfig, LossConfig
from mohge.config.sections import group_aux_active

from .routing import Routing

Tensor = torch.Tensor


def _squared(T: int) -> int:
    """T^2 of a balance loss's normaliser, and 1 for an empty batch (T = 0, every token masked out): its sums P are
    0, so its loss is 0 rather than 0/0."""
    return max(T, 1) * max(T, 1)


def group_cost_weights(ffn: FFNConfig, loss: LossConfig) -> list[float]:
    """omega_g of the Group-Wise Aux Loss: (h_g - h_min + interval) / interval (docs/method.md §5.1), unless given.

    The release uses interval 1024 with widths 384..1280, giving omega = 1.000, 1.125, ..., 1.875.
    """
    if loss.group_cost_weights is not None:
        return list(loss.group_cost_weights)
    h_min = loss.group_cost_min if loss.group_cost_min is not None else min(ffn.expert_widths)
    dw = loss.group_cost_interval
    return [(h - h_min + dw) / dw for h in ffn.expert_widths]


def group_aux_loss(
    group_logits_TG: Tensor, group_map_TG: Tensor, omega_G: Tensor, group_topk: int, f_G: Tensor | None = None
) -> Tensor:
    """Group-Wise Auxiliary Loss (docs/method.md §5.1), without alpha_G:

    L_G = G / (T^2 Kg) * sum_g omega_g * P_g * f_g,
    P_g = sum_t softmax(l^G_t)_g  (fp32, dense: every group gets gradient),
    f_g = number of tokens whose top-Kg set contains g (no gradient); given as ``f_G``, the global-batch mean per
    micro-batch (docs/method.md §5.5), it replaces this micro-batch's own counts.
    """
    T, G = group_logits_TG.shape
    P_G = torch.softmax(group_logits_TG.float(), dim=-1).sum(0)
    f_G = (group_map_TG.sum(0) if f_G is None else f_G).to(P_G.dtype)
    return G / (_squared(T) * group_topk) * (omega_G.to(P_G) * P_G * f_G).sum()


def intra_group_aux_loss(
    routing: Routing,
    num_experts: int,
    num_groups: int,
    group_topk: int,
    topk: int,
    mode: str = "all_experts_sparse",
    f_E: Tensor | None = None,
) -> Tensor:
    """Intra-Group Experts Auxiliary Loss (docs/method.md §5.2), without alpha_E.

    ``all_experts_sparse`` (the release): L_E = N_eff / (T^2 K) * sum_e Pt_e f_e with Pt_e = sum_t w_{t,e} the *sparse
    final gates* and N_eff = E * Kg / G, the candidates a token competes over.

    ``per_group`` (an ablation, docs/method.md §10.4): a dimensionless Switch loss inside each group over the routed
    slots that landed in it, n / (S_g^2) * sum_{e in g} Pt_e f_e with S_g the slots (and gate mass) of group
    g, averaged over the groups that received any slot. It is 1 when a group's slots are spread evenly.

    ``f_E`` (``all_experts_sparse`` only): the global-batch mean counts per micro-batch (docs/method.md §5.5) in
    place of this micro-batch's own.
    """
    T = routing.idx_TK.shape[0]
    w_TE = routing.dense_gates(num_experts).float()
    Pt_E = w_TE.sum(0)
    if f_E is not None and mode != "all_experts_sparse":
        raise ValueError(f"global-batch counts need expert_aux_mode 'all_experts_sparse', not {mode!r}")
    f_E = (routing.counts(num_experts) if f_E is None else f_E).to(Pt_E.dtype)
    if mode == "all_experts_sparse":
        n_eff = num_experts * group_topk / num_groups
        return n_eff / (_squared(T) * topk) * (Pt_E * f_E).sum()
    n = num_experts // num_groups
    Pt_Gn, f_Gn = Pt_E.view(num_groups, n), f_E.view(num_groups, n)
    S_G, M_G = f_Gn.sum(1), Pt_Gn.sum(1)
    if T == 0:  # no routed slot in any group: Pt = 0, so its sum is a 0 that keeps the graph
        return Pt_E.sum()
    used = S_G > 0
    per_group = n * (Pt_Gn * f_Gn).sum(1)[used] / (S_G[used] * M_G[used])
    return per_group.mean()


def switch_aux_loss(probs_TE: Tensor, counts_E: Tensor, topk: int, size_weight_E: Tensor | None = None) -> Tensor:
    """Switch-Transformer balance loss as Megatron computes it, without alpha:

        L = E / (T^2 K) * sum_e P_e f_e,   P_e = sum_t softmax(logits_t)_e (dense),  f_e = tokens to e.

    With ``size_weight_E`` = h_e / mean(h) this is our reading of HMoE's parameter-penalty loss: the
    balance term of each expert is weighted by its relative size, so the router learns to favour small
    experts (HMoE, arXiv 2408.10681).
    """
    T, E = probs_TE.shape
    terms_E = probs_TE.sum(0) * counts_E.to(probs_TE.dtype)
    if size_weight_E is not None:
        terms_E = terms_E * size_weight_E.to(terms_E)
    return E / (_squared(T) * topk) * terms_E.sum()


def weighted_aux(aux: dict[str, Tensor], loss: LossConfig, step: int, total_steps: int) -> Tensor:
    """Coefficient-weighted sum of one layer's raw aux losses at training step ``step``."""
    total = next(iter(aux.values())).new_zeros(()) if aux else torch.zeros(())
    for name, value in aux.items():
        if name == "group_aux":
            if loss.group_aux_coeff and group_aux_active(step, total_steps, loss.group_aux_start_frac):
                total = total + loss.group_aux_coeff * value
        elif name == "expert_aux":
            total = total + loss.expert_aux_coeff * value
        elif name == "hmoe_penalty":
            total = total + loss.hmoe_penalty_coeff * value
        else:
            raise KeyError(f"unknown aux loss {name!r}")
    return total
