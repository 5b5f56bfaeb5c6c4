"""The export's expert weights as a serving engine's fused-MoE kernels read them: one homogeneous call per group.

vLLM's and SGLang's fused-MoE kernels take experts of one width: ``w13`` [E, 2F, D] (gate rows, then up rows) and
``w2`` [E, D, F], with ``topk_ids`` / ``topk_weights`` [T, K] and an ``expert_map`` that sends an expert id this
call does not hold to -1 (its slot adds nothing). A MoHGE layer is G such calls, one per width group, over the
same routing, summed (docs/serving.md). The export (``mohge export``) already stores each group so:
``model.blocks.{i}.ffn.experts.w1.{g}`` [n, 2 h_g, D] and ``...w2.{g}`` [n, D, h_g] (n experts per group).

:func:`group_weights` re-reads an export group by group in that layout (no model built), :func:`fused_moe_call`
is the plain-torch meaning of one fused-MoE call, and :func:`grouped_fused_moe` the G calls of a MoHGE layer.
Legend: T tokens, D model width, K top-k, E experts, G groups, n experts per group, F one group's width.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

Tensor = torch.Tensor
_W = re.compile(r"^model\.blocks\.(\d+)\.ffn\.experts\.(w1|w2)\.(\d+)$")


def group_weights(export_dir: str | Path) -> dict[int, list[tuple[Tensor, Tensor]]]:
    """Per MoE block index, per group g: (w13 [n, 2 h_g, D], w2 [n, D, h_g]) read from the export's safetensors;
    every shape is checked against its config.json."""
    export_dir = Path(export_dir)
    cfg = json.loads((export_dir / "config.json").read_text())
    widths, D = cfg["expert_widths"], cfg["hidden_size"]
    n = cfg["num_experts"] // len(widths)
    found: dict[int, dict[int, dict[str, Tensor]]] = {}
    with safe_open(export_dir / "model.safetensors", framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is no mapping)
            m = _W.match(key)
            if m:
                found.setdefault(int(m[1]), {}).setdefault(int(m[3]), {})[m[2]] = f.get_tensor(key)
    out = {}
    for block, groups in sorted(found.items()):
        assert sorted(groups) == list(range(len(widths))), f"block {block}: groups {sorted(groups)}"
        out[block] = []
        for g, h in enumerate(widths):
            w13, w2 = groups[g]["w1"], groups[g]["w2"]
            assert w13.shape == (n, 2 * h, D) and w2.shape == (n, D, h), f"block {block} group {g}"
            out[block].append((w13, w2))
    return out


def fused_moe_call(x_TD: Tensor, w13: Tensor, w2: Tensor, weights_TK: Tensor, ids_TK: Tensor) -> Tensor:
    """What one homogeneous fused-MoE kernel computes: sum over slots k with ids_TK >= 0 (local expert id) of
    weights_TK * w2[e] (SiLU(gate_e x) * up_e x), gate_e / up_e the first / second half of w13[e]."""
    y_TD = torch.zeros_like(x_TD)
    F_ = w2.shape[-1]
    for e in range(w13.shape[0]):
        tok, slot = (ids_TK == e).nonzero(as_tuple=True)
        if len(tok):
            a, u = (x_TD[tok] @ w13[e].t()).split(F_, dim=-1)
            y_TD.index_add_(0, tok, ((F.silu(a) * u) @ w2[e].t()) * weights_TK[tok, slot, None])
    return y_TD


def grouped_fused_moe(
    x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, groups: list[tuple[Tensor, Tensor]], n: int
) -> Tensor:
    """A MoHGE layer's routed experts as G fused-MoE calls: call g holds experts g n .. g n + n - 1, its expert map
    sends the others to -1; the outputs add up."""
    y_TD = torch.zeros_like(x_TD)
    for g, (w13, w2) in enumerate(groups):
        local_TK = torch.where((idx_TK // n) == g, idx_TK - g * n, torch.full_like(idx_TK, -1))
        y_TD += fused_moe_call(x_TD, w13, w2, gates_TK.to(x_TD.dtype), local_TK)
    return y_TD
