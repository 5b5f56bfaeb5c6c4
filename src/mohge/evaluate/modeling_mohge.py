"""Hugging Face ``transformers`` model of an exported mohge checkpoint: ``MoHGEForCausalLM``.

Copied next to the weights by ``mohge export`` and loaded there with ``trust_remote_code=True``, so
it imports only torch and transformers (and its sibling ``configuration_mohge``), never mohge. It computes the
forward pass of ``mohge.model.LanguageModel`` operation for operation (pre-norm blocks, RoPE, MHA or MLA, a dense
SwiGLU or an MoE layer: MoHGE's two-level router or the flat top-k router, experts of several widths, an optional
shared expert; docs/method.md), with the same parameter names under ``model.`` (and ``head`` as ``lm_head``).
tests/unit/test_hf_export.py holds the two equal for every FFN family and both attention kinds.

What it adds for generation: a KV cache (transformers' ``DynamicCache``), ``attention_mask`` for left-padded
batches (a padded query still sees itself, so no attention row is empty) and positions that skip the padding.
Inference only: the auxiliary balance losses of training are not computed.

Legend: B batch, S new positions, L cached + new positions, D model width, H heads, Dh head dim, T = B*S tokens,
E experts, K experts per token, G groups, n experts per group.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_mohge import MoHGEConfig

Tensor = torch.Tensor


def rope_cos_sin(pos_BS: Tensor, dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos/sin [B, 1, S, dim/2] of the rotary angles at the given positions (broadcast over heads)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=pos_BS.device, dtype=torch.float32) / dim))
    angles_BSF = pos_BS.float()[..., None] * inv_freq
    return angles_BSF.cos()[:, None], angles_BSF.sin()[:, None]


def apply_rope(x_BHSd: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (first half, second half) of the last dim by the position angle."""
    x1, x2 = x_BHSd.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x_BHSd.dtype)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask_BqSL: Tensor | None) -> Tensor:
    if mask_BqSL is None:  # no cache, no padding: the plain causal path of mohge's model
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_BqSL)


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE."""

    def __init__(self, cfg: MoHGEConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.H, self.Dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        self.rope_dim, self.rope_base = self.Dh, cfg.rope_base
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: Cache | None) -> Tensor:
        B, S, D = x_BSD.shape
        q, k, v = self.qkv(x_BSD).view(B, S, 3, self.H, self.Dh).permute(2, 0, 3, 1, 4)  # 3 x [B, H, S, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # [B, H, L, Dh]
        return self.out(_attend(q, k, v, mask).transpose(1, 2).reshape(B, S, D))


class LatentAttention(nn.Module):
    """DeepSeek-V2 multi-head latent attention without query compression (one shared RoPE key)."""

    def __init__(self, cfg: MoHGEConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.H, self.dn, self.dr = cfg.num_attention_heads, cfg.mla_q_head_dim, cfg.mla_rope_head_dim
        self.dv, self.rank = cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
        self.rope_dim, self.rope_base = self.dr, cfg.rope_base
        self.q_proj = nn.Linear(cfg.hidden_size, self.H * (self.dn + self.dr), bias=False)
        self.kv_down = nn.Linear(cfg.hidden_size, self.rank + self.dr, bias=False)
        self.kv_norm = nn.RMSNorm(self.rank, eps=cfg.rms_norm_eps)
        self.kv_up = nn.Linear(self.rank, self.H * (self.dn + self.dv), bias=False)
        self.out = nn.Linear(self.H * self.dv, cfg.hidden_size, bias=False)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: Cache | None) -> Tensor:
        B, S, _ = x_BSD.shape
        q = self.q_proj(x_BSD).view(B, S, self.H, self.dn + self.dr).transpose(1, 2)
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        latent, k_rope = self.kv_down(x_BSD).split([self.rank, self.dr], dim=-1)
        kv = self.kv_up(self.kv_norm(latent)).view(B, S, self.H, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        k_rope = apply_rope(k_rope[:, None], cos, sin).expand(B, self.H, S, self.dr)
        q = torch.cat([q_nope, apply_rope(q_rope, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        y = _attend(q, k, v, mask)
        return self.out(y.transpose(1, 2).reshape(B, S, self.H * self.dv))


class SwiGLU(nn.Module):
    """Bias-free SwiGLU: [a; u] = W1 x, y = W2 (SiLU(a) * u); the dense FFN and the shared expert."""

    def __init__(self, d_model: int, width: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(2 * width, d_model))  # [2H, D]: gate a, up u
        self.w2 = nn.Parameter(torch.empty(d_model, width))  # [D, H]

    def forward(self, x: Tensor) -> Tensor:
        a, u = F.linear(x, self.w1).chunk(2, dim=-1)
        return F.linear(F.silu(a) * u, self.w2)


class GroupedRouter(nn.Module):
    """MoHGE's two-level router: the group router picks group_topk groups (sigmoid or softmax scores), then a
    top-k over the experts of those groups of (group weight x intra-group softmax); docs/method.md."""

    def __init__(self, cfg: MoHGEConfig) -> None:
        super().__init__()
        self.G, self.n, self.E = cfg.num_groups, cfg.experts_per_group, cfg.num_experts
        self.Kg, self.K = cfg.group_topk, cfg.topk
        self.group_score, self.gate_mode = cfg.group_score, cfg.gate_mode
        self.group_router = nn.Linear(cfg.hidden_size, self.G, bias=False)
        self.expert_router = nn.Linear(cfg.hidden_size, self.E, bias=False)  # group-major expert ids
        self.biased = getattr(cfg, "expert_bias", False)
        if self.biased:  # selection only: which experts, never a gate
            self.register_buffer("expert_bias_E", torch.zeros(self.E))
        self.group_biased = getattr(cfg, "group_bias", False)
        if self.group_biased:  # selection only: which groups, never a weight
            self.register_buffer("group_bias_G", torch.zeros(self.G))

    def forward(self, x_TD: Tensor) -> tuple[Tensor, Tensor]:
        T = x_TD.shape[0]
        lG_TG = self.group_router(x_TD)
        sel_TG = lG_TG + self.group_bias_G.to(lG_TG.dtype) if self.group_biased else lG_TG
        gidx_TKg = torch.topk(sel_TG, self.Kg, dim=-1).indices
        if self.group_score == "sigmoid":
            s_TKg = torch.sigmoid(lG_TG.gather(1, gidx_TKg))
            if self.Kg > 1:
                s_TKg = s_TKg / (s_TKg.sum(-1, keepdim=True) + 1e-20)
        else:
            s_TKg = torch.softmax(lG_TG.gather(1, gidx_TKg), dim=-1)
        p_TG = lG_TG.new_zeros(T, self.G).scatter(1, gidx_TKg, s_TKg)
        gmap_TG = torch.zeros(T, self.G, dtype=torch.bool, device=x_TD.device).scatter(1, gidx_TKg, True)
        q_TGn = torch.softmax(self.expert_router(x_TD).view(T, self.G, self.n), dim=-1)
        c_TE = (q_TGn * p_TG[:, :, None]).reshape(T, self.E)
        c_TE = c_TE / c_TE.sum(-1, keepdim=True)
        emap_TE = gmap_TG.repeat_interleave(self.n, dim=1)
        if self.biased:
            sel_TE = (c_TE + self.expert_bias_E.to(c_TE.dtype)).masked_fill(~emap_TE, -math.inf)
            idx_TK = torch.topk(sel_TE, self.K, dim=-1).indices
            topv_TK = c_TE.gather(1, idx_TK)
        else:
            topv_TK, idx_TK = torch.topk(c_TE.masked_fill(~emap_TE, -math.inf), self.K, dim=-1)
        if self.gate_mode == "softmax_topk_probs":
            return idx_TK, torch.softmax(topv_TK, dim=-1)
        return idx_TK, topv_TK / topv_TK.sum(-1, keepdim=True)


class TopKRouter(nn.Module):
    """Flat top-k router of the baselines (moe, hmoe, modse): softmax over the top-k logits, or over their
    probabilities (``flat_gate="probs"``, the form of MoHGE's ``softmax_topk_probs`` gate)."""

    def __init__(self, cfg: MoHGEConfig) -> None:
        super().__init__()
        self.K, self.flat_gate = cfg.topk, getattr(cfg, "flat_gate", "logits")
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)

    def forward(self, x_TD: Tensor) -> tuple[Tensor, Tensor]:
        logits_TE = self.router(x_TD)
        topv_TK, idx_TK = torch.topk(logits_TE, self.K, dim=-1)
        if self.flat_gate == "probs":
            probs_TK = torch.softmax(logits_TE.float(), dim=-1).gather(1, idx_TK)
            return idx_TK, torch.softmax(probs_TK, dim=-1).to(logits_TE.dtype)
        return idx_TK, torch.softmax(topv_TK, dim=-1)


class RoutedExperts(nn.Module):
    """Experts in width classes, one [n, 2H_c, D] / [n, D, H_c] pair per class, class-major expert ids.
    Computed like mohge's pure-torch grouped path: sort the routed slots by expert, one GEMM pair per expert."""

    def __init__(self, cfg: MoHGEConfig) -> None:
        super().__init__()
        n, D = cfg.experts_per_group, cfg.hidden_size
        self.w1 = nn.ParameterList(nn.Parameter(torch.empty(n, 2 * h, D)) for h in cfg.expert_widths)
        self.w2 = nn.ParameterList(nn.Parameter(torch.empty(n, D, h)) for h in cfg.expert_widths)

    def forward(self, x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor) -> Tensor:
        w1s, w2s = list(self.w1), list(self.w2)
        device = x_TD.device.type
        if torch.is_autocast_enabled(device):  # as mohge does: the expert GEMMs run in the autocast dtype
            dt = torch.get_autocast_dtype(device)
            x_TD, w1s, w2s = x_TD.to(dt), [w.to(dt) for w in w1s], [w.to(dt) for w in w2s]
        gates_TK = gates_TK.to(x_TD.dtype)
        w1_e = [w[j] for w in w1s for j in range(w.shape[0])]
        w2_e = [w[j] for w in w2s for j in range(w.shape[0])]
        flat_A = idx_TK.reshape(-1)  # A = T*K routed slots
        order_A = torch.argsort(flat_A, stable=True)
        tok_A = torch.div(order_A, idx_TK.shape[1], rounding_mode="floor")
        bounds = [0, *torch.cumsum(torch.bincount(flat_A, minlength=len(w1_e)), 0).tolist()]
        xs_AD = x_TD[tok_A]
        outs = []
        for e in range(len(w1_e)):
            s, t = bounds[e], bounds[e + 1]
            if s < t:
                a_CH, u_CH = (xs_AD[s:t] @ w1_e[e].t()).chunk(2, dim=-1)
                outs.append((F.silu(a_CH) * u_CH) @ w2_e[e].t())
        out_AD = torch.cat(outs) if outs else xs_AD
        return torch.zeros_like(x_TD).index_add_(0, tok_A, out_AD * gates_TK.reshape(-1)[order_A][:, None])


class MoELayer(nn.Module):
    """y = shared(x) + sum over the routed top-k of gate * expert(x)."""

    def __init__(self, cfg: MoHGEConfig) -> None:
        super().__init__()
        self.router = GroupedRouter(cfg) if cfg.ffn_kind == "mohge" else TopKRouter(cfg)
        self.experts = RoutedExperts(cfg)
        width = cfg.shared_expert_width
        self.shared = SwiGLU(cfg.hidden_size, width) if width else None

    def forward(self, x_BSD: Tensor) -> Tensor:
        B, S, D = x_BSD.shape
        x_TD = x_BSD.reshape(B * S, D)
        idx_TK, gates_TK = self.router(x_TD)
        y_TD = self.experts(x_TD, idx_TK, gates_TK)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)
        return y_TD.view(B, S, D)


class Block(nn.Module):
    def __init__(self, cfg: MoHGEConfig, layer_idx: int, moe: bool) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = (LatentAttention if cfg.attention == "mla" else Attention)(cfg, layer_idx)
        self.ffn_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.ffn = MoELayer(cfg) if moe else SwiGLU(cfg.hidden_size, cfg.dense_width)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: Cache | None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache)
        return x + self.ffn(self.ffn_norm(x))


class MoHGEPreTrainedModel(PreTrainedModel):
    config_class = MoHGEConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range) weights and unit norms (only weights missing from a checkpoint)."""
        from transformers import initialization as init

        std = self.config.initializer_range
        if isinstance(module, nn.Linear | nn.Embedding):
            init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, SwiGLU | RoutedExperts):
            for p in module.parameters():  # RoutedExperts: the tensors of its two ParameterLists
                init.normal_(p, 0.0, std)


class MoHGEModel(MoHGEPreTrainedModel):
    """Embedding, blocks and the final norm: hidden states [B, S, D]."""

    def __init__(self, config: MoHGEConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        dense_first = config.num_hidden_layers if config.ffn_kind == "dense" else config.dense_layers
        self.blocks = nn.ModuleList(Block(config, i, moe=i >= dense_first) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def forward(
        self,
        input_ids_BS: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
    ) -> Tensor:
        B, S = input_ids_BS.shape
        past = cache.get_seq_length() if cache is not None else 0
        device = input_ids_BS.device
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(
                f"attention_mask must be [batch, length] (1 = token, 0 = padding), got {attention_mask.dim()}-d"
            )
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # nothing padded: the same computation as without a mask
        if position_ids is None:
            if attention_mask is not None:  # left padding: count real tokens only
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -S:]
            else:
                position_ids = torch.arange(past, past + S, device=device)[None].expand(B, S)
        mask = None
        if attention_mask is not None or past:
            q_pos_S1 = torch.arange(past, past + S, device=device)[:, None]
            k_pos_1L = torch.arange(past + S, device=device)[None]
            mask = k_pos_1L <= q_pos_S1  # [S, L] causal over cached + new positions
            if attention_mask is not None:  # hide padded keys, but every query keeps itself
                mask = mask & (attention_mask.bool()[:, None, :] | (k_pos_1L == q_pos_S1))  # [B, S, L]
                mask = mask[:, None]
        attn0 = self.blocks[0].attn
        cos, sin = rope_cos_sin(position_ids, attn0.rope_dim, attn0.rope_base)
        x = self.embed(input_ids_BS)
        for block in self.blocks:
            x = block(x, cos, sin, mask, cache)
        return self.norm(x)


class MoHGEForCausalLM(MoHGEPreTrainedModel, GenerationMixin):
    def __init__(self, config: MoHGEConfig) -> None:
        super().__init__(config)
        self.model = MoHGEModel(config)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> nn.Linear | None:
        return self.lm_head

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        labels: Tensor | None = None,
        logits_to_keep: int = 0,
        **_unused,
    ) -> CausalLMOutputWithPast:
        """Logits [B, S, V] (only the last ``logits_to_keep`` positions when > 0); a cache is made when
        ``use_cache`` is True and none is given; ``labels`` give the mean next-token loss (-100 ignored)."""
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = DynamicCache(config=self.config)
        h = self.model(input_ids, attention_mask, position_ids, cache)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = F.linear(h, self.model.embed.weight) if self.lm_head is None else self.lm_head(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten().to(logits.device), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
