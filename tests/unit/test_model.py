"""The language model (docs/method.md §1.4): every FFN family trains a step, causality with both attentions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model_config

from mohge.model import LanguageModel
from mohge.model.losses import weighted_aux


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
