"""The routers against docs/method.md §2: steps G1-E6 and their invariants, gradient flow, the flat router."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import release_router, tiny_model_config

from mohge.config import ConfigError, FFNConfig, LossConfig, RouterConfig
from mohge.model.routing import GroupedRouter, TopKRouter


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


def test_softmax_topk_probs_gates_within_exact_bounds():  # docs/method.md §2 E6
    lo, hi = 1 / (5 + math.e), math.e / (5 + math.e)
    assert (round(lo, 5), round(hi, 5)) == (0.12956, 0.35219)
    r = release_router(std=3.0)(torch.randn(1000, 64) * 5)
    assert r.gates_TK.min() >= lo - 1e-6 and r.gates_TK.max() <= hi + 1e-6
    torch.testing.assert_close(r.gates_TK.sum(-1), torch.ones(1000))


def test_softmax_topk_probs_reaches_both_bounds_on_one_hot_routing():
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


def test_gradients_reach_both_routers_through_lm_path_alone():
    cfg = tiny_model_config()
    from mohge.model.moe import MoELayer

    layer = MoELayer(32, cfg.ffn, cfg.router, LossConfig(), 0.02, 0.02)
    y, _ = layer(torch.randn(2, 8, 32))
    y.square().sum().backward()  # no aux loss: gradient reaches W_G through p (docs/method.md §2.3)
    assert layer.router.group_router.weight.grad.abs().sum() > 0
    assert layer.router.expert_router.weight.grad.abs().sum() > 0


def test_flat_router_softmax_over_topk():
    ffn = FFNConfig(kind="moe", num_experts=8, expert_widths=(32,), placement="contiguous")
    router = TopKRouter(16, ffn, RouterConfig(topk=2, init_std=0.5))
    x = torch.randn(10, 16)
    r = router(x)
    probs = torch.softmax(router.router(x), -1)
    top = probs.gather(1, r.idx_TK)
    torch.testing.assert_close(r.gates_TK, top / top.sum(-1, keepdim=True))


def test_flat_router_probs_gate_is_a_softmax_over_the_topk_probabilities():  # docs/method.md §2.4, router.flat_gate
    ffn = FFNConfig(kind="moe", num_experts=8, expert_widths=(32,), placement="contiguous")
    logits_gate = TopKRouter(16, ffn, RouterConfig(topk=4, init_std=0.5))
    probs_gate = TopKRouter(16, ffn, RouterConfig(topk=4, init_std=0.5, flat_gate="probs"))
    probs_gate.load_state_dict(logits_gate.state_dict())
    x = torch.randn(200, 16)
    a, b = logits_gate(x), probs_gate(x)
    assert torch.equal(a.idx_TK, b.idx_TK)  # the same experts, other gates
    top = torch.softmax(probs_gate.router(x), -1).gather(1, b.idx_TK)
    torch.testing.assert_close(b.gates_TK, torch.softmax(top, -1))
    e = math.e
    assert b.gates_TK.min() >= 1 / (4 - 1 + e) - 1e-6 and b.gates_TK.max() <= e / (4 - 1 + e) + 1e-6  # nearly uniform
    assert (a.gates_TK - b.gates_TK).abs().max() > 0.05
    b.gates_TK[:, 0].sum().backward()  # the gate is differentiable in the router weights
    assert probs_gate.router.weight.grad.abs().sum() > 0


def biased_router(rate: float = 1e-2, group_rate: float = 0.0):
    torch.manual_seed(0)
    return GroupedRouter(
        64,
        FFNConfig(kind="mohge", num_experts=16, expert_widths=(16, 24, 32, 40)),
        RouterConfig(topk=3, group_topk=2, expert_bias_rate=rate, group_bias_rate=group_rate),
    )


@pytest.mark.parametrize(("rates", "buffer"), [((1e-2, 0.0), "expert_bias_E"), ((0.0, 1e-2), "group_bias_G")])
def test_a_zero_selection_bias_routes_as_no_bias(rates, buffer):  # docs/method.md §5.6-5.7
    biased, plain = biased_router(*rates), biased_router(0.0)
    plain.load_state_dict({k: v for k, v in biased.state_dict().items() if k != buffer})
    x = torch.randn(200, 64)
    a, b = biased(x), plain(x)
    assert torch.equal(a.idx_TK, b.idx_TK) and torch.equal(a.gates_TK, b.gates_TK)


def test_the_selection_bias_moves_selection_within_groups_and_never_a_gate():
    router = biased_router()
    x = torch.randn(400, 64)
    before = router(x)
    router.expert_bias_E[0::4] = 0.5  # favour the first expert of each group
    after = router(x)
    _, gmap, c = router.scores(x)
    assert not torch.equal(before.idx_TK, after.idx_TK)
    assert torch.equal(before.group_map_TG, after.group_map_TG)  # groups are chosen without the bias
    # the gates are E6 of the *unbiased* scores of the experts the bias selected
    torch.testing.assert_close(after.gates_TK, torch.softmax(c.gather(1, after.idx_TK), dim=-1))
    assert (after.idx_TK % 4 == 0).float().mean() > (before.idx_TK % 4 == 0).float().mean()


def test_the_bias_update_moves_each_expert_toward_its_group_mean():
    router = biased_router(0.01)
    counts = torch.tensor([4, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0, 8, 3, 3, 3, 3])
    router.update_selection_bias(counts)
    want = 0.01 * torch.tensor([-1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, -1, 0, 0, 0, 0], dtype=torch.float32)
    torch.testing.assert_close(router.expert_bias_E, want)


def test_a_selection_bias_outside_mohge_is_refused():
    moe = FFNConfig(kind="moe", num_experts=8, expert_widths=(32,), placement="contiguous")
    with pytest.raises(ConfigError, match="router.expert_bias_rate"):
        RouterConfig(topk=2, expert_bias_rate=1e-3, _path="router").check_against(moe)
    with pytest.raises(ConfigError, match="router.group_bias_rate"):
        RouterConfig(topk=2, group_bias_rate=1e-3, _path="router").check_against(moe)


def group_biased_router(group_rate: float = 1e-2, expert_rate: float = 0.0):
    return biased_router(expert_rate, group_rate)


def test_the_group_bias_moves_group_selection_and_never_a_weight():
    router = group_biased_router()
    x = torch.randn(400, 64)
    before = router(x)
    router.group_bias_G[3] = 5.0  # every token selects group 3
    after = router(x)
    assert before.group_map_TG[:, 3].float().mean() < 1 and bool(after.group_map_TG[:, 3].all())
    assert torch.equal(before.group_logits_TG, after.group_logits_TG)  # L_G reads the unbiased logits
    # the group weights are G2-G4 of the unbiased logits of the groups the bias selected
    lG = router.group_router(x)
    gidx = after.group_map_TG.nonzero()[:, 1].view(400, 2)
    s = torch.sigmoid(lG.gather(1, gidx))
    p = torch.zeros(400, 4).scatter(1, gidx, s / s.sum(-1, keepdim=True))
    q = torch.softmax(router.expert_router(x).view(400, 4, 4), -1)
    c = (q * p[:, :, None]).reshape(400, 16)
    c = c / c.sum(-1, keepdim=True)
    torch.testing.assert_close(after.gates_TK, torch.softmax(c.gather(1, after.idx_TK), -1))


def test_the_group_bias_update_moves_each_group_toward_the_mean_of_routed_slots():
    router = group_biased_router(0.01, expert_rate=0.02)
    counts = torch.tensor([4, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 3, 3, 3, 3])  # group slots 8, 4, 0, 12: mean 6
    router.update_selection_bias(counts)
    torch.testing.assert_close(router.group_bias_G, 0.01 * torch.tensor([-1.0, 1.0, 1.0, -1.0]))
    want_E = 0.02 * torch.tensor([-1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.float32)
    torch.testing.assert_close(router.expert_bias_E, want_E)  # both biases move in one update
