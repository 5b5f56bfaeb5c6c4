"""Training FLOPs: per token of the model (for MFU and the sizing) and per rank of the routed experts.

Model FLOPs per token, for one forward + backward (PaLM's accounting, appendix B of arXiv 2204.02311):

    6 * N_matmul + 6 * L * S * H * (d_qk + d_v)

N_matmul is the activated parameter count of :func:`mohge.config.sizes.count_params` less the input embedding (a
lookup, no matmul); the routed experts count with their mean activated width under uniform routing. The
second term is the attention scores and the weighted sum over a context of S (no causal halving, as PaLM).

Expert FLOPs of a rank: the rows its local experts processed, 6 * 3 * D * h_e per row of an expert of width h_e
(three D x h matmuls in the SwiGLU, 6 FLOPs per weight per token for forward + backward).
"""

from __future__ import annotations

import torch

from mohge.config import ModelConfig
from mohge.config.sizes import attention_dims, count_params


def model_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) at context ``seq_len``."""
    p = count_params(cfg)
    n_matmul = p["activated_sum"] - p["activated"]["embeddings"]
    if cfg.tie_embeddings:  # the tied embedding is also the LM head's matmul
        n_matmul += p["activated"]["embeddings"]
    d_qk, d_v = attention_dims(cfg)
    return 6.0 * n_matmul + 6.0 * cfg.n_layers * seq_len * cfg.n_heads * (d_qk + d_v)


def expert_flops(rows_E: torch.Tensor, widths_E: torch.Tensor, d_model: int) -> torch.Tensor:
    """Training FLOPs of routed rows: ``rows_E[e]`` rows through an expert of width ``widths_E[e]``."""
    return 18.0 * d_model * (rows_E.double() * widths_E.double()).sum()
