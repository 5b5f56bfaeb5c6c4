"""What a token costs as routed: the matmul parameters it activates and its forward FLOPs, from the experts its
routers select (``mohge bench inference`` per token, ``mohge evaluate --route-override`` as a mean over the
validation split).

Forward FLOPs of a token at position t (0-based) of its window (PaLM's accounting, as
:mod:`mohge.train.distributed.flops` for training, forward only and causal):

    2 * N_t + 2 * L * H * (d_qk + d_v) * (t + 1)

N_t is the matmul parameters the token activates: every non-routed matmul weight (attention, routers, shared and
dense FFNs, the LM head; the input embedding is a lookup) plus, per MoE layer, 3 * D * h_e for each of the K
experts e it was routed to (:func:`mohge.config.sizes.swiglu_params`). Legend: B batch, S sequence, T tokens,
K top-k, L layers, E experts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from mohge.config import ModelConfig
from mohge.config.sizes import attention_dims, count_params, swiglu_params


@contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Yield a list that collects, per router call in depth order, the selected experts idx_TK (int64 [T, K]);
    works on mohge's model (a router returns ``Routing``) and on the export (it returns ``(idx, gates)``)."""
    calls: list[torch.Tensor] = []
    routers = [m for m in model.modules() if type(m).__name__ in ("GroupedRouter", "TopKRouter")]

    def hook(_mod, _inp, out):
        calls.append((out.idx_TK if hasattr(out, "idx_TK") else out[0]).detach().cpu())

    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def fixed_matmul_params(cfg: ModelConfig) -> int:
    """Matmul weights every token uses whatever its route: all activated parameters but the routed experts and the
    input-embedding lookup (the tied embedding is the LM head's matmul)."""
    p = count_params(cfg)
    n = p["activated_sum"] - p["activated"]["routed_experts"] - p["activated"]["embeddings"]
    return n + (p["activated"]["embeddings"] if cfg.tie_embeddings else 0)


def token_cost(cfg: ModelConfig, idx_per_layer: Sequence[torch.Tensor], pos_T: torch.Tensor) -> dict[str, np.ndarray]:
    """Per token: ``params`` N_t and forward ``flops`` (module docstring) from the routing of each MoE layer
    (idx_TK, router order) and the token's position in its window."""
    widths_E = torch.tensor(cfg.ffn.per_expert_widths if idx_per_layer else (), dtype=torch.float64)
    routed_T = torch.zeros(len(pos_T), dtype=torch.float64)
    for idx_TK in idx_per_layer:
        routed_T += swiglu_params(cfg.d_model, widths_E[idx_TK].sum(1))
    params_T = fixed_matmul_params(cfg) + routed_T
    d_qk, d_v = attention_dims(cfg)
    attn_T = 2.0 * cfg.n_layers * cfg.n_heads * (d_qk + d_v) * (pos_T.double() + 1)
    return {"params": params_T.numpy(), "flops": (2.0 * params_T + attn_T).numpy()}


@contextmanager
def mean_cost(model: torch.nn.Module, cfg: ModelConfig) -> Iterator[dict[str, float]]:
    """Yield a dict that holds, once the block ends, the mean ``params_per_token`` and ``flops_per_token`` (forward)
    over every token of the forward passes of ``model`` (its input x_BS: windows from position 0) inside the block,
    as routed, and their count ``tokens``. Sums per pass, so memory does not grow with the passes."""
    sums = {"params": 0.0, "flops": 0.0, "tokens": 0}
    shape: list[torch.Size] = []

    def before(_mod, args):
        shape[:] = [args[0].shape]
        calls.clear()

    def after(_mod, _args, _out):
        B, S = shape[0]
        cost = token_cost(cfg, calls, torch.arange(S).repeat(B))
        sums["params"] += float(cost["params"].sum())
        sums["flops"] += float(cost["flops"].sum())
        sums["tokens"] += B * S

    result: dict[str, float] = {}
    with record_routing(model) as calls:
        handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
        try:
            yield result
        finally:
            for h in handles:
                h.remove()
    n = max(sums["tokens"], 1)
    result.update(params_per_token=sums["params"] / n, flops_per_token=sums["flops"] / n, tokens=sums["tokens"])
