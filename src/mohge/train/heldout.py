"""The held-out loss of a model on a prepared split: what training logs as ``val_loss`` and evaluation reports.

It lives in the training layer (evaluation imports it from here), so the trainer never imports evaluation.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from mohge.data import TokenStream


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module,
    data_dir: str | Path,
    split: str,
    batch_size: int,
    seq_len: int,
    max_batches: int = 0,
    autocast: torch.dtype | None = None,
) -> dict[str, float]:
    """Mean next-token loss and perplexity over the first ``max_batches`` (0 = all) sequential batches."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll, n = 0.0, 0
    for i, (x, y) in enumerate(TokenStream.open(data_dir, split, verify=True).iter_eval_batches(batch_size, seq_len)):
        if max_batches and i >= max_batches:
            break
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            logits = model(x.to(device)).logits
        nll += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
        n += y.numel()
    model.train(was_training)
    loss = nll / max(n, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": n}
