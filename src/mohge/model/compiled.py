"""Compiled pieces of the model for short windows and small widths: ``train.compile: pieces`` (docs/speed.md).

At the capacity study's sizes (d_model 32 and 64, windows of 5 tokens) a training step's time goes to kernels whose
inner loops are a few elements long: PyTorch's CPU flash attention, per (window, head) problem, and the routers'
softmax and top-k over 4 to 32 entries a token. Two pieces run compiled by ``torch.compile`` (inductor: loops over
whole rows, fused), each compiled once per shape on first use and shared by every layer:

- causal attention over windows of at most :data:`SHORT_WINDOW` tokens, as broadcast products and a masked softmax
  (:func:`short_causal_attention`), in place of ``F.scaled_dot_product_attention``; longer windows keep SDPA;
- the router's forward (scores, selection, gates): :func:`route`.

Both compute the same functions as the eager model in other roundings (the order of a sum, the exponential of
inductor's softmax), so a run with them is a run of its own, not the committed studies' arithmetic. The training
process then imports the compiler (seconds) and compiles at its first steps (seconds more).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn

from .routing import Routing

Tensor = torch.Tensor

# The longest window compiled as broadcast products. Measured on an Intel Xeon with AMX, one thread, forward and
# backward against SDPA at B*H*S = 40,960: 0.25x its time at 5 tokens, 0.43x at 8, 0.84x at 16, 1.61x at 32.
SHORT_WINDOW = 16


def short_causal_attention(q_BHSd: Tensor, k_BHSd: Tensor, v_BHSd: Tensor) -> Tensor:
    """Causal softmax attention (scale 1/sqrt(d)) as ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``
    computes it, written as broadcast products and sums over a short window: compiled, each query's scores, softmax
    and weighted sum run as one loop over its few keys."""
    S, d = q_BHSd.shape[-2:]
    s_BHSS = (q_BHSd[..., :, None, :] * k_BHSd[..., None, :, :]).sum(-1) * d**-0.5
    causal_SS = torch.ones(S, S, dtype=torch.bool, device=q_BHSd.device).tril()
    p_BHSS = torch.softmax(s_BHSS.masked_fill(~causal_SS, float("-inf")), dim=-1)
    return (p_BHSS[..., None] * v_BHSd[..., None, :, :]).sum(-2)


def _route_fields(router: nn.Module, x_TD: Tensor) -> tuple[Tensor | None, ...]:
    r = router(x_TD)
    return r.idx_TK, r.gates_TK, r.probs_TE, r.group_logits_TG, r.group_map_TG


@functools.cache
def _compiled(name: str):
    fn = {"attention": short_causal_attention, "route": _route_fields}[name]
    return torch.compile(fn, dynamic=False)


def attention(q_BHSd: Tensor, k_BHSd: Tensor, v_BHSd: Tensor) -> Tensor:
    """:func:`short_causal_attention`, compiled."""
    return _compiled("attention")(q_BHSd, k_BHSd, v_BHSd)


def route(router: nn.Module, x_TD: Tensor) -> Routing:
    """``router(x_TD)``, compiled (one graph for every router of a class and configuration)."""
    idx, gates, probs, group_logits, group_map = _compiled("route")(router, x_TD)
    return Routing(idx_TK=idx, gates_TK=gates, probs_TE=probs, group_logits_TG=group_logits, group_map_TG=group_map)


def use_compiled(model: nn.Module) -> int:
    """Run ``model``'s attention (multi-head, windows of at most :data:`SHORT_WINDOW` tokens, no mask) and MoE
    routers through the compiled pieces from now on: every module with a ``compiled`` switch
    (:class:`~mohge.model.transformer.Attention`, :class:`~mohge.model.moe.MoELayer`) is switched on; returns how many
    were."""
    switched = 0
    for m in model.modules():
        if isinstance(getattr(m, "compiled", None), bool):
            m.compiled = True
            switched += 1
    return switched
