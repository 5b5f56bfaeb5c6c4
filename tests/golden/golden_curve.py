"""A golden loss curve: a tiny MoHGE trained for a few dozen steps on CPU, fp32, one thread, deterministic.

Its per-step losses are recorded in ``tiny_mohge.json`` and checked (``test_golden.py``: exactly where the record's
environment matches, else at a tolerance that a 1% change of lr, alpha_G or alpha_E still fails), so any change of
the training math shows: the model, the router (docs/method.md §2), the losses and their coefficients and schedule
(§5, §6), the optimizer and the learning-rate schedule. It runs the trainer's own pieces (``mohge.train.step.lr_at``,
``build_optimizer``, ``compute_loss``) on synthetic tokens (a fixed seeded Markov chain), so it needs no prepared
data and no file I/O. When a change is *meant* to alter the math, regenerate the record and commit it:

    python tests/golden/regen.py

Legend: B batch, S sequence length, V vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch

from mohge.config import RunConfig
from mohge.model import LanguageModel
from mohge.model.losses import weighted_aux
from mohge.train.step import build_optimizer, compute_loss, lr_at

GOLDEN = Path(__file__).resolve().parent / "tiny_mohge.json"
REGEN = "python tests/golden/regen.py"
AUX_NAMES = ("group_aux", "expert_aux")  # MoHGE's two aux losses (docs/method.md §5), each recorded weighted
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


def run_curve(config: dict[str, Any] = CONFIG) -> list[dict[str, float]]:
    """Train ``config`` and return one row per step: loss (LM + weighted aux), lm_loss, aux_loss (weighted), each
    weighted aux loss on its own (``group_aux``, ``expert_aux``: a coefficient moves its column in proportion, where
    in the sum the small alpha_G term would hide), and grad_norm."""
    cfg = RunConfig.from_dict(config)
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
            total, lm, aux, layers = compute_loss(model, x_BS, y_BS, cfg, s)
            parts = {
                name: sum(weighted_aux({name: st.aux[name]}, cfg.loss, s, tc.steps).item() for st in layers)
                for name in AUX_NAMES
            }
            total.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            row = {
                "loss": total.item(),
                "lm_loss": lm.item(),
                "aux_loss": aux.item(),
                **parts,
                "grad_norm": gnorm.item(),
            }
            assert all(math.isfinite(v) for v in row.values()), (s, row)
            rows.append(row)
        return rows
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


# Environment variables that change which CPU kernels run (and so the rounding) without changing the hardware.
ROUNDING_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE", "DNNL_MAX_CPU_ISA")


def _cpuinfo() -> dict[str, str]:
    """The first processor's identity in /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}


def _build_versions() -> dict[str, str]:
    """The BLAS and oneDNN builds torch links (from torch.__config__.show())."""
    shown = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", shown)
    dnnl = re.search(r"MKL-DNN v([\w.]+)", shown)
    return {"mkl": mkl.group(1) if mkl else "", "onednn": dnnl.group(1) if dnnl else ""}


def environment() -> dict[str, Any]:
    """Everything that decides the rounding of the curve, as far as a process can see it: the torch build, its BLAS
    and oneDNN, the ATen kernel level in use, the CPU (vendor, family, model, stepping, and a hash of its feature
    flags, which MKL and oneDNN dispatch on) and the environment variables that override those choices. The thread
    count is pinned by the curve itself (one thread). A record is compared exactly only where all of these agree."""
    cpu = _cpuinfo()
    flags = " ".join(sorted(cpu.get("flags", "").split()))
    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        **_build_versions(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "cpu": {k: cpu.get(k, "") for k in ("vendor_id", "cpu family", "model", "stepping", "model name")},
        "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest(),
        "env": {k: os.environ.get(k, "") for k in ROUNDING_ENV},
    }


def write_golden(rows: list[dict[str, float]], path: Path = GOLDEN) -> None:
    record = {"regenerate": REGEN, "environment": environment(), "config": CONFIG, "steps": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")


def read_golden(path: Path = GOLDEN) -> dict[str, Any]:
    return json.loads(path.read_text())
