"""Parameter counts by component: total, and activated per token under a routing histogram.

The model is instantiated on the ``meta`` device (no memory, so the 3B preset counts in milliseconds) and
every parameter is classified by its module path, so the counts are those of the code that trains, not of
a separate formula. Activated parameters count the experts a token reaches: for each MoE layer,
K x sum_e share_e x 3*D*h_e (:func:`mohge.model.experts.swiglu_params`), where share_e is the fraction of routed
slots that expert e receives (uniform: 1/E each; or a histogram measured from a routing trace);
docs/method.md §9.

    mohge params configs/models/mohge-3b.yaml [--compare configs/models/moe-3b.yaml]
        [--histogram trace.json] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from mohge.config import LossConfig, ModelConfig, load_model_config
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError

from .experts import swiglu_params
from .transformer import LanguageModel

COMPONENTS = (
    "embeddings",
    "lm_head",
    "attention",
    "norms",
    "routers",
    "routed_experts",
    "shared_experts",
    "dense_ffn",
)


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


@functools.lru_cache(maxsize=256)
def _totals(cfg: ModelConfig) -> tuple[tuple[tuple[str, int], ...], int]:
    """(component -> parameters, MoE layers) of the meta model of ``cfg`` (one build per config a process asks
    for: the workflow sizes every evaluation job of a DAG from it)."""
    model = build_meta(cfg)
    total = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        total[classify(name)] += p.numel()
    return tuple(total.items()), len(model.moe_layers())


def count_params(cfg: ModelConfig, histogram: Sequence[Sequence[float]] | None = None) -> dict:
    """Total and activated parameters by component.

    ``histogram``: per MoE layer, tokens (or any weights) per expert in router order; None = uniform.
    A single row is applied to every MoE layer.
    """
    items, n_moe = _totals(cfg)
    total = dict(items)
    activated = dict(total)
    activated["routed_experts"] = 0
    layers = range(n_moe)
    D, K = cfg.d_model, cfg.router.topk
    widths_E = cfg.ffn.per_expert_widths if layers else ()
    if histogram is not None and len(histogram) not in (1, len(layers)):
        raise ConfigError(f"histogram has {len(histogram)} rows; need 1 or one per MoE layer ({len(layers)})")
    mean_width = []
    for i, _ in enumerate(layers):
        row = [1.0] * len(widths_E) if histogram is None else list(histogram[0 if len(histogram) == 1 else i])
        if len(row) != len(widths_E):
            raise ConfigError(f"histogram row {i} has {len(row)} entries; the model has {len(widths_E)} experts")
        s = sum(row)
        if s <= 0:
            raise ConfigError(f"histogram row {i} sums to {s}; it needs positive counts")
        w = sum(c / s * h for c, h in zip(row, widths_E, strict=True))
        mean_width.append(w)
        activated["routed_experts"] += round(K * swiglu_params(D, w))
    # "non-embedding" leaves out the input embedding and the LM head, as docs/method.md §9 does
    emb = total["embeddings"] + total["lm_head"]
    return {
        "total": total,
        "activated": activated,
        "total_sum": sum(total.values()),
        "activated_sum": sum(activated.values()),
        "total_non_embedding": sum(total.values()) - emb,
        "activated_non_embedding": sum(activated.values()) - emb,
        "mean_activated_width": mean_width,
    }


def _fmt(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def report(name: str, counts: dict, other: dict | None = None) -> str:
    lines = [
        f"{name}",
        f"  {'component':<16}{'total':>12}{'activated':>12}" + ("   vs compare" if other else ""),
    ]
    for c in COMPONENTS:
        t, a = counts["total"][c], counts["activated"][c]
        if t == 0 and not (other and other["total"][c]):
            continue
        rel = ""
        if other and other["total"][c]:
            rel = f"   {100 * (t / other['total'][c] - 1):+.2f}%"
        lines.append(f"  {c:<16}{_fmt(t):>12}{_fmt(a):>12}{rel}")
    for label, tkey, akey in (
        ("sum", "total_sum", "activated_sum"),
        ("non-embedding", "total_non_embedding", "activated_non_embedding"),
    ):
        rel = ""
        if other:
            rel = f"   {100 * (counts[tkey] / other[tkey] - 1):+.2f}% / {100 * (counts[akey] / other[akey] - 1):+.2f}%"
        lines.append(f"  {label:<16}{_fmt(counts[tkey]):>12}{_fmt(counts[akey]):>12}{rel}")
    return "\n".join(lines)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge params",
        description="Total and activated parameters by component for a model preset or run config.",
    )
    ap.add_argument("config", help="model preset (configs/models/*.yaml) or run config with a 'model' section")
    ap.add_argument("--compare", help="a second config to compare against (e.g. the homogeneous MoE)")
    ap.add_argument(
        "--histogram",
        help="JSON file: a list (one per MoE layer, or one for all) of per-expert token counts, router order",
    )
    ap.add_argument("--json", help="also write the counts as JSON here")
    args = ap.parse_args(argv)
    cfg = load_model_config(args.config)
    hist = json.loads(Path(args.histogram).read_text()) if args.histogram else None
    counts = count_params(cfg, hist)
    other = count_params(load_model_config(args.compare)) if args.compare else None
    print(report(args.config, counts, other))
    if other:
        print(report(args.compare, other))
    if args.json:
        out = {"config": args.config, **counts}
        if other:
            out["compare"] = {"config": args.compare, **other}
        write_json_atomic(args.json, out)
    return 0
