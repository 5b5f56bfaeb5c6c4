"""Hugging Face ``transformers`` configuration of an exported mohge model (``mohge export``).

This file is copied next to the weights of every export and loaded there with ``trust_remote_code=True``: it
imports nothing from mohge. Field names follow ``transformers`` where a standard name exists (``hidden_size``,
``num_hidden_layers``, ...); the rest are the fields of mohge's ``ModelConfig`` / ``FFNConfig`` / ``RouterConfig``
that the forward pass reads (docs/method.md). ``max_position_embeddings`` is the context length the model was
trained at (what lm-eval's HF model reads as its ``max_length``).
"""

from __future__ import annotations

from transformers import PretrainedConfig

# a name an exported config.json may hold -> the name the forward pass reads (mohge.core.vocab.GATE_MODE_ALIASES)
GATE_MODE_ALIASES = {"code_exact": "softmax_topk_probs"}


class MoHGEConfig(PretrainedConfig):
    model_type = "mohge"

    vocab_size: int = 2048
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    max_position_embeddings: int = 256
    rms_norm_eps: float = 1e-6
    rope_base: float = 10000.0
    initializer_range: float = 0.008
    tie_embeddings: bool = False
    tie_word_embeddings: bool = False  # transformers' own tying stays off: tie_embeddings is applied in forward
    attention: str = "mha"  # mha | mla
    mla_q_head_dim: int = 128
    mla_rope_head_dim: int = 64
    mla_v_head_dim: int = 128
    mla_kv_lora_rank: int = 512
    ffn_kind: str = "mohge"  # dense | moe | mohge | hmoe | modse
    dense_layers: int = 1
    dense_width: int = 1024
    num_experts: int = 8
    expert_widths: tuple[int, ...] | list[int] = (256,)
    shared_expert_width: int = 0
    topk: int = 2
    group_topk: int = 1
    group_score: str = "sigmoid"  # sigmoid | softmax
    gate_mode: str = "softmax_topk_probs"  # softmax_topk_probs | product_renorm (GATE_MODE_ALIASES: also accepted)
    flat_gate: str = "logits"  # logits | probs (the flat router of moe, hmoe, modse)
    expert_bias: bool = False  # MoHGE's router selects with a per-expert bias (docs/method.md §5.6)
    group_bias: bool = False  # MoHGE's router selects groups with a per-group bias (docs/method.md §5.7)
    use_cache: bool = True
    bos_token_id: int | None = 0
    eos_token_id: int | None = 0
    pad_token_id: int | None = 0

    def __post_init__(self, **kwargs):
        self.gate_mode = GATE_MODE_ALIASES.get(self.gate_mode, self.gate_mode)  # the forward reads only the names
        super().__post_init__(**kwargs)

    @property
    def num_groups(self) -> int:
        return len(self.expert_widths)

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.num_groups
