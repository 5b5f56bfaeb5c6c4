"""Routing traces on held-out data: tokens per expert and per group in every MoE layer, by difficulty level.

    python -m mohge.traces --ckpt results/<run>/model --data data/<source> --out results/<run>/trace.json
    python -m mohge.evaluate trace ...          (the same command)

The test split is read in order (``TokenStream.iter_eval_batches``: non-overlapping windows of the training
length) with every MoE layer recording its routing. trace.json (keys read by the utilization analysis)::

    {"model": name, "family": ..., "d_model": D, "expert_widths": [G widths], "num_experts": E,
     "experts_per_group": n, "topk": K, "tokens": T, "split": "test",
     "layers": [{"layer": i, "counts": [E], "group_counts": [G], "counts_by_level": {"easy": [E], ...}}, ...]}

``layer`` is the index among the MoE layers (0 = first MoE layer); ``counts`` are routed slots per expert in
router order (group-major), so each layer's counts sum to T * K; ``group_counts`` sums them per width class.
``counts_by_level`` (graded data only, else {}) attributes a position to the level of the token it predicts
(the target at that position: the routed hidden state is the one that must produce that token); separator
positions (newline, EOT) count in ``counts`` but in no level.

``trace.npz`` beside it (with ``--npz``, the default) keeps the raw routing of the first ``eval.trace_batches``
batches for replay: ``idx_<layer>`` [T', K] int32 expert ids (router order) and ``gates_<layer>`` [T', K]
float32, plus ``levels`` [T'] int8 when the data has levels.

Legend: B batch, S sequence, T tokens, K top-k, E experts, G groups.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .atomic import write_bytes_atomic, write_json_atomic
from .checkpoint import load_trained
from .cli import user_errors
from .config import load_run_config
from .data import TokenStream
from .graded import LEVEL_NAMES

log = logging.getLogger("mohge.traces")


def routing_summary(
    counts_LE: torch.Tensor, widths_E: Sequence[int], num_groups: int, topk: int
) -> dict[str, list[Any]]:
    """From routed slots per expert [L, E] (router order): per layer ``group_usage`` [G] = slots of each width
    class / all slots, ``mean_expert_width`` = sum_e share_e * width_e (the mean width of one routed slot) and
    ``activated_expert_width`` = topk * that (the routed FFN width a token activates)."""
    counts_LE = counts_LE.double().cpu()
    share_LE = counts_LE / counts_LE.sum(1, keepdim=True).clamp_min(1)
    mean_L = (share_LE * torch.tensor(widths_E, dtype=torch.float64)).sum(1)
    return {
        "group_usage": share_LE.view(len(counts_LE), num_groups, -1).sum(2).tolist(),
        "mean_expert_width": mean_L.tolist(),
        "activated_expert_width": (mean_L * topk).tolist(),
    }


@torch.no_grad()
def collect_trace(
    model: torch.nn.Module,
    cfg: Any,
    data_dir: str | Path,
    split: str = "test",
    batch_size: int = 16,
    max_batches: int = 0,
    keep_batches: int = 0,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(trace dict, raw arrays of the first ``keep_batches`` batches) for a model in eval mode."""
    ffn, K = cfg.model.ffn, cfg.model.router.topk
    E, G = ffn.num_experts, ffn.num_groups
    layers = model.moe_layers()
    if not layers:
        raise ValueError(f"model.ffn.kind={ffn.kind!r} has no MoE layer to trace")
    stream = TokenStream.open(data_dir, split)
    with_levels = stream.levels is not None
    device = next(model.parameters()).device
    counts_LE = torch.zeros(len(layers), E, dtype=torch.int64)
    by_level = torch.zeros(len(LEVEL_NAMES), len(layers), E, dtype=torch.int64)
    raw: dict[str, list[np.ndarray]] = {}
    T = 0
    for layer in layers:
        layer.record = True
    try:
        batches = stream.iter_eval_batches(batch_size, cfg.data_config.seq_len, with_levels=with_levels)
        for b, batch in enumerate(batches):
            if max_batches and b >= max_batches:
                break
            x_BS, level_BS = batch[0], (batch[2] if with_levels else None)
            out = model(x_BS.to(device))
            T += x_BS.numel()
            level_T = level_BS.reshape(-1) if level_BS is not None else None
            for i, stats in enumerate(out.layers):
                idx_TK = stats.routing.idx_TK.cpu()
                counts_LE[i] += torch.bincount(idx_TK.reshape(-1), minlength=E)
                if level_T is not None:
                    for lv in range(len(LEVEL_NAMES)):
                        sel_TK = idx_TK[level_T == lv]
                        by_level[lv, i] += torch.bincount(sel_TK.reshape(-1), minlength=E)
                if b < keep_batches:
                    raw.setdefault(f"idx_{i}", []).append(idx_TK.numpy().astype(np.int32))
                    raw.setdefault(f"gates_{i}", []).append(stats.routing.gates_TK.float().cpu().numpy())
            if level_T is not None and b < keep_batches:
                raw.setdefault("levels", []).append(level_T.numpy().astype(np.int8))
    finally:
        for layer in layers:
            layer.record = False
    trace = {
        "model": cfg.name,
        "family": cfg.family,
        "d_model": cfg.model.d_model,
        "expert_widths": list(ffn.expert_widths),
        "num_experts": E,
        "experts_per_group": ffn.experts_per_group,
        "topk": K,
        "tokens": T,
        "split": split,
        "layers": [
            {
                "layer": i,
                "counts": counts_LE[i].tolist(),
                "group_counts": counts_LE[i].view(G, -1).sum(1).tolist(),
                "counts_by_level": (
                    {name: by_level[lv, i].tolist() for lv, name in enumerate(LEVEL_NAMES)} if with_levels else {}
                ),
            }
            for i in range(len(layers))
        ],
    }
    for row in trace["layers"]:
        assert sum(row["counts"]) == T * K, "every token routes to exactly K experts"
    return trace, {k: np.concatenate(v) for k, v in raw.items()}


def write_trace(
    ckpt: str | Path,
    data_dir: str | Path,
    out: str | Path,
    npz: bool = True,
    batch_size: int | None = None,
    max_batches: int = 0,
    device: str = "cpu",
    eval_config: str | Path | None = None,
) -> dict[str, Any]:
    cfg, model = load_trained(ckpt, device)
    ec = load_run_config(eval_config).eval if eval_config else cfg.eval  # the workflow's current eval section
    trace, raw = collect_trace(
        model,
        cfg,
        data_dir,
        batch_size=batch_size or ec.batch_size,
        max_batches=max_batches,
        keep_batches=ec.trace_batches if npz else 0,
    )
    out = Path(out)
    write_json_atomic(out, trace)
    if npz and raw:
        buf = io.BytesIO()
        np.savez_compressed(buf, **raw)
        write_bytes_atomic(out.with_suffix(".npz"), buf.getvalue())
    return trace


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mohge.traces",
        description="Per MoE layer: routed tokens per expert and per group on the test split, "
        "overall and per difficulty level (graded data); optional raw routing (.npz) for replay.",
    )
    ap.add_argument("--ckpt", required=True, help="trained model folder (model.safetensors + config.json)")
    ap.add_argument("--data", required=True, help="prepared data folder the model was trained on")
    ap.add_argument("--out", required=True, help="trace JSON to write (the .npz goes beside it)")
    ap.add_argument("--no-npz", action="store_true", help="do not write the raw routing of eval.trace_batches")
    ap.add_argument("--batch-size", type=int, help="sequences per forward pass (default eval.batch_size)")
    ap.add_argument("--max-batches", type=int, default=0, help="trace at most this many batches (0 = all)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--eval-config", help="run config whose eval section replaces the checkpoint's")
    args = ap.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trace = write_trace(
        args.ckpt,
        args.data,
        args.out,
        not args.no_npz,
        args.batch_size,
        args.max_batches,
        args.device,
        eval_config=args.eval_config,
    )
    log.info("traced %d tokens in %d MoE layers -> %s", trace["tokens"], len(trace["layers"]), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
