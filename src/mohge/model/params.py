"""The parameter count of the model itself: the model instantiated on the ``meta`` device (no memory, so the 3B
preset counts in milliseconds) and every parameter classified by its module path. It is the reference the closed
forms of :mod:`mohge.config.sizes` (which every caller uses, torch-free) are tested against
(tests/unit/test_sizes.py).
"""

from __future__ import annotations

import torch

from mohge.config import LossConfig, ModelConfig
from mohge.config.sizes import COMPONENTS

from .transformer import LanguageModel


def classify(name: str) -> str:
    """Component of a parameter from its module path."""
    if name.startswith("embed."):
        return "embeddings"
    if name.startswith("head."):
        return "lm_head"
    if ".attn." in name and "norm" not in name:
        return "attention"
    if "norm" in name:
        return "norms"
    if ".ffn.router." in name:
        return "routers"
    if ".ffn.experts." in name:
        return "routed_experts"
    if ".ffn.shared." in name:
        return "shared_experts"
    if ".ffn." in name:
        return "dense_ffn"
    raise AssertionError(f"unclassified parameter {name}")


def build_meta(cfg: ModelConfig) -> LanguageModel:
    with torch.device("meta"):
        return LanguageModel(cfg, LossConfig())


def meta_totals(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by component of the meta model of ``cfg``."""
    total = dict.fromkeys(COMPONENTS, 0)
    for name, p in build_meta(cfg).named_parameters():
        total[classify(name)] += p.numel()
    return total
