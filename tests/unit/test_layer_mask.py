"""Padding and empty batches in the MoE layer: a masked token is routed nowhere and counted nowhere, so the layer
with a mask is the layer on the real tokens alone (outputs, raw aux losses, counts); an empty batch gives an empty
output, zero losses and zero counts."""

from __future__ import annotations

import pytest
import torch

from mohge import MoHGELayer
from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.model.moe import MoELayer

D = 32


def mohge_layer(loss: LossConfig | None = None, **router) -> MoELayer:
    ffn = FFNConfig(kind="mohge", num_experts=8, expert_widths=(16, 24, 40, 48), shared_expert_width=24,
                    placement="contiguous", backend="torch")  # fmt: skip
    router_cfg = RouterConfig(**{"topk": 3, "group_topk": 2, "init_std": 0.3, **router})
    return MoELayer(D, ffn, router_cfg, loss or LossConfig(), 0.1, 0.1)


def flat_layer(kind: str) -> MoELayer:
    widths = {"moe": (24,), "hmoe": (16, 48), "modse": (16, 24, 40, 48)}[kind]
    ffn = FFNConfig(kind=kind, num_experts=8, expert_widths=widths, shared_expert_width=0, placement="contiguous",
                    backend="torch")  # fmt: skip
    return MoELayer(D, ffn, RouterConfig(topk=2, init_std=0.3), LossConfig(), 0.1, 0.1)


def biased_mohge_layer() -> MoELayer:
    """A MoHGE layer with both selection biases (docs/method.md §5.6, §5.7) set far from 0, so they move routing."""
    layer = mohge_layer(expert_bias_rate=0.01, group_bias_rate=0.01)
    g = torch.Generator().manual_seed(5)
    layer.router.expert_bias_E.copy_(torch.randn(8, generator=g) * 0.3)
    layer.router.group_bias_G.copy_(torch.randn(4, generator=g))
    return layer


LAYERS = {
    "mohge": mohge_layer,
    "mohge_per_group": lambda: mohge_layer(LossConfig(expert_aux_mode="per_group")),
    "mohge_biased": biased_mohge_layer,
    "moe": lambda: flat_layer("moe"),
    "hmoe": lambda: flat_layer("hmoe"),
    "modse": lambda: flat_layer("modse"),
}


def build(name: str) -> MoELayer:
    torch.manual_seed(0)
    return LAYERS[name]().train()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """x [3, 7, D] and a mask of real tokens: right-padded, left-padded, and a row with a hole."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, D, generator=g)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1, 0]], dtype=torch.bool
    )  # fmt: skip
    return x, mask


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_layer_with_a_mask_equals_the_layer_on_the_real_tokens_alone(name):
    """y[mask], every raw aux loss (group-wise, intra-group in both modes, Switch, HMoE penalty), the expert and
    group counts, and the gradients of every parameter equal those of the same layer run on x[mask] only; a masked
    token's output is 0."""
    x, mask = padded_batch()
    layer = build(name)
    y, stats = layer(x, mask)
    y_ref, ref = layer(x[mask][None])
    assert torch.equal(y[mask], y_ref[0])
    assert torch.equal(y[~mask], torch.zeros_like(y[~mask]))
    assert stats.aux.keys() == ref.aux.keys() and stats.aux
    for key in stats.aux:
        assert torch.equal(stats.aux[key], ref.aux[key]), key
    assert torch.equal(stats.counts_E, ref.counts_E) and int(stats.counts_E.sum()) == int(mask.sum()) * (
        layer.router_cfg.topk
    )
    assert (stats.counts_G is None) == (ref.counts_G is None)
    if stats.counts_G is not None:
        assert torch.equal(stats.counts_G, ref.counts_G)
    w = torch.randn_like(y)
    grads = []
    for out, st, wt in ((y, stats, w), (y_ref, ref, w[mask][None])):
        layer.zero_grad()
        ((out * wt).sum() + sum(st.aux.values())).backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-6, atol=1e-7, msg=n)


@pytest.mark.parametrize("name", ["mohge_biased", "moe"])
def test_the_selection_biases_step_from_the_real_tokens_alone(name):
    """The counts a step's selection-bias update reads (LayerStats.balance_counts) are those of the real tokens, so
    the biases move as they would on x[mask] alone."""
    x, mask = padded_batch()
    layer = build(name)
    masked, alone = layer(x, mask)[1], layer(x[mask][None])[1]
    assert torch.equal(masked.balance_counts(), alone.balance_counts())
    if name == "mohge_biased":
        before = layer.router.expert_bias_E.clone(), layer.router.group_bias_G.clone()
        layer.router.update_selection_bias(masked.counts_E)
        after = layer.router.expert_bias_E.clone(), layer.router.group_bias_G.clone()
        layer.router.expert_bias_E.copy_(before[0]), layer.router.group_bias_G.copy_(before[1])
        layer.router.update_selection_bias(alone.counts_E)
        assert torch.equal(after[0], layer.router.expert_bias_E) and torch.equal(after[1], layer.router.group_bias_G)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_mask_of_all_true_changes_nothing(name):
    x, _ = padded_batch()
    layer = build(name)
    y, stats = layer(x)
    y_mask, stats_mask = layer(x, torch.ones(x.shape[:2], dtype=torch.bool))
    assert torch.equal(y, y_mask) and torch.equal(stats.counts_E, stats_mask.counts_E)
    for key in stats.aux:
        assert torch.equal(stats.aux[key], stats_mask.aux[key]), key


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("empty", ["no_tokens", "all_masked"])
def test_an_empty_batch_gives_an_empty_output_zero_losses_and_zero_counts(name, empty):
    """0 tokens (or every token masked) in training mode: the output has the input's shape, every raw aux loss is 0
    (not 0/0), the counts are 0, and backward runs."""
    layer = build(name)
    if empty == "no_tokens":
        x, mask = torch.randn(2, 0, D, requires_grad=True), None
    else:
        x, mask = torch.randn(2, 3, D, requires_grad=True), torch.zeros(2, 3, dtype=torch.bool)
    y, stats = layer(x, mask)
    assert y.shape == x.shape and not y.detach().any()
    assert stats.aux and all(v.item() == 0 for v in stats.aux.values())
    assert not stats.counts_E.any() and (stats.counts_G is None or not stats.counts_G.any())
    (y.sum() + sum(stats.aux.values())).backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_mohge_layer_takes_a_mask_of_the_token_shape():
    """MoHGELayer(x, mask): mask is a bool of x's shape without the last dim; the weighted aux loss is that of the
    real tokens alone, and a masked token's output is 0 (neither the routed nor the shared expert runs on it)."""
    torch.manual_seed(0)
    layer = MoHGELayer(64, backend="torch")
    x, mask = torch.randn(2, 5, 64), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    y, aux = layer(x, mask)
    y_ref, aux_ref = layer(x[mask])
    assert torch.equal(y[mask], y_ref) and not y[~mask].any() and torch.equal(aux, aux_ref)
    y, aux = layer(torch.randn(0, 64))
    assert y.shape == (0, 64) and aux.item() == 0
    for bad, why in (
        (mask.float(), "a bool tensor"),
        (mask[:, :4], r"shape \(2, 5\)"),
        (mask.reshape(-1), r"shape \(2, 5\)"),
    ):
        with pytest.raises(ValueError, match=rf"^mask of shape .*{why}"):
            layer(x, bad)
