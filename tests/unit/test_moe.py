"""The MoE layer (docs/method.md §1.3): equivalences with the dense FFN and with the homogeneous MoE."""

from __future__ import annotations

import torch

from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.model.experts import SwiGLU
from mohge.model.moe import MoELayer


def test_one_group_of_one_expert_equals_dense_ffn():
    ffn = FFNConfig(
        kind="mohge", num_experts=1, expert_widths=(24,), shared_expert_width=0, placement="contiguous", backend="torch"
    )
    for mode in ("code_exact", "product_renorm"):
        layer = MoELayer(16, ffn, RouterConfig(topk=1, group_topk=1, gate_mode=mode), LossConfig(), 0.1, 0.1)
        dense = SwiGLU(16, 24, 0.1, 0.1)
        with torch.no_grad():
            dense.w1.copy_(layer.experts.w1[0][0])
            dense.w2.copy_(layer.experts.w2[0][0])
        x = torch.randn(2, 5, 16)
        y, _ = layer(x)
        torch.testing.assert_close(y, dense(x))


def test_one_group_equal_widths_equals_homogeneous_moe_under_product_renorm():
    router = RouterConfig(topk=2, group_topk=1, gate_mode="product_renorm", init_std=0.3)
    common = {"num_experts": 6, "expert_widths": (20,), "shared_expert_width": 12, "placement": "contiguous"}
    mohge = MoELayer(16, FFNConfig(kind="mohge", **common), router, LossConfig(), 0.1, 0.1)
    moe = MoELayer(16, FFNConfig(kind="moe", **common), router, LossConfig(), 0.1, 0.1)
    with torch.no_grad():
        moe.router.router.weight.copy_(mohge.router.expert_router.weight)
        for a, b in zip(moe.parameters(), mohge.parameters(), strict=False):
            if a.shape == b.shape and a is not moe.router.router.weight:
                a.copy_(b)
        moe.experts.load_state_dict(mohge.experts.state_dict())
        moe.shared.load_state_dict(mohge.shared.state_dict())
    x = torch.randn(3, 7, 16)
    y_mohge, s1 = mohge(x)
    y_moe, s2 = moe(x)
    torch.testing.assert_close(y_mohge, y_moe)
    assert torch.equal(s1.counts_E, s2.counts_E)
