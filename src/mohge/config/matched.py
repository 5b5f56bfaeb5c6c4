"""Baselines matched to one MoHGE config: every family the paper compares, derived by one rule each.

From a MoHGE ``ModelConfig`` (same attention, depth, dense first layers, shared expert, top-k):

* ``mohge``     - the config itself.
* ``moe``       - homogeneous MoE, one width ``moe_width`` (default: mean MoHGE width / 0.8125, i.e. the
                  release's 1024 vs mean 832, so MoHGE has 18.75% fewer routed-expert parameters), flat router,
                  Switch loss, same number of experts and the same top-k.
* ``moe_equal`` - control: homogeneous MoE at MoHGE's mean width (equal total parameters); it tells whether
                  heterogeneity itself matters.
* ``hmoe``      - MoHGE's experts under one flat router with HMoE's size-weighted balance loss.
* ``modse``     - MoHGE's experts (symmetric widths pair up to a constant sum) under one flat router, Switch
                  loss, pair placement.
* ``dense``     - every layer a dense SwiGLU whose width equals MoHGE's activated FFN width under uniform
                  routing (top-k x mean width + shared width): equal activated FLOPs.
"""

from __future__ import annotations

import dataclasses

from mohge.core.knobs import ConfigError

from .sections import ModelConfig, RouterConfig

FAMILIES = ("mohge", "moe", "moe_equal", "hmoe", "modse", "dense")
RELEASE_WIDTH_RATIO = 832 / 1024  # mean MoHGE width / homogeneous baseline width in the release


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def default_moe_width(cfg: ModelConfig) -> int:
    widths = cfg.ffn.expert_widths
    return _round_to(sum(widths) / len(widths) / RELEASE_WIDTH_RATIO, 8)


def _with_ffn(cfg: ModelConfig, router: RouterConfig | None = None, **ffn_changes) -> ModelConfig:
    ffn = dataclasses.replace(cfg.ffn, **ffn_changes)
    return dataclasses.replace(cfg, ffn=ffn, router=router or cfg.router)


def derive(cfg: ModelConfig, family: str, moe_width: int | None = None) -> ModelConfig:
    """The ``family`` baseline matched to MoHGE config ``cfg`` (see the module docstring for each rule)."""
    if cfg.ffn.kind != "mohge":
        raise ConfigError(f"model.ffn.kind={cfg.ffn.kind!r}: matched baselines derive from a mohge config")
    if family not in FAMILIES:
        raise ConfigError(f"family={family!r} is not one of {FAMILIES}")
    widths = cfg.ffn.expert_widths
    mean_w = sum(widths) / len(widths)
    flat_router = dataclasses.replace(cfg.router, group_topk=1)
    if family == "mohge":
        return cfg
    if family in ("moe", "moe_equal"):
        width = (moe_width or default_moe_width(cfg)) if family == "moe" else _round_to(mean_w, 1)
        return _with_ffn(cfg, flat_router, kind="moe", expert_widths=(width,), placement="contiguous")
    if family == "hmoe":
        return _with_ffn(cfg, flat_router, kind="hmoe", placement="contiguous")
    if family == "modse":
        return _with_ffn(cfg, flat_router, kind="modse", placement="modse_pairs")
    dense_width = _round_to(cfg.router.topk * mean_w + cfg.ffn.shared_expert_width, 8)
    return _with_ffn(cfg, flat_router, kind="dense", dense_width=dense_width, ep_size=1)


def all_families(cfg: ModelConfig, moe_width: int | None = None) -> dict[str, ModelConfig]:
    return {f: derive(cfg, f, moe_width) for f in FAMILIES}


__all__ = ["FAMILIES", "all_families", "default_moe_width", "derive"]
