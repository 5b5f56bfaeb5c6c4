"""Training throughput on this machine: MoHGE against a homogeneous MoE of equal activated FLOPs.

    python -m mohge.bench train [--steps 10] [--json out.json]     (mohge.bench dispatches to main() here)

The MoE is ``mohge.config.matched.derive(cfg, "moe_equal")``: the same experts count and top-k, every expert at
MoHGE's mean width, so under uniform routing both activate the same FFN FLOPs per token; differences come
from the two-level router and from experts of unequal widths (one GEMM per expert either way). Both models
train (forward, backward, AdamW) on the same random tokens, fp32, in one process; after ``warmup`` steps each,
single steps alternate between the models and the median step time of each gives its tokens/s, so the load of
other processes on a shared machine hits both alike.

Default size (realistic for a CPU run): D 256, 4 layers, 4 heads, vocabulary 2048, sequence 256, batch 8;
MoHGE 8 groups x 4 experts, widths 128..352 (step 32, mean 240), top-4 experts in top-4 groups; no shared
expert, no dense first layer. Target: MoHGE tokens/s >= 0.9x MoE.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mohge.config import FFNConfig, LossConfig, ModelConfig, RouterConfig, TrainConfig
from mohge.config.matched import derive
from mohge.core.atomic import write_json_atomic
from mohge.model import LanguageModel
from mohge.train.step import build_optimizer


def bench_config(d_model: int = 256, n_layers: int = 4, groups: int = 8, per_group: int = 4) -> ModelConfig:
    widths = tuple(128 + 32 * g for g in range(groups))
    return ModelConfig(
        vocab_size=2048,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=4,
        max_seq_len=256,
        ffn=FFNConfig(
            kind="mohge",
            num_experts=groups * per_group,
            expert_widths=widths,
            shared_expert_width=0,
            dense_layers=0,
            placement="all_size",
        ),
        router=RouterConfig(topk=4, group_topk=4),
    )


class _Trainer:
    """One model, its optimizer and a fixed random batch; ``run(n)`` returns the seconds of n steps."""

    def __init__(self, cfg: ModelConfig, batch: int, seq: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = LanguageModel(cfg, LossConfig()).train()
        self.opt = build_optimizer(self.model, TrainConfig(steps=10, warmup_steps=1, lr=1e-3, min_lr=1e-4))
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.loss_cfg = LossConfig()

    def step(self) -> None:
        out = self.model(self.x)
        loss = F.cross_entropy(out.logits.flatten(0, 1), self.y.flatten())
        for stats in out.layers:
            loss = loss + sum(self.loss_cfg.expert_aux_coeff * v for v in stats.aux.values())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        return time.perf_counter() - t0


def measure(cfg: ModelConfig, batch: int = 8, seq: int = 256, steps: int = 10, warmup: int = 2) -> dict:
    """Tokens/s of MoHGE and of its ``moe_equal`` baseline; ratio = MoHGE / MoE.

    Steps alternate between the two models (the order flips every round) and each model's tokens/s is taken
    from its median step time, so load from other processes on a shared machine hits both alike."""
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq))
    models = {"mohge": _Trainer(cfg, batch, seq), "moe": _Trainer(derive(cfg, "moe_equal"), batch, seq)}
    for t in models.values():
        t.run(warmup)
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(steps):
        for name in sorted(models, reverse=bool(r % 2)):
            times[name].append(models[name].run(1))
    tps = {name: batch * seq / statistics.median(ts) for name, ts in times.items()}
    ffn = cfg.ffn
    return {
        "tokens_per_s": tps,
        "ratio_mohge_over_moe": tps["mohge"] / tps["moe"],
        "step_seconds": times,
        "threads": torch.get_num_threads(),
        "setup": {
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "batch": batch,
            "seq": seq,
            "mohge_widths": list(ffn.expert_widths),
            "experts": ffn.num_experts,
            "topk": cfg.router.topk,
            "group_topk": cfg.router.group_topk,
            "moe_width": derive(cfg, "moe_equal").ffn.expert_widths[0],
            "timed_steps": steps,
            "warmup_steps": warmup,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mohge.bench train",
        description="Training tokens/s of MoHGE vs a homogeneous MoE of equal activated FLOPs (moe_equal), "
        "fp32 on this CPU, measured in one interleaved run. Target ratio >= 0.9.",
    )
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8, help="MoHGE groups (widths 128, 160, ... step 32)")
    ap.add_argument("--per-group", type=int, default=4, help="experts per group")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per model, alternating between the two")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = bench_config(args.d_model, args.layers, args.groups, args.per_group)
    res = measure(cfg, args.batch, args.seq, args.steps, args.warmup)
    tps = res["tokens_per_s"]
    print(
        f"MoHGE {tps['mohge']:.0f} tok/s, MoE (equal activated FLOPs) {tps['moe']:.0f} tok/s: "
        f"ratio {res['ratio_mohge_over_moe']:.3f} (target >= 0.9), {res['threads']} threads"
    )
    print(json.dumps(res))
    if args.json:
        write_json_atomic(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
