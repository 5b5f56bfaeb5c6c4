"""A golden loss curve: a tiny MoHGE trained for a few dozen steps on CPU, fp32, one thread, deterministic.

Its per-step losses are recorded in ``tiny_mohge.json`` and checked exactly (``test_golden.py``), so any change of
the training math shows: the model, the router (docs/method.md §2), the losses and their coefficients and schedule
(§5, §6), the optimizer and the learning-rate schedule. It runs the trainer's own pieces (``mohge.training.lr_at``,
``build_optimizer``, ``compute_loss``) on synthetic tokens (a fixed seeded Markov chain), so it needs no prepared
data and no file I/O. When a change is *meant* to alter the math, regenerate the record and commit it:

    python tests/golden/regen.py

Legend: B batch, S sequence length, V vocabulary.
"""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path
from typing import Any

import torch

from mohge.config import RunConfig
from mohge.model import LanguageModel
from mohge.training import build_optimizer, compute_loss, lr_at

GOLDEN = Path(__file__).resolve().parent / "tiny_mohge.json"
REGEN = "python tests/golden/regen.py"
V, S, B = 300, 16, 8  # V: the smallest vocabulary a data section accepts is 257
# Loss coefficients are not set here: the curve must follow LossConfig's defaults (the release's values).
CONFIG: dict[str, Any] = {
    "name": "golden-tiny-mohge",
    "family": "mohge",
    "model": {
        "vocab_size": V,
        "d_model": 32,
        "n_layers": 3,
        "n_heads": 4,
        "max_seq_len": S,
        "ffn": {
            "kind": "mohge",
            "num_experts": 16,
            "expert_widths": [16, 24, 32, 40],
            "shared_expert_width": 32,
            "dense_layers": 1,
            "dense_width": 64,
            "placement": "all_size",
            "backend": "torch",
        },
        "router": {"topk": 3, "group_topk": 2},
    },
    "train": {"steps": 40, "batch_size": B, "lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 4, "seed": 0, "threads": 1},
    "data": {"source": "graded", "vocab_size": V, "seq_len": S},
}


def markov_tokens(n: int, seed: int = 0) -> torch.Tensor:
    """n tokens of a fixed chain: each token is followed by one of 3 successors, so the LM loss can fall."""
    g = torch.Generator().manual_seed(seed)
    successors_V3 = torch.randint(0, V, (V, 3), generator=g)
    choice_N = torch.randint(0, 3, (n,), generator=g)
    out = torch.empty(n, dtype=torch.int64)
    out[0] = 0
    for i in range(1, n):
        out[i] = successors_V3[out[i - 1], choice_N[i]]
    return out


def run_curve() -> list[dict[str, float]]:
    """Train CONFIG and return one row per step: loss (LM + weighted aux), lm_loss, aux_loss, grad_norm."""
    cfg = RunConfig.from_dict(CONFIG)
    tc = cfg.train
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(tc.seed)
        model = LanguageModel(cfg.model, cfg.loss)
        opt = build_optimizer(model, tc)
        stream = markov_tokens(tc.steps * B * S + 1, seed=tc.seed)
        rows = []
        for s in range(tc.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(s, tc)
            chunk = stream[s * B * S : (s + 1) * B * S + 1]
            x_BS, y_BS = chunk[:-1].view(B, S), chunk[1:].view(B, S)
            total, lm, aux, _ = compute_loss(model, x_BS, y_BS, cfg, s)
            total.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            row = {"loss": total.item(), "lm_loss": lm.item(), "aux_loss": aux.item(), "grad_norm": gnorm.item()}
            assert all(math.isfinite(v) for v in row.values()), (s, row)
            rows.append(row)
        return rows
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def environment() -> dict[str, str]:
    """Where a record was made: exact float equality is expected on the same torch build and CPU kind."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def write_golden(rows: list[dict[str, float]], path: Path = GOLDEN) -> None:
    record = {"regenerate": REGEN, "environment": environment(), "config": CONFIG, "steps": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")


def read_golden(path: Path = GOLDEN) -> dict[str, Any]:
    return json.loads(path.read_text())
