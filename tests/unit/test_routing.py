"""The two-level router and its losses against docs/method.md §2 (steps G1-E6) and its invariants."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model_config

from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.losses import group_aux_active, group_aux_loss, group_cost_weights, intra_group_aux_loss, weighted_aux
from mohge.routing import GroupedRouter, TopKRouter

RELEASE = FFNConfig(kind="mohge", num_experts=64, expert_widths=(384, 512, 640, 768, 896, 1024, 1152, 1280))


def release_router(gate_mode="code_exact", d=64, std=0.5) -> GroupedRouter:
    return GroupedRouter(d, RELEASE, RouterConfig(topk=6, group_topk=4, gate_mode=gate_mode, init_std=std))


def test_combined_scores_are_a_distribution_on_selected_groups():  # docs/method.md §2 E4
    router = release_router()
    x = torch.randn(300, 64)
    lG, gmap, c = router.scores(x)
    torch.testing.assert_close(c.sum(-1), torch.ones(300))
    emap = gmap.repeat_interleave(8, dim=1)
    assert torch.all(c[~emap] == 0)
    assert torch.all(gmap.sum(-1) == 4)
    # the selected groups are the top-4 group logits
    assert torch.equal(gmap, torch.zeros_like(gmap).scatter(1, lG.topk(4, dim=-1).indices, True))


def test_selected_experts_lie_in_selected_groups_without_quota():
    router = release_router()
    x = torch.randn(500, 64)
    r = router(x)
    groups_of_selected = r.idx_TK // 8
    assert torch.all(r.group_map_TG.gather(1, groups_of_selected))
    # no per-group quota: some token takes >= 2 experts from one group, and some spread over 4 groups
    per_token_distinct = torch.tensor([len(set(row.tolist())) for row in groups_of_selected])
    assert per_token_distinct.min() < 4 <= per_token_distinct.max()


def test_code_exact_gates_within_exact_bounds():  # docs/method.md §2 E6
    lo, hi = 1 / (5 + math.e), math.e / (5 + math.e)
    assert (round(lo, 5), round(hi, 5)) == (0.12956, 0.35219)
    r = release_router(std=3.0)(torch.randn(1000, 64) * 5)
    assert r.gates_TK.min() >= lo - 1e-6 and r.gates_TK.max() <= hi + 1e-6
    torch.testing.assert_close(r.gates_TK.sum(-1), torch.ones(1000))


def test_code_exact_reaches_both_bounds_on_one_hot_routing():
    router = release_router()
    with torch.no_grad():
        router.group_router.weight.zero_()
        router.expert_router.weight.zero_()
        x = torch.zeros(1, 64)
        x[0, 0] = 1.0
        # group 3 wins its sigmoid by far; the other top-4 groups are near 0; one expert of group 3 wins
        router.group_router.weight[:, 0] = torch.tensor([-40.0, -41, -42, 40, -43, -44, -45, -46])
        router.expert_router.weight[3 * 8 + 5, 0] = 60.0
    r = router(x)
    assert r.idx_TK[0, 0].item() == 29
    torch.testing.assert_close(r.gates_TK[0, 0], torch.tensor(math.e / (5 + math.e)))
    torch.testing.assert_close(r.gates_TK[0, 1:], torch.full((5,), 1 / (5 + math.e)))


def test_product_renorm_is_renormalized_combined_score():
    router = release_router("product_renorm")
    x = torch.randn(50, 64)
    _, _, c = router.scores(x)
    r = router(x)
    top = c.gather(1, r.idx_TK)
    torch.testing.assert_close(r.gates_TK, top / top.sum(-1, keepdim=True))
    assert torch.equal(r.idx_TK.sort(-1).values, c.topk(6, dim=-1).indices.sort(-1).values)


def test_group_loss_uniform_softmax_balanced_selection():  # docs/method.md §5.1 (the check)
    G, Kg, T = 8, 4, 64
    omega = torch.tensor(group_cost_weights(RELEASE, LossConfig()))
    torch.testing.assert_close(omega, torch.tensor([1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875]))
    # cyclically shifted logits of tiny spread: softmax ~ uniform, every group selected equally often
    base = torch.tensor([4.0, 3, 2, 1, -1, -2, -3, -4]) * 1e-7
    logits = torch.stack([base.roll(t % G) for t in range(T)])
    gmap = torch.zeros(T, G, dtype=torch.bool).scatter(1, logits.topk(Kg, -1).indices, True)
    assert torch.all(gmap.sum(0) == T * Kg // G)
    loss = group_aux_loss(logits, gmap, omega, Kg)
    torch.testing.assert_close(loss, omega.mean(), rtol=1e-5, atol=0)
    # the general uniform-softmax identity: L_G = sum_g omega_g f_g / (T Kg)
    skewed = torch.zeros(T, G, dtype=torch.bool)
    skewed[:, :Kg] = True
    torch.testing.assert_close(group_aux_loss(torch.zeros(T, G), skewed, omega, Kg), (omega[:Kg]).sum() / Kg)


def test_group_loss_schedule_switches_at_half():
    assert not group_aux_active(50, 100, 0.5) and group_aux_active(51, 100, 0.5)
    assert not group_aux_active(50, 101, 0.5) and group_aux_active(51, 101, 0.5)
    aux = {"group_aux": torch.tensor(2.0), "expert_aux": torch.tensor(3.0)}
    lc = LossConfig()
    assert weighted_aux(aux, lc, 50, 100).item() == pytest.approx(5e-3 * 3)
    assert weighted_aux(aux, lc, 51, 100).item() == pytest.approx(5e-3 * 3 + 1e-5 * 2)


def test_intra_group_loss_normalizer_and_balance():
    router = release_router()
    r = router(torch.randn(2048, 64))
    loss = intra_group_aux_loss(r, 64, 8, 4, 6)
    w = r.dense_gates(64)
    expected = 32 / (2048**2 * 6) * (w.sum(0) * r.counts(64)).sum()
    torch.testing.assert_close(loss, expected)
    # near-uniform gates and balanced load: L_E ~ N_eff / N = Kg / G = 0.5
    assert loss.item() == pytest.approx(0.5, rel=0.1)
    per_group = intra_group_aux_loss(r, 64, 8, 4, 6, mode="per_group")
    assert per_group.item() == pytest.approx(1.0, rel=0.1)


def test_gradients_reach_both_routers_through_lm_path_alone():
    cfg = tiny_model_config()
    from mohge.moe import MoELayer

    layer = MoELayer(32, cfg.ffn, cfg.router, LossConfig(), 0.02, 0.02)
    y, _ = layer(torch.randn(2, 8, 32))
    y.square().sum().backward()  # no aux loss: gradient reaches W_G through p (docs/method.md §2.3)
    assert layer.router.group_router.weight.grad.abs().sum() > 0
    assert layer.router.expert_router.weight.grad.abs().sum() > 0


def test_group_aux_gradient_flows_through_softmax_to_group_router():
    router = release_router()
    r = router(torch.randn(256, 64))
    omega = torch.ones(8)
    group_aux_loss(r.group_logits_TG, r.group_map_TG, omega, 4).backward()
    assert router.group_router.weight.grad.abs().sum() > 0
    assert router.expert_router.weight.grad is None


def test_flat_router_softmax_over_topk():
    ffn = FFNConfig(kind="moe", num_experts=8, expert_widths=(32,), placement="contiguous")
    router = TopKRouter(16, ffn, RouterConfig(topk=2, init_std=0.5))
    x = torch.randn(10, 16)
    r = router(x)
    probs = torch.softmax(router.router(x), -1)
    top = probs.gather(1, r.idx_TK)
    torch.testing.assert_close(r.gates_TK, top / top.sum(-1, keepdim=True))
