"""Parameter counts by component, total and activated per token under a routing histogram, without building the
model; and the attention's head dims.

The totals are closed forms of the modules :mod:`mohge.model` builds (embedding, RMSNorms, multi-head or latent
attention, SwiGLU dense FFNs, routers, routed and shared SwiGLU experts, the LM head unless tied). The reference is the
model itself: :func:`mohge.model.params.meta_totals` instantiates it on the ``meta`` device and classifies every
parameter by its module path, and tests/unit/test_sizes.py checks the two agree, component by component, for every run
of every committed config, the release's presets and the options a config may set. Activated parameters count the
experts a token reaches: for each MoE layer, K x sum_e share_e x 3*D*h_e (:func:`swiglu_params`), where share_e is the
fraction of routed slots that expert e receives (uniform: 1/E each; or a histogram measured from a routing trace);
docs/method.md §9. :func:`moe_layer_cost` gives the same counts, and the FLOPs per token, for one MoE layer
(``MoELayer.cost_per_token``, docs/api.md). Torch is not imported: the workflow sizes its jobs while it plans, and
`mohge params` (:mod:`mohge_studies.config.param_report`) answers in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Sequence

from mohge.core.knobs import ConfigError

from .sections import FFNConfig, ModelConfig

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


def swiglu_params(d_model: int, width: int | float) -> int | float:
    """Parameters of one bias-free SwiGLU of intermediate width ``width``: W1 (2h x D) + W2 (D x h) = 3 D h (the one
    place that formula lives: parameter counts, collection and the utilization study import it).

    Also FLOPs per token divided by 2 (a forward pass does one multiply-add per parameter). ``width`` may be a
    mean width (a float), which gives the mean parameters of a routed slot.
    """
    return 3 * d_model * width


def attention_params(cfg: ModelConfig) -> tuple[int, int]:
    """(projection parameters, norm parameters) of one attention block."""
    D, H = cfg.d_model, cfg.n_heads
    if cfg.attention != "mla":
        return 3 * D * D + D * D, 0
    dn, dr, dv, rank = cfg.mla_q_head_dim, cfg.mla_rope_head_dim, cfg.mla_v_head_dim, cfg.mla_kv_lora_rank
    proj = D * H * (dn + dr) + D * (rank + dr) + rank * H * (dn + dv) + H * dv * D
    return proj, rank  # the latent's RMSNorm


def router_rows(ffn: FFNConfig) -> int:
    """Rows of one MoE layer's router weights: one per expert, and for MoHGE one per group too (its group router)."""
    return ffn.num_experts + (ffn.num_groups if ffn.kind == "mohge" else 0)


def mean_routed_width(widths_E: Sequence[int], slots_E: Sequence[float] | None, what: str) -> float:
    """The mean width of one routed slot: sum_e share_e * h_e, share_e = slots_e / sum(slots) (uniform: None).
    ``what`` names ``slots_E`` in the ConfigError of a row of the wrong length or without a positive sum."""
    row = [1.0] * len(widths_E) if slots_E is None else list(slots_E)
    if len(row) != len(widths_E):
        raise ConfigError(f"{what} has {len(row)} entries; the model has {len(widths_E)} experts")
    s = sum(row)
    if s <= 0:
        raise ConfigError(f"{what} sums to {s}; it needs positive counts")
    return sum(c / s * h for c, h in zip(row, widths_E, strict=True))


def param_totals(cfg: ModelConfig) -> dict[str, int]:
    """Total parameters by component (:data:`COMPONENTS`)."""
    D, L, ffn = cfg.d_model, cfg.n_layers, cfg.ffn
    n_moe = cfg.moe_layers
    attn, attn_norm = attention_params(cfg)
    out = dict.fromkeys(COMPONENTS, 0)
    out["embeddings"] = cfg.vocab_size * D
    out["lm_head"] = 0 if cfg.tie_embeddings else cfg.vocab_size * D
    out["attention"] = L * attn
    out["norms"] = L * (2 * D + attn_norm) + D
    out["dense_ffn"] = (L - n_moe) * swiglu_params(D, ffn.dense_width)
    if n_moe:
        out["routers"] = n_moe * router_rows(ffn) * D
        out["routed_experts"] = n_moe * sum(swiglu_params(D, h) for h in ffn.per_expert_widths)
        out["shared_experts"] = n_moe * swiglu_params(D, ffn.shared_expert_width)
    return out


def total_params(cfg: ModelConfig) -> int:
    """Every parameter of the model."""
    return sum(param_totals(cfg).values())


def count_params(cfg: ModelConfig, histogram: Sequence[Sequence[float]] | None = None) -> dict:
    """Total and activated parameters by component.

    ``histogram``: per MoE layer, tokens (or any weights) per expert in router order; None = uniform.
    A single row is applied to every MoE layer.
    """
    total = param_totals(cfg)
    activated = dict(total)
    activated["routed_experts"] = 0
    n_moe = cfg.moe_layers
    D, K = cfg.d_model, cfg.router.topk
    widths_E = cfg.ffn.per_expert_widths if n_moe else ()
    if histogram is not None and len(histogram) not in (1, n_moe):
        raise ConfigError(f"histogram has {len(histogram)} rows; need 1 or one per MoE layer ({n_moe})")
    mean_width = []
    for i in range(n_moe):
        row = None if histogram is None else histogram[0 if len(histogram) == 1 else i]
        w = mean_routed_width(widths_E, row, f"histogram row {i}")
        mean_width.append(w)
        activated["routed_experts"] += round(K * swiglu_params(D, w))
    # "non-embedding" leaves out the input embedding and the LM head, as docs/method.md §9 does
    emb = total["embeddings"] + total["lm_head"]
    return {
        "total": total,
        "activated": activated,
        "total_sum": sum(total.values()),
        "activated_sum": sum(activated.values()),
        "total_non_embedding": sum(total.values()) - emb,
        "activated_non_embedding": sum(activated.values()) - emb,
        "mean_activated_width": mean_width,
    }


def moe_layer_cost(
    d_model: int, ffn: FFNConfig, topk: int, slots_E: Sequence[float] | None = None
) -> dict[str, int | float]:
    """What one MoE layer costs: ``params``, every parameter of the layer; ``activated_params``, those one token
    runs through (the router, ``topk`` routed slots of the mean width, the shared expert); ``forward_flops`` and
    ``train_flops`` per token, 2 and 6 per activated parameter (a multiply-add each, forward; and the backward's two
    more: the accounting of :func:`mohge.train.distributed.flops.model_flops_per_token`; the softmaxes, the top-k
    and the SiLU are left out). The mean routed width is that of the routed slots per expert ``slots_E`` (router
    order: a layer's ``LayerStats.counts_E``), uniform when None (docs/method.md §9)."""
    widths_E = ffn.per_expert_widths
    routers = router_rows(ffn) * d_model
    routed = sum(swiglu_params(d_model, h) for h in widths_E)
    shared = swiglu_params(d_model, ffn.shared_expert_width)
    width = mean_routed_width(widths_E, slots_E, "slots_E")
    activated = routers + round(topk * swiglu_params(d_model, width)) + shared
    return {
        "params": routers + routed + shared,
        "activated_params": activated,
        "mean_routed_width": width,
        "forward_flops": 2 * activated,
        "train_flops": 6 * activated,
    }
