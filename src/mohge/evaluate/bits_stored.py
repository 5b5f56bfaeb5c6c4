"""Bits stored: how much of a table of facts a model holds (docs/method.md §12.5).

For the facts source (mohge.data.facts), a model that knows nothing assigns every value token 1/V and scores
CE(value | key) = value_len × log2 V bits, the value's entropy; a model that knows a fact scores 0 bits on it.
The bits a model stores (Allen-Zhu & Li, arXiv 2404.05405, §2) are

    B = Σ_facts ( value_len × log2 V  −  CE(value | <eot> key) in bits )

over every fact of the table, in one pass. Exact recall (every value token the argmax) is the secondary
endpoint. Two routes give B:

* lm-eval's (``mohge_facts``, a ``loglikelihood`` task, one request per fact, the value scored after
  ``<eot> key``): its aggregate ``perplexity`` is exp(−mean log-likelihood) in nats, so
  B = N × (bits_per_fact − log2 perplexity), and its ``acc`` (lm-eval's is_greedy) is the recall
  (:func:`from_lm_eval`); this is what metrics.json holds;
* a direct batched forward pass over the fact table (:func:`fact_scores`), the reference the tests pit it
  against, and what the pilot uses on intermediate checkpoints.

Legend: N facts, T tokens of one scored row (1 + key_len + value_len), V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from mohge.config import DataConfig
from mohge.core.knobs import ConfigError
from mohge.data.facts import bits_per_fact, fact_table, total_bits

LN2 = math.log(2.0)


def fact_rows(cfg: DataConfig) -> torch.Tensor:
    """[N, T] token ids of every fact as it is scored: end-of-text, key, value (ids of facts.vocabulary:
    end-of-text 0, unk 1, key k at 2 + k, value v at 2 + K + v)."""
    keys_NK, values_NV = fact_table(cfg)
    eot = np.zeros((cfg.facts_num, 1), dtype=np.int64)
    return torch.from_numpy(np.concatenate([eot, keys_NK + 2, values_NV + 2 + cfg.facts_key_tokens], axis=1))


@torch.no_grad()
def fact_scores(
    model: torch.nn.Module, cfg: DataConfig, batch_size: int = 1024, autocast: torch.dtype | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(CE(value | <eot> key) in bits [N], recall [N] bool: every value token the argmax), one forward per batch."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows_NT = fact_rows(cfg)
    kl, vl = cfg.facts_key_len, cfg.facts_value_len
    ce, hit = [], []
    for b in range(0, len(rows_NT), batch_size):
        x = rows_NT[b : b + batch_size].to(device)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            logits_BTV = model(x[:, :-1]).logits
        # positions 1 + kl - 1 .. T - 2 predict the value tokens x[:, 1 + kl :]
        logp_BvV = torch.log_softmax(logits_BTV[:, kl : kl + vl].float(), dim=-1)
        target_Bv = x[:, 1 + kl :]
        ce.append((-logp_BvV.gather(2, target_Bv[..., None])[..., 0].sum(1) / LN2).cpu())
        hit.append((logp_BvV.argmax(-1) == target_Bv).all(1).cpu())
    model.train(was_training)
    return torch.cat(ce).double().numpy(), torch.cat(hit).numpy()


def summarize(ce_bits: np.ndarray, recall: np.ndarray, cfg: DataConfig) -> dict[str, Any]:
    """B and its companions from per-fact cross-entropies in bits (the direct route)."""
    bpf = bits_per_fact(cfg)
    return {
        "bits_stored": float(np.sum(bpf - ce_bits)),
        "recall": float(np.mean(recall)),
        "facts": int(len(ce_bits)),
        "bits_per_fact": bpf,
        "total_bits": total_bits(cfg),
        "mean_ce_bits": float(np.mean(ce_bits)),
    }


def bits_stored(model: torch.nn.Module, cfg: DataConfig, batch_size: int = 1024, autocast=None) -> dict[str, Any]:
    """B by the direct route (see the module docstring)."""
    return summarize(*fact_scores(model, cfg, batch_size, autocast), cfg)


def from_lm_eval(task: dict[str, Any], cfg: DataConfig) -> dict[str, Any]:
    """B from lm-eval's ``mohge_facts`` result (``perplexity`` = exp(−mean log-likelihood), ``acc`` = is_greedy);
    every fact must have been scored (no eval.limit on this task)."""
    n = int(task.get("n_samples", cfg.facts_num))
    if n != cfg.facts_num:
        raise ConfigError(f"mohge_facts scored {n} of {cfg.facts_num} facts: B needs every fact (set eval.limit: 0)")
    bpf = bits_per_fact(cfg)
    mean_ce_bits = math.log2(task["perplexity"])
    return {
        "bits_stored": n * (bpf - mean_ce_bits),
        "recall": float(task["acc"]),
        "facts": n,
        "bits_per_fact": bpf,
        "total_bits": total_bits(cfg),
        "mean_ce_bits": mean_ce_bits,
    }
