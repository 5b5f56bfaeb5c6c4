"""The MoE layer and the expert computation: equivalences and torch paths against the reference loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model_config

from mohge import kernels
from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.experts import SwiGLU
from mohge.losses import weighted_aux
from mohge.model import LanguageModel
from mohge.moe import MoELayer


def make_case(T, D, widths, per_class, K, empty_expert=None, dtype=torch.float64):
    w1s = [(torch.randn(per_class, 2 * h, D, dtype=dtype) * 0.3).requires_grad_() for h in widths]
    w2s = [(torch.randn(per_class, D, h, dtype=dtype) * 0.3).requires_grad_() for h in widths]
    E = per_class * len(widths)
    pool = [e for e in range(E) if e != empty_expert]
    idx = torch.stack([torch.tensor(pool)[torch.randperm(len(pool))[:K]] for _ in range(T)])
    x = torch.randn(T, D, dtype=dtype, requires_grad=True)
    gates = torch.rand(T, K, dtype=dtype, requires_grad=True)
    return x, idx, gates, w1s, w2s


@pytest.mark.parametrize(
    ("T", "D", "widths", "per_class", "K", "empty"),
    [
        (1, 24, (8, 20), 2, 1, None),
        (127, 48, (12, 20, 36), 3, 6, 4),
        (600, 40, (16, 48), 4, 2, 0),
    ],
)
def test_grouped_torch_matches_loop_forward_and_backward(T, D, widths, per_class, K, empty):
    case = make_case(T, D, widths, per_class, K, empty)
    x, idx, gates, w1s, w2s = case
    probe = torch.randn(T, D, dtype=x.dtype)
    results = []
    for backend in ("loop", "torch"):
        y = kernels.expert_swiglu(x, idx, gates, w1s, w2s, backend)
        (y * probe).sum().backward()
        leaves = [x, gates, *w1s, *w2s]
        results.append([y.detach(), *[torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in leaves]])
        for t in leaves:
            t.grad = None
    for ref, got in zip(*results, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    if empty is not None:  # the expert with no token gets an exactly zero gradient
        c, j = divmod(empty, per_class)
        assert torch.all(results[1][3 + c][j] == 0)


def test_contract_errors_name_the_problem():
    x, idx, gates, w1s, w2s = make_case(4, 8, (4,), 2, 1, dtype=torch.float32)
    with pytest.raises(ValueError, match="class 0"):
        kernels.expert_swiglu(x, idx, gates, [w1s[0][:, :5]], w2s, "torch")
    with pytest.raises(ValueError, match="backend"):
        kernels.expert_swiglu(x, idx, gates, w1s, w2s, "cuda-magic")


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


@pytest.mark.parametrize("kind", ["mohge", "moe", "hmoe", "modse", "dense"])
def test_every_family_trains_a_step(kind):
    ffn = {"kind": kind}
    if kind == "moe":
        ffn.update(expert_widths=[28], placement="contiguous")
    if kind == "hmoe":
        ffn.update(placement="contiguous")
    if kind == "modse":
        ffn.update(placement="modse_pairs")
    cfg = tiny_model_config(ffn=ffn)
    model = LanguageModel(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    out = model(tokens)
    assert out.logits.shape == (2, 16, cfg.vocab_size)
    assert len(out.layers) == (0 if kind == "dense" else cfg.n_layers - cfg.ffn.dense_layers)
    lm = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    aux = sum((weighted_aux(s.aux, model.loss_cfg, 1, 2) for s in out.layers), torch.zeros(()))
    (lm + aux).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    for s in out.layers:
        assert s.counts_E.sum().item() == 2 * 16 * cfg.router.topk


def test_causality_future_tokens_do_not_change_past_logits():
    cfg = tiny_model_config(ffn={"dense_layers": 0})
    model = LanguageModel(cfg).eval()
    a = torch.randint(0, cfg.vocab_size, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(a).logits[:, :10], model(b).logits[:, :10])


def test_mla_attention_runs_and_is_causal():
    cfg = dataclasses.replace(
        tiny_model_config(),
        attention="mla",
        mla_q_head_dim=8,
        mla_rope_head_dim=4,
        mla_v_head_dim=6,
        mla_kv_lora_rank=12,
    )
    model = LanguageModel(cfg).eval()
    a = torch.randint(0, cfg.vocab_size, (1, 16))
    b = a.clone()
    b[0, 12:] = 0
    torch.testing.assert_close(model(a).logits[:, :12], model(b).logits[:, :12])
