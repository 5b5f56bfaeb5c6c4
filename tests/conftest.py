"""Shared test fixtures: tiny configs of every FFN family, deterministic seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mohge.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def tiny_model_config(**ffn_router) -> ModelConfig:
    ffn = {
        "kind": "mohge",
        "num_experts": 16,
        "expert_widths": [16, 24, 32, 40],
        "shared_expert_width": 32,
        "dense_layers": 1,
        "dense_width": 64,
        "placement": "all_size",
        "backend": "torch",
    }
    router = {"topk": 3, "group_topk": 2}
    ffn.update(ffn_router.pop("ffn", {}))
    router.update(ffn_router.pop("router", {}))
    base = {"vocab_size": 97, "d_model": 32, "n_layers": 3, "n_heads": 4, "max_seq_len": 16}
    base.update(ffn_router)
    return ModelConfig.from_dict({**base, "ffn": ffn, "router": router}, "model")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
