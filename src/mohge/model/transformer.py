"""Decoder-only transformer LM whose FFN is chosen by config: dense | moe | mohge | hmoe | modse.

Pre-norm blocks with RMSNorm, RoPE and causal attention through ``F.scaled_dot_product_attention``;
attention is plain multi-head (``mha``, what we train) or DeepSeek-V2 multi-head latent attention (``mla``,
the release's 3B model, docs/method.md §1.4; plain RoPE, no YaRN scaling). The first ``ffn.dense_layers`` layers
use a dense SwiGLU (the release's "first k dense" rule), the rest the configured MoE layer.

Legend: B batch, S sequence, D model width, H heads, Dh head dim, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mohge.config import LossConfig, ModelConfig

from . import attention_kernel
from . import fused as _fused
from .experts import SwiGLU
from .moe import LayerStats, MoELayer

Tensor = torch.Tensor


def rope_tables(seq_len: int, dim: int, base: float, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin [S, dim/2] of rotary position embeddings."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles_SF = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles_SF.cos(), angles_SF.sin()


def apply_rope(x_BHSd: Tensor, cos_SF: Tensor, sin_SF: Tensor) -> Tensor:
    """Rotate channel pairs (x1, x2) = (first half, second half) of the last dim by the position angle: the tables'
    first S rows (positions 0..S-1), or, given per token as [B, 1, S, F], each token's own."""
    x1, x2 = x_BHSd.float().chunk(2, dim=-1)
    S = x_BHSd.shape[-2]
    cos, sin = (cos_SF[:S], sin_SF[:S]) if cos_SF.dim() == 2 else (cos_SF, sin_SF)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x_BHSd.dtype)


class _RopeQK(torch.autograd.Function):
    """q and k of a fused QKV projection rotated by :func:`apply_rope` at positions 0..S-1, and v, with the arithmetic
    of ``apply_rope(q), apply_rope(k)`` bit for bit, forward and backward, in fewer and longer elementwise loops.

    ``apply_rope`` works on each half (x1, x2) of a head's channels, so its seven elementwise ops a tensor, and their
    backward, run loops of Dh/2 elements (4 at d_model 32): at a short sequence and many windows the step's time goes
    to loop overhead. Here q and k are rotated together, with the tables spread over the whole channel row
    (cos2 = [cos, cos], nsin = [-sin, sin]):

        out = x * cos2 + rot(x) * nsin,   rot(x) = [x2, x1]     (first half x1 cos - x2 sin, second x2 cos + x1 sin)
        dx  = g * cos2 + rot(g) * (-nsin)                        (dx1 = g1 cos + g2 sin, dx2 = g2 cos - g1 sin)

    Each element is the same two IEEE products and one sum as ``apply_rope``'s: a * (-b) is -(a * b) exactly, a + (-b)
    is a - b, and a sum of two terms does not depend on their order (autograd adds dx1's two terms in either order).
    The outputs are laid out as ``apply_rope``'s are (q and k each a contiguous [B, H, S, Dh] tensor, v the same
    strided view of the projection), so attention reads the same memory layout; the backward writes the projection's
    gradient as the unbind of (q, k, v) would. Under bf16 it computes in fp32 and rounds once, as ``apply_rope``."""

    @staticmethod
    def forward(ctx, x_BS3HD: Tensor, cos_SF: Tensor, sin_SF: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, S, _, H, Dh = x_BS3HD.shape
        F_ = Dh // 2
        cos2_SD = torch.cat([cos_SF[:S], cos_SF[:S]], dim=-1)
        nsin_SD = torch.cat([-sin_SF[:S], sin_SF[:S]], dim=-1)
        # the tables over (q/k, head, channel): one contiguous row of 2*D per token, as q and k lie in the projection
        cos2_S2HD, nsin_S2HD = (t[:, None, None].expand(S, 2, H, Dh).contiguous() for t in (cos2_SD, nsin_SD))
        x_BS2HD = x_BS3HD[:, :, :2].float()
        prod_BS2HD = x_BS2HD * cos2_S2HD
        rot_BS2HD = torch.empty_like(prod_BS2HD)
        torch.mul(x_BS2HD[..., F_:], nsin_S2HD[..., :F_], out=rot_BS2HD[..., :F_])  # x2 * (-sin)
        torch.mul(x_BS2HD[..., :F_], nsin_S2HD[..., F_:], out=rot_BS2HD[..., F_:])  # x1 * sin
        qk = []
        for i in range(2):
            out_BHSD = x_BS3HD.new_empty(B, H, S, Dh)
            if out_BHSD.dtype == torch.float32:
                torch.add(prod_BS2HD[:, :, i], rot_BS2HD[:, :, i], out=out_BHSD.transpose(1, 2))
            else:
                out_BHSD.transpose(1, 2).copy_(prod_BS2HD[:, :, i] + rot_BS2HD[:, :, i])
            qk.append(out_BHSD)
        ctx.save_for_backward(cos2_SD, nsin_SD)
        ctx.dtype = x_BS3HD.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient is zeros, as unbind's backward gives it
        return qk[0], qk[1], x_BS3HD[:, :, 2].transpose(1, 2)

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor, None, None]:
        cos2_SD, nsin_SD = ctx.saved_tensors
        B, H, S, Dh = next(g for g in grads if g is not None).shape
        F_ = Dh // 2
        g_3BHSD = torch.empty(3, B, H, S, Dh, dtype=ctx.dtype, device=cos2_SD.device)
        for i, g_BHSD in enumerate(grads[:2]):
            if g_BHSD is None:
                g_3BHSD[i].zero_()
                continue
            g_BHSD = g_BHSD.float()
            prod_BHSD = g_BHSD * cos2_SD
            rot_BHSD = torch.empty_like(prod_BHSD)
            torch.mul(g_BHSD[..., F_:], nsin_SD[:, F_:], out=rot_BHSD[..., :F_])  # g2 * sin
            torch.mul(g_BHSD[..., :F_], nsin_SD[:, :F_], out=rot_BHSD[..., F_:])  # g1 * (-sin)
            if ctx.dtype == torch.float32:
                torch.add(prod_BHSD, rot_BHSD, out=g_3BHSD[i])
            else:
                g_3BHSD[i].copy_(prod_BHSD + rot_BHSD)
        if grads[2] is None:
            g_3BHSD[2].zero_()
        else:
            g_3BHSD[2].copy_(grads[2])
        return g_3BHSD.permute(1, 3, 0, 2, 4).contiguous(), None, None


def rope_qkv(x_BS3HD: Tensor, cos_SF: Tensor, sin_SF: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(q, k, v) [B, H, S, Dh] of a QKV projection viewed as [B, S, 3, H, Dh], q and k rotated at positions 0..S-1:
    ``apply_rope(q), apply_rope(k), v`` bit for bit, faster (:class:`_RopeQK`)."""
    return _RopeQK.apply(x_BS3HD, cos_SF, sin_SF)


def _linear(d_in: int, d_out: int, std: float) -> nn.Linear:
    lin = nn.Linear(d_in, d_out, bias=False)
    nn.init.normal_(lin.weight, 0.0, std)
    return lin


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE; given ``mask_BSS`` (True: the query token sees the key token), that
    mask instead of the causal one (a tree of sequences packed in one row: :mod:`mohge.evaluate.prefix_tree`)."""

    def __init__(self, cfg: ModelConfig, std: float, out_std: float) -> None:
        super().__init__()
        self.H, self.Dh = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = _linear(cfg.d_model, 3 * cfg.d_model, std)
        self.out = _linear(cfg.d_model, cfg.d_model, out_std)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask_BSS: Tensor | None = None) -> Tensor:
        B, S, D = x_BSD.shape
        x_BS3HD = self.qkv(x_BSD).view(B, S, 3, self.H, self.Dh)
        if cos.dim() == 2 and self.Dh > 2:  # positions 0..S-1 (at Dh 2 apply_rope's outputs have other strides)
            q, k, v = rope_qkv(x_BS3HD, cos, sin)  # 3 x [B, H, S, Dh]
        else:
            q, k, v = x_BS3HD.permute(2, 0, 3, 1, 4)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if mask_BSS is None:
            y_BHSd = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y_BHSd = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_BSS[:, None])
        return self.out(y_BHSd.transpose(1, 2).reshape(B, S, D))


class LatentAttention(nn.Module):
    """DeepSeek-V2 MLA without query compression: K/V come from a shared latent of rank ``kv_lora_rank``
    (RMS-normed), plus one decoupled RoPE key shared by all heads; ``mask_BSS`` as in :class:`Attention`."""

    def __init__(self, cfg: ModelConfig, std: float, out_std: float) -> None:
        super().__init__()
        self.H, self.dn, self.dr = cfg.n_heads, cfg.mla_q_head_dim, cfg.mla_rope_head_dim
        self.dv, self.rank = cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
        self.q_proj = _linear(cfg.d_model, self.H * (self.dn + self.dr), std)
        self.kv_down = _linear(cfg.d_model, self.rank + self.dr, std)
        self.kv_norm = nn.RMSNorm(self.rank, eps=cfg.norm_eps)
        self.kv_up = _linear(self.rank, self.H * (self.dn + self.dv), std)
        self.out = _linear(self.H * self.dv, cfg.d_model, out_std)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask_BSS: Tensor | None = None) -> Tensor:
        B, S, _ = x_BSD.shape
        q = self.q_proj(x_BSD).view(B, S, self.H, self.dn + self.dr).transpose(1, 2)
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        latent, k_rope = self.kv_down(x_BSD).split([self.rank, self.dr], dim=-1)
        kv = self.kv_up(self.kv_norm(latent)).view(B, S, self.H, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        k_rope = apply_rope(k_rope[:, None], cos, sin).expand(B, self.H, S, self.dr)
        q = torch.cat([q_nope, apply_rope(q_rope, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        if mask_BSS is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_BSS[:, None])
        return self.out(y.transpose(1, 2).reshape(B, S, self.H * self.dv))


def _attention_half(
    x_BSD: Tensor,
    norm: nn.RMSNorm,
    attn: Attention,
    ffn_norm: nn.RMSNorm,
    cos_SF: Tensor,
    sin_SF: Tensor,
    kernel: bool = False,
) -> tuple[Tensor, Tensor]:
    """``x + attn(norm(x))`` over causal windows at positions 0..S-1, and ``ffn_norm`` of it: what ``train.fused``
    compiles as one graph (norms, QKV, RoPE, attention, output projection and residual fused where inductor can). The
    attention: up to :data:`~mohge.model.fused.SHORT_WINDOW` tokens :func:`~mohge.model.fused.short_causal_attention`
    (with ``kernel``, where it was measured faster, the kernel of :mod:`mohge.model.attention_kernel`); longer windows
    ``F.scaled_dot_product_attention``, as the eager block computes it."""
    B, S, D = x_BSD.shape
    q, k, v = attn.qkv(norm(x_BSD)).view(B, S, 3, attn.H, attn.Dh).permute(2, 0, 3, 1, 4)
    q, k = apply_rope(q, cos_SF, sin_SF), apply_rope(k, cos_SF, sin_SF)
    if S > _fused.SHORT_WINDOW:
        y_BSHd = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    elif kernel and attention_kernel.fits(q, k, v):
        y_BSHd = attention_kernel.short_attention(q, k, v)
    else:
        y_BSHd = _fused.short_causal_attention(q, k, v).transpose(1, 2)
    x_BSD = x_BSD + attn.out(y_BSHd.reshape(B, S, D))
    return x_BSD, ffn_norm(x_BSD)


class Block(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``+ ffn(ffn_norm(x))``. With ``fused`` set
    (:func:`mohge.model.fused.use_fused`), the attention half of a multi-head block over causal windows (positions
    0..S-1, no mask) and its feed-forward norm run as one compiled graph (:func:`_attention_half`)."""

    fused = False

    def __init__(self, cfg: ModelConfig, loss: LossConfig, moe: bool, std: float, out_std: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = (LatentAttention if cfg.attention == "mla" else Attention)(cfg, std, out_std)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        if moe:
            self.ffn: nn.Module = MoELayer(cfg.d_model, cfg.ffn, cfg.router, loss, std, out_std)
        else:
            self.ffn = SwiGLU(cfg.d_model, cfg.ffn.dense_width, std, out_std)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask_BSS: Tensor | None = None
    ) -> tuple[Tensor, LayerStats | None]:
        S = x.shape[1]
        causal = mask_BSS is None and cos.dim() == 2
        if self.fused and causal and isinstance(self.attn, Attention):
            kernel = attention_kernel.preferred(x, self.attn.Dh)  # decided here: the graph holds one branch
            x, h = _fused.compiled(_attention_half)(
                x, self.attn_norm, self.attn, self.ffn_norm, cos[:S], sin[:S], kernel
            )
        else:
            x = x + self.attn(self.attn_norm(x), cos, sin, mask_BSS)
            h = self.ffn_norm(x)
        if isinstance(self.ffn, MoELayer):
            y, stats = self.ffn(h)
            return x + y, stats
        return x + self.ffn(h), None


@dataclass
class LMOutput:
    logits: Tensor | None  # [B, S, V]; None where the loss was computed from the hidden states (``lm_loss``)
    layers: list[LayerStats]  # one per MoE layer, in depth order
    lm_loss: Tensor | None = None  # the mean cross-entropy against the targets, on the fused path only


def _embedding(vocab: int, d_model: int, std: float) -> nn.Embedding:
    emb = nn.Embedding(vocab, d_model)
    nn.init.normal_(emb.weight, 0.0, std)
    return emb


def model_parts(cfg: ModelConfig, loss: LossConfig) -> list[tuple[str, Callable[[], nn.Module | None]]]:
    """The top-level parts of :class:`LanguageModel` (embed, blocks.i, norm, head), each with the function that
    builds it, in construction order: the order in which their initialisations draw from torch's RNG. Building
    them one at a time in this order gives the weights of the whole model built at once (the meta-device path,
    :mod:`mohge.train.distributed.meta_init`, holds one part at a time)."""
    std = cfg.init_std
    out_std = std / math.sqrt(2 * cfg.n_layers)  # Megatron's scaled init of output projections
    dense_first = cfg.n_layers if cfg.ffn.kind == "dense" else cfg.ffn.dense_layers
    blocks = [
        (f"blocks.{i}", functools.partial(Block, cfg, loss, i >= dense_first, std, out_std))
        for i in range(cfg.n_layers)
    ]
    return [
        ("embed", functools.partial(_embedding, cfg.vocab_size, cfg.d_model, std)),
        *blocks,
        ("norm", functools.partial(nn.RMSNorm, cfg.d_model, eps=cfg.norm_eps)),
        ("head", lambda: None if cfg.tie_embeddings else _linear(cfg.d_model, cfg.vocab_size, std)),
    ]


def model_rope_tables(cfg: ModelConfig, device=None) -> tuple[Tensor, Tensor]:
    """The model's RoPE buffers (cos, sin [max_seq_len, rope_dim / 2])."""
    rope_dim = cfg.mla_rope_head_dim if cfg.attention == "mla" else cfg.d_model // cfg.n_heads
    return rope_tables(cfg.max_seq_len, rope_dim, cfg.rope_base, device)


class LanguageModel(nn.Module):
    fused = False  # the head's loss in chunks (train.fused: mohge.model.fused.use_fused)

    def __init__(self, cfg: ModelConfig, loss: LossConfig | None = None) -> None:
        super().__init__()
        self.cfg, self.loss_cfg = cfg, loss or LossConfig()
        self.loss_cfg.check_against(cfg.ffn)
        parts = {name: make() for name, make in model_parts(cfg, self.loss_cfg)}
        self.embed = parts["embed"]
        self.blocks = nn.ModuleList(parts[f"blocks.{i}"] for i in range(cfg.n_layers))
        self.norm = parts["norm"]
        self.head = parts["head"]
        cos, sin = model_rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def moe_layers(self) -> list[MoELayer]:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, MoELayer)]

    def forward(self, tokens_BS: Tensor, targets_BS: Tensor | None = None) -> LMOutput:
        """The logits and the MoE layers' stats. On the fused path (``fused`` set: :func:`mohge.model.fused.use_fused`)
        with ``targets_BS`` given, the mean cross-entropy against them instead of the logits
        (:func:`mohge.model.fused.linear_cross_entropy`); anywhere else the targets are not read."""
        x, layers = self.hidden(tokens_BS)
        if self.fused and targets_BS is not None:
            w_VD = self.embed.weight if self.head is None else self.head.weight
            lm = _fused.linear_cross_entropy(x.flatten(0, 1), w_VD, targets_BS.flatten())
            return LMOutput(logits=None, layers=layers, lm_loss=lm)
        return LMOutput(logits=self.logits(x), layers=layers)

    def hidden(
        self, tokens_BS: Tensor, positions_BS: Tensor | None = None, mask_BSS: Tensor | None = None
    ) -> tuple[Tensor, list[LayerStats]]:
        """The final-normed hidden states [B, S, D] and the MoE layers' stats. By default each row is one causal
        sequence at positions 0..S-1; given ``positions_BS`` and ``mask_BSS`` (True: the query token sees the key
        token), each token sits at its own position and sees the tokens its mask lets it: a tree of sequences
        sharing their prefixes, packed in one row, each token seeing its ancestors and itself."""
        if (positions_BS is None) != (mask_BSS is None):
            raise ValueError("positions_BS and mask_BSS are given together or not at all")
        if positions_BS is None:
            if tokens_BS.shape[1] > self.cfg.max_seq_len:
                raise ValueError(f"sequence length {tokens_BS.shape[1]} exceeds max_seq_len={self.cfg.max_seq_len}")
            cos, sin = self.rope_cos, self.rope_sin
        else:
            if int(positions_BS.max()) >= self.cfg.max_seq_len:
                raise ValueError(f"position {int(positions_BS.max())} exceeds max_seq_len={self.cfg.max_seq_len}")
            cos, sin = self.rope_cos[positions_BS][:, None], self.rope_sin[positions_BS][:, None]
        x = self.embed(tokens_BS)
        layers = []
        for block in self.blocks:
            x, stats = block(x, cos, sin, mask_BSS)
            if stats is not None:
                layers.append(stats)
        return self.norm(x), layers

    def logits(self, x_ND: Tensor) -> Tensor:
        """The output head (the tied embedding, or its own) on hidden states of any leading shape."""
        return F.linear(x_ND, self.embed.weight) if self.head is None else self.head(x_ND)
