"""The MoE layer (docs/method.md §1.3): equivalences with the dense FFN and with the homogeneous MoE."""

from __future__ import annotations

import pytest
import torch

from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.model.experts import SwiGLU
from mohge.model.moe import MoELayer


def test_one_group_of_one_expert_equals_dense_ffn():
    ffn = FFNConfig(
        kind="mohge", num_experts=1, expert_widths=(24,), shared_expert_width=0, placement="contiguous", backend="torch"
    )
    for mode in ("softmax_topk_probs", "product_renorm"):
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


def test_routing_summary_reports_expert_load_unused_experts_and_per_rank_flops():
    """Known slot counts: an even layer has load 1.0, no unused expert and equal ranks; a skewed layer has load
    max/mean, counts an expert under 1 % of a uniform share as unused (and one at exactly 1 % as used), and its
    per-rank FLOPs weigh each slot by its expert's width."""
    from mohge.model.moe import routing_summary

    widths = [1, 1, 3, 3]  # two groups of two experts
    counts = torch.tensor([[10, 10, 10, 10], [0, 1, 40, 39]])
    out = routing_summary(counts, widths, num_groups=2, topk=2, rank_of_expert=[0, 0, 1, 1])
    assert out["expert_load"] == pytest.approx([1.0, 40 / 20])
    assert out["unused_experts"] == [0, 1]  # 1 slot of 80 is 1.25 % of the uniform share 20: used; 0 is not
    assert [u for layer in out["group_usage"] for u in layer] == pytest.approx([0.5, 0.5, 1 / 80, 79 / 80])
    # ranks: even layer 20 and 60 width-slots (mean 40, max 60); skewed 1 and 237 (mean 119)
    assert out["rank_flops"] == pytest.approx([60 / 40, 237 / 119])
    assert "rank_flops" not in routing_summary(counts, widths, 2, 2)
    at_one_percent = torch.tensor([[1, 99, 100, 200]])  # a uniform share is 100: 1 slot is exactly 1 %
    assert routing_summary(at_one_percent, widths, 2, 2)["unused_experts"] == [0]
