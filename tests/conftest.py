"""Shared test fixtures: tiny configs of every FFN family, deterministic seeds."""

from __future__ import annotations

from pathlib import Path

import mohge_studies
import pytest
import torch
from mohge_studies.config.runs import merge_config

from mohge.config import FFNConfig, ModelConfig, RouterConfig
from mohge.model.routing import GroupedRouter

ROOT = Path(__file__).resolve().parents[1]


def config_path(name: str) -> Path:
    """A shipped config by name: configs/<name>.yaml, else the registered study <name>'s studies/<name>/config.yaml."""
    stem = name.removesuffix(".yaml")
    path = ROOT / "configs" / f"{stem}.yaml"
    return path if path.is_file() else ROOT / mohge_studies.config_file(stem)


# The release's 3B expert layout (docs/method.md §1.1): 8 groups of 8, widths 384..1280.
RELEASE = FFNConfig(kind="mohge", num_experts=64, expert_widths=(384, 512, 640, 768, 896, 1024, 1152, 1280))


def release_router(gate_mode: str = "softmax_topk_probs", d: int = 64, std: float = 0.5) -> GroupedRouter:
    """The release's router (top-4 groups, top-6 experts) at model width ``d``; a large ``std`` gives peaked scores."""
    return GroupedRouter(d, RELEASE, RouterConfig(topk=6, group_topk=4, gate_mode=gate_mode, init_std=std))


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
def _seed_and_threads():
    """Every test starts from seed 0 and leaves torch's thread count as it found it (the trainer sets it)."""
    torch.manual_seed(0)
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# xdist groups whose tests the suite waits for longest: on `make test` (pytest-xdist) they start first
LONGEST_FIRST = ("smoke_clone",)


def xdist_group(item) -> str | None:
    """The item's xdist group: its own `@pytest.mark.xdist_group`, else its module's name when it uses a fixture of
    module scope (a trained model, a fake-SLURM run), so a module's expensive fixture is made on one worker only."""
    if mark := item.get_closest_marker("xdist_group"):
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(fixturedefs[-1].scope == "module" for fixturedefs in defs.values()):
        return item.module.__name__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Groups set before pytest-xdist reads them; on an xdist worker, the longest work first: the groups of
    LONGEST_FIRST, then every group holding a `slow` test, then the rest, each in collection order (run with
    --no-loadscope-reorder, so pytest-xdist keeps this order)."""
    for item in items:
        if not item.get_closest_marker("xdist_group") and (group := xdist_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):  # the marker, not a keyword: a checkout in a folder named gpu runs
                item.add_marker(skip)
    result = yield
    if hasattr(config, "workerinput"):
        slow = {xdist_group(item) or item.nodeid for item in items if "slow" in item.keywords}

        def rank(item) -> int:
            unit = xdist_group(item) or item.nodeid
            return 0 if unit in LONGEST_FIRST else 1 if unit in slow else 2

        items[:] = sorted(items, key=rank)
    return result


TINY_RUN = {
    "name": "tiny",
    "family": "mohge",
    "model": {
        "vocab_size": 300,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "max_seq_len": 32,
        "ffn": {
            "kind": "mohge",
            "num_experts": 8,
            "expert_widths": [16, 32, 48, 64],
            "shared_expert_width": 0,
            "dense_layers": 0,
            "dense_width": 32,
        },
        "router": {"topk": 2, "group_topk": 2},
    },
    "train": {
        "steps": 4,
        "batch_size": 4,
        "lr": 1e-2,
        "min_lr": 1e-3,
        "warmup_steps": 1,
        "ckpt_every": 4,
        "log_every": 2,
        "eval_batches": 1,
        "threads": 1,
    },
    "data": {"source": "graded", "vocab_size": 300, "seq_len": 16, "graded_num_docs": 120},
}


def tiny_run(**sections) -> dict:
    """A tiny MoHGE run config on the graded corpus (trains in about a second); ``sections`` deep-merge in."""
    return merge_config(TINY_RUN, sections)


def train_tiny(root: Path, run: dict) -> tuple[Path, Path]:
    """Prepare the run's data under ``root/data``, train into ``root/model``; return (model dir, data dir)."""
    from mohge.config import RunConfig
    from mohge.data import DataConfig, prepare
    from mohge.train.trainer import train

    prepare(DataConfig.from_dict(run["data"]), root / "data")
    n = torch.get_num_threads()
    train(RunConfig.from_dict(run), root / "model", data=str(root / "data"))
    torch.set_num_threads(n)
    return root / "model", root / "data"


@pytest.fixture(autouse=True)
def _hf_offline_unset(monkeypatch):
    """Every test starts with the HF offline variables unset: mohge.evaluate.go_offline sets them for the whole
    process, and the plan-time hub check (mohge.config.preflight) would then refuse hf configs in later tests."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
