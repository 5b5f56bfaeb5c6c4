"""The auxiliary losses (docs/method.md §5): L_G, L_E in both modes, the schedule, the weighting, gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import RELEASE, release_router

from mohge.config import LossConfig
from mohge.model.losses import (
    group_aux_active,
    group_aux_loss,
    group_cost_weights,
    intra_group_aux_loss,
    switch_aux_loss,
    weighted_aux,
)


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


def test_group_aux_gradient_flows_through_softmax_to_group_router():
    router = release_router()
    r = router(torch.randn(256, 64))
    omega = torch.ones(8)
    group_aux_loss(r.group_logits_TG, r.group_map_TG, omega, 4).backward()
    assert router.group_router.weight.grad.abs().sum() > 0
    assert router.expert_router.weight.grad is None


def test_cost_weights_override_and_minimum():
    given = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    assert group_cost_weights(RELEASE, LossConfig(group_cost_weights=given)) == list(given)
    relative = group_cost_weights(RELEASE, LossConfig(group_cost_interval=384, group_cost_min=0))
    assert relative == pytest.approx([h / 384 + 1 for h in RELEASE.expert_widths])


def test_switch_loss_is_one_when_balanced_and_size_weights_scale_terms():
    T, E, K = 32, 8, 2
    probs = torch.full((T, E), 1 / E)
    counts = torch.full((E,), T * K // E)
    assert switch_aux_loss(probs, counts, K).item() == pytest.approx(1.0)
    size = torch.tensor([0.5, 0.5, 1, 1, 1, 1, 1.5, 1.5])  # h_e / mean(h): HMoE's size-weighted reading
    assert switch_aux_loss(probs, counts, K, size).item() == pytest.approx(1.0)
    skewed = torch.tensor([8, 8, 8, 8, 8, 8, 8, 8]) * torch.tensor([2, 2, 1, 1, 1, 1, 0, 0])
    assert switch_aux_loss(probs, skewed, K, size).item() < switch_aux_loss(probs, skewed.flip(0), K, size).item()


def test_weighted_aux_coefficients_and_unknown_names():
    lc = LossConfig(expert_aux_coeff=0.1, hmoe_penalty_coeff=0.2, group_aux_coeff=0.0)
    aux = {"hmoe_penalty": torch.tensor(3.0), "expert_aux": torch.tensor(1.0), "group_aux": torch.tensor(5.0)}
    assert weighted_aux(aux, lc, 99, 100).item() == pytest.approx(0.2 * 3 + 0.1)  # alpha_G = 0: L_G never counts
    with pytest.raises(KeyError, match="z_loss"):
        weighted_aux({"z_loss": torch.tensor(1.0)}, lc, 0, 10)
