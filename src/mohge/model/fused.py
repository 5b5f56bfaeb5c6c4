"""The fused training path for small models: ``train.fused: true`` (docs/speed.md).

At the capacity study's sizes (d_model 32 and 64, windows of 5 tokens) a training step's time goes to kernels whose
inner loops are a few elements long (PyTorch's CPU flash attention per (window, head) problem, RoPE over half-rows of
4 channels, the norms, the routers' softmax and top-k over 4 to 32 entries a token) and to the [T, V] tensors of the
LM head's cross-entropy, written and read again four times. The fused path runs:

- a block's attention half, ``x + attn(norm(x))`` (norm, QKV, RoPE, attention, output projection, residual) and the
  feed-forward norm of its output, as one graph compiled by ``torch.compile`` (inductor: loops over whole rows,
  fused) when it is multi-head attention over causal windows of at most :data:`SHORT_WINDOW` tokens, the attention
  written as broadcast products and a masked softmax (:func:`short_causal_attention`) in place of
  ``F.scaled_dot_product_attention`` (:func:`mohge.model.transformer._attention_half`); longer windows, masks and
  MLA stay eager;
- the MoE router's forward (scores, selection, gates) and the layer's aux losses, compiled: :func:`route`;
- the LM head and its mean cross-entropy in chunks of :data:`LOSS_CHUNK` tokens (:func:`linear_cross_entropy`): each
  chunk's logits, softmax and gradients stay in cache and the [T, V] logits are never stored; outside autocast.

Compiled graphs are built once per shape at the first steps and shared by every layer. Each piece computes the eager
model's function in other roundings (the order of a sum, inductor's exponential), so a run on the fused path is a run
of its own, not the committed studies' arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn as nn

from .routing import Routing

Tensor = torch.Tensor

# The longest window compiled as broadcast products. Measured on an Intel Xeon with AMX, one thread, forward and
# backward against SDPA at B*H*S = 40,960: 0.25x its time at 5 tokens, 0.43x at 8, 0.84x at 16, 1.61x at 32.
SHORT_WINDOW = 16

# Tokens per chunk of the head's loss. Measured at T 10,240, D 32, V 514, one thread, forward and backward: 0.56x
# the time of F.linear + F.cross_entropy at 128 tokens, 0.51x at 256, 0.50x at 512, 0.56x at 1,024.
LOSS_CHUNK = 512


def short_causal_attention(q_BHSd: Tensor, k_BHSd: Tensor, v_BHSd: Tensor) -> Tensor:
    """Causal softmax attention (scale 1/sqrt(d)) as ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``
    computes it, written as broadcast products and sums over a short window: compiled, each query's scores, softmax
    and weighted sum run as one loop over its few keys."""
    S, d = q_BHSd.shape[-2:]
    s_BHSS = (q_BHSd[..., :, None, :] * k_BHSd[..., None, :, :]).sum(-1) * d**-0.5
    causal_SS = torch.ones(S, S, dtype=torch.bool, device=q_BHSd.device).tril()
    p_BHSS = torch.softmax(s_BHSS.masked_fill(~causal_SS, float("-inf")), dim=-1)
    return (p_BHSS[..., None] * v_BHSd[..., None, :, :]).sum(-2)


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by ``torch.compile`` (static shapes: once per shape), one compiled function per ``fn``."""
    return torch.compile(fn, dynamic=False)


def _routed(layer: nn.Module, x_TD: Tensor) -> tuple[tuple[Tensor | None, ...], dict[str, Tensor]]:
    r = layer.router(x_TD)
    aux = layer.aux_losses(r) if layer.training else {}
    return (r.idx_TK, r.gates_TK, r.probs_TE, r.group_logits_TG, r.group_map_TG), aux


def route(layer: nn.Module, x_TD: Tensor) -> tuple[Routing, dict[str, Tensor]]:
    """``layer.router(x_TD)`` and, in training, the layer's aux losses of that routing, compiled as one graph (one for
    every MoE layer of a class and configuration)."""
    (idx, gates, probs, group_logits, group_map), aux = compiled(_routed)(layer, x_TD)
    r = Routing(idx_TK=idx, gates_TK=gates, probs_TE=probs, group_logits_TG=group_logits, group_map_TG=group_map)
    return r, aux


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the logits ``h W^T`` against ``y``, with its gradients computed chunk by chunk in the
    forward pass (softmax minus the one-hot, over T) and scaled by the incoming gradient in the backward."""

    @staticmethod
    def forward(ctx, h_TD: Tensor, w_VD: Tensor, y_T: Tensor, chunk: int) -> Tensor:
        T = h_TD.shape[0]
        dh_TD, dw_VD = torch.empty_like(h_TD), torch.zeros_like(w_VD)
        total = h_TD.new_zeros(())
        for s in range(0, T, chunk):
            h_CD, y_C1 = h_TD[s : s + chunk], y_T[s : s + chunk, None]
            z_CV = h_CD @ w_VD.t()
            z_CV -= z_CV.amax(-1, keepdim=True)
            p_CV = z_CV.exp()
            sum_C1 = p_CV.sum(-1, keepdim=True)
            total += (sum_C1.log() - z_CV.gather(1, y_C1)).sum()  # -log softmax at the target
            p_CV /= sum_C1
            p_CV.scatter_add_(1, y_C1, p_CV.new_full(y_C1.shape, -1.0))  # d(loss sum)/dz = softmax - one-hot
            p_CV *= 1.0 / T
            torch.mm(p_CV, w_VD, out=dh_TD[s : s + chunk])
            dw_VD.addmm_(p_CV.t(), h_CD)
        ctx.save_for_backward(dh_TD, dw_VD)
        return total / T

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor, None, None]:
        dh_TD, dw_VD = ctx.saved_tensors
        return dh_TD * g, dw_VD * g, None, None


def linear_cross_entropy(h_TD: Tensor, w_VD: Tensor, y_T: Tensor, chunk: int = LOSS_CHUNK) -> Tensor:
    """``F.cross_entropy(F.linear(h, w), y)`` (the mean over T tokens) in chunks of ``chunk`` tokens, the logits never
    stored whole: the same function in other roundings (a chunk's sums, the mean as a sum of chunk sums)."""
    if h_TD.dim() != 2 or y_T.shape != h_TD.shape[:1] or w_VD.shape[1] != h_TD.shape[1]:
        raise ValueError(f"linear_cross_entropy: h {tuple(h_TD.shape)}, w {tuple(w_VD.shape)}, y {tuple(y_T.shape)}")
    return _LinearCrossEntropy.apply(h_TD, w_VD, y_T, chunk)


def use_fused(model: nn.Module) -> int:
    """Train ``model`` on the fused path from now on: every module with a ``fused`` switch
    (:class:`~mohge.model.transformer.LanguageModel`: its head's loss; :class:`~mohge.model.transformer.Block`: its
    attention half; :class:`~mohge.model.moe.MoELayer`: its router) is switched on; returns how many were."""
    switched = 0
    for m in model.modules():
        if isinstance(getattr(m, "fused", None), bool):
            m.fused = True
            switched += 1
    return switched
