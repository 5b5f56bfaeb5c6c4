"""The experts (docs/method.md §1.2): the one 3*D*h formula matches the modules that train."""

from __future__ import annotations

import torch

from mohge.config.sizes import swiglu_params
from mohge.model.experts import RoutedExperts, SwiGLU


def test_swiglu_params_counts_the_modules():
    dense = SwiGLU(48, 20, 0.02, 0.02)
    assert sum(p.numel() for p in dense.parameters()) == swiglu_params(48, 20) == 3 * 48 * 20
    bank = RoutedExperts(48, (16, 24, 40), 3, 0.02, 0.02, "torch")
    assert sum(p.numel() for p in bank.parameters()) == sum(3 * swiglu_params(48, h) for h in (16, 24, 40))
    assert bank.num_experts == 9


def test_routed_experts_weight_every_slot_by_its_gate():
    bank = RoutedExperts(8, (4, 6), 1, 0.5, 0.5, "torch")
    x = torch.randn(5, 8)
    idx = torch.tensor([[0, 1]] * 5)
    one = bank(x, idx, torch.tensor([[1.0, 0.0]] * 5))
    two = bank(x, idx, torch.tensor([[0.0, 1.0]] * 5))
    both = bank(x, idx, torch.tensor([[0.25, 0.75]] * 5))
    torch.testing.assert_close(both, 0.25 * one + 0.75 * two)
