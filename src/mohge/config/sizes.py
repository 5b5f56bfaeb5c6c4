"""Sizes of a model config without building the model: parameters by component and the attention's head dims.

The counts are closed forms of the modules :mod:`mohge.model` builds (embedding, RMSNorms, multi-head or latent
attention, SwiGLU dense FFNs, routers, routed and shared SwiGLU experts, the LM head unless tied); the meta-device
count of :func:`mohge.model.params.count_params` is the reference, and tests/unit/test_sizes.py checks the two agree
for every run of every committed config and for the release's presets. Torch is not imported: the workflow sizes
its jobs' memory from these counts while it plans (a dry run of a DAG stays a second of Python, not a torch start).
"""

from __future__ import annotations

from .sections import ModelConfig

COMPONENTS = (
    "embeddings",
    "lm_head",
    "attention",
    "norms",
    "routers",
    "routed_experts",
    "shared_experts",
    "dense_ffn",
)


def attention_dims(cfg: ModelConfig) -> tuple[int, int]:
    """(d_qk, d_v) of one head."""
    if cfg.attention == "mla":
        return cfg.mla_q_head_dim + cfg.mla_rope_head_dim, cfg.mla_v_head_dim
    dh = cfg.d_model // cfg.n_heads
    return dh, dh


def swiglu_params(d_model: int, width: int) -> int:
    """A SwiGLU of hidden width ``width``: gate and up [2H, D], down [D, H]."""
    return 3 * d_model * width


def attention_params(cfg: ModelConfig) -> tuple[int, int]:
    """(projection parameters, norm parameters) of one attention block."""
    D, H = cfg.d_model, cfg.n_heads
    if cfg.attention != "mla":
        return 3 * D * D + D * D, 0
    dn, dr, dv, rank = cfg.mla_q_head_dim, cfg.mla_rope_head_dim, cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
    proj = D * H * (dn + dr) + D * (rank + dr) + rank * H * (dn + dv) + H * dv * D
    return proj, rank  # the latent's RMSNorm


def moe_layers(cfg: ModelConfig) -> int:
    """Decoder layers with routed experts (the rest have a dense FFN)."""
    return 0 if cfg.ffn.kind == "dense" else max(cfg.n_layers - cfg.ffn.dense_layers, 0)


def param_totals(cfg: ModelConfig) -> dict[str, int]:
    """Total parameters by component (the components of :func:`mohge.model.params.count_params`)."""
    D, L, ffn = cfg.d_model, cfg.n_layers, cfg.ffn
    n_moe = moe_layers(cfg)
    attn, attn_norm = attention_params(cfg)
    out = dict.fromkeys(COMPONENTS, 0)
    out["embeddings"] = cfg.vocab_size * D
    out["lm_head"] = 0 if cfg.tie_embeddings else cfg.vocab_size * D
    out["attention"] = L * attn
    out["norms"] = L * (2 * D + attn_norm) + D
    out["dense_ffn"] = (L - n_moe) * swiglu_params(D, ffn.dense_width)
    if n_moe:
        rows = ffn.num_experts + (ffn.num_groups if ffn.kind == "mohge" else 0)  # MoHGE: a group router too
        out["routers"] = n_moe * rows * D
        out["routed_experts"] = n_moe * sum(swiglu_params(D, h) for h in ffn.per_expert_widths)
        out["shared_experts"] = n_moe * swiglu_params(D, ffn.shared_expert_width)
    return out


def total_params(cfg: ModelConfig) -> int:
    """Every parameter of the model."""
    return sum(param_totals(cfg).values())
