"""Serving a trained model with cheaper routing: fewer groups or experts per token, or the widest groups barred.

An evaluation-time option, not a retraining: the override changes what the routers of a loaded model select and
leaves every weight as it was trained.

    python -m mohge.evaluate --ckpt MODEL --data DATA --out m.json --route-override group_topk=2
    mohge bench inference --models MODEL... --data DATA --out inference.json   (sweeps the knob points)

Keys (``KEY=VALUE``, several allowed):

* ``group_topk`` (MoHGE): K_g, the groups a token picks its experts from (docs/method.md §2.1 G3), at most the
  trained value. Steps G4-E6 run as written with the smaller K_g (with K_g = 1 the group weight is the raw sigmoid,
  E4 normalises), so the expert top-k still needs ``topk <= n * K_g`` candidates.
* ``topk``: K, the experts per token (E5 for MoHGE, the flat top-k of moe, hmoe and modse), at most the trained
  value; the gates are renormalised over the fewer winners by the router's own E6 / §2.4 rule.
* ``bar_widest`` (MoHGE, and flat routers over several widths): the number of widest width classes no token may
  reach. For MoHGE their group logits are -inf before G3 (sigmoid 0, never in the top-K_g); for a flat router the
  logits of their experts are, before the top-k (softmax 0).

The same override applies to mohge's :class:`~mohge.model.LanguageModel` and to the Hugging Face export
(:mod:`.modeling_mohge`): both hold their routers as ``GroupedRouter`` (``Kg``, ``K``, ``group_router``) or
``TopKRouter`` (``K``, ``router``). Barring wraps the router's linear layer in :class:`BarredLogits`, whose weight
is the trained one. Legend: T tokens, D model width, G groups, E experts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from mohge.config import ConfigError, ModelConfig

KEYS = ("group_topk", "topk", "bar_widest")


@dataclass(frozen=True)
class RouteOverride:
    """What an evaluation serves differently from training; None / 0 leaves that part as trained."""

    group_topk: int | None = None
    topk: int | None = None
    bar_widest: int = 0

    @classmethod
    def parse(cls, items: Iterable[str]) -> RouteOverride:
        """From ``KEY=VALUE`` strings (``--route-override group_topk=2 bar_widest=1``); a mistake is a ConfigError."""
        values: dict[str, int] = {}
        for item in items:
            key, sep, raw = item.partition("=")
            if not sep or key not in KEYS:
                raise ConfigError(f"route_override={item!r}: expected KEY=VALUE with KEY one of {KEYS}")
            try:
                values[key] = int(raw)
            except ValueError:
                raise ConfigError(f"route_override.{key}={raw!r}: must be an integer") from None
            if values[key] < (0 if key == "bar_widest" else 1):
                raise ConfigError(f"route_override.{key}={raw!r}: must be >= {0 if key == 'bar_widest' else 1}")
        return cls(**values)

    @property
    def is_identity(self) -> bool:
        return self.group_topk is None and self.topk is None and not self.bar_widest

    def label(self) -> str:
        """``trained`` or ``group_topk=2,bar_widest=1``: a knob point's name in tables."""
        parts = [f"{k}={v}" for k, v in self.as_dict().items()]
        return ",".join(parts) or "trained"

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, 0)}

    def served(self, cfg: ModelConfig) -> dict[str, int]:
        """The routing a model with config ``cfg`` is served with: group_topk, topk and bar_widest after the override.
        Refuses (ConfigError) what the model cannot serve, naming the key."""
        ffn, r = cfg.ffn, cfg.router
        if ffn.kind == "dense":
            if not self.is_identity:
                raise ConfigError(f"route_override={self.label()!r}: a dense model has no router to override")
            return {}
        mohge = ffn.kind == "mohge"
        kg = r.group_topk if self.group_topk is None else self.group_topk
        k = r.topk if self.topk is None else self.topk
        if self.group_topk is not None and not mohge:
            raise ConfigError(f"route_override.group_topk={kg}: only a MoHGE model routes over groups ({ffn.kind!r})")
        if kg > r.group_topk:
            raise ConfigError(
                f"route_override.group_topk={kg}: above the trained {r.group_topk} (a cheaper route only)"
            )
        if k > r.topk:
            raise ConfigError(f"route_override.topk={k}: above the trained {r.topk} (a cheaper route only)")
        G = ffn.num_groups
        if self.bar_widest >= G:
            raise ConfigError(f"route_override.bar_widest={self.bar_widest}: the model has {G} width classes")
        if mohge:
            open_groups = G - self.bar_widest
            if kg > open_groups:
                raise ConfigError(
                    f"route_override.group_topk={kg}: only {open_groups} groups are left with bar_widest="
                    f"{self.bar_widest}"
                )
            if k > ffn.experts_per_group * kg:
                raise ConfigError(
                    f"route_override.topk={k}: more than the {ffn.experts_per_group * kg} experts of {kg} groups"
                )
        elif k > ffn.experts_per_group * (G - self.bar_widest):
            raise ConfigError(f"route_override.topk={k}: more than the experts left with bar_widest={self.bar_widest}")
        out = {"topk": k, "bar_widest": self.bar_widest}
        return {"group_topk": kg, **out} if mohge else out


def barred_classes(widths: Iterable[int], bar_widest: int) -> list[int]:
    """The width classes barred: the ``bar_widest`` widest (the later class on a tie of widths)."""
    order = sorted(range(len(list(widths))), key=lambda g: (list(widths)[g], g))
    return sorted(order[len(order) - bar_widest :]) if bar_widest else []


class BarredLogits(nn.Module):
    """A bias-free router linear whose barred output columns are -inf: the trained weight, one mask."""

    def __init__(self, linear: nn.Linear, barred_cols: list[int]) -> None:
        super().__init__()
        self.linear = linear
        mask = torch.zeros(linear.out_features, dtype=torch.bool)
        mask[barred_cols] = True
        self.register_buffer("barred", mask.to(linear.weight.device), persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return self.linear(x_TD).masked_fill(self.barred, -math.inf)


def _routers(model: nn.Module) -> list[nn.Module]:
    """Every router of a mohge LanguageModel or of the HF export, in depth order (duck-typed: both name them so)."""
    return [m for m in model.modules() if type(m).__name__ in ("GroupedRouter", "TopKRouter")]


def apply_route_override(model: nn.Module, cfg: ModelConfig, override: RouteOverride) -> dict[str, int]:
    """Serve ``model`` (mohge's or the HF export, config ``cfg``) with ``override``, in place; returns the served
    routing (:meth:`RouteOverride.served`). The identity override leaves the model untouched."""
    served = override.served(cfg)
    if override.is_identity:
        return served
    n = cfg.ffn.experts_per_group
    barred = barred_classes(cfg.ffn.expert_widths, override.bar_widest)
    for router in _routers(model):
        router.K = served["topk"]
        if hasattr(router, "Kg"):  # MoHGE: bar whole groups before G3
            router.Kg = served["group_topk"]
            if barred:
                router.group_router = BarredLogits(router.group_router, barred)
        elif barred:  # flat router over width classes: bar those classes' experts before the top-k
            router.router = BarredLogits(router.router, [g * n + j for g in barred for j in range(n)])
    return served
