"""Training throughput on this machine: MoHGE against a homogeneous MoE of equal activated FLOPs.

    mohge bench train [--steps 10] [--adamw foreach,fused] [--json out.json]   (mohge_studies.bench dispatches here)

The MoE is ``mohge.config.matched.derive(cfg, "moe_equal")``: the same experts count and top-k, every expert at
MoHGE's mean width, so under uniform routing both activate the same FFN FLOPs per token; differences come
from the two-level router and from experts of unequal widths (one GEMM per expert either way). Both models
train (forward, backward, AdamW) on the same random tokens, in fp32 and under bf16 autocast, in one process; after
``warmup`` steps each, single steps alternate between the four trainers and the median step time of each gives its
tokens/s, so the load of other processes on a shared machine hits all alike. The CPU MFU divides model FLOPs/s by
the GEMM rate measured in the same run at the model's own GEMM shapes (:func:`model_gemms`). The process keeps the
memory a step frees, as a training process does (:func:`mohge.train.runtime.keep_freed_memory`).

Default size (realistic for a CPU run): D 256, 4 layers, 4 heads, vocabulary 2048, sequence 256, batch 8;
MoHGE 8 groups x 4 experts, widths 128..352 (step 32, mean 240), top-4 experts in top-4 groups; no shared
expert, no dense first layer. Targets: MoHGE/MoE >= 1.0, bf16/fp32 >= 1.6, MFU >= 0.7.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from collections.abc import Sequence

import torch
from mohge.kernels.cpu_gemm import clock, cpu_bf16_support, gemm_rate

from mohge.config import (
    ADAMW_IMPLS,
    BACKENDS,
    FFNConfig,
    LossConfig,
    ModelConfig,
    RouterConfig,
    RunConfig,
    TrainConfig,
    preflight,
)
from mohge.config.matched import derive
from mohge.core.atomic import write_json_atomic
from mohge.model import LanguageModel
from mohge.model.fused import use_fused
from mohge.train.distributed.flops import model_flops_per_token
from mohge.train.runtime import keep_freed_memory
from mohge.train.step import build_optimizer, compute_loss, fused_adamw


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


class Trainer:
    """One model, its optimizer and a fixed random batch; ``step()`` returns the step's loss (detached), ``run(n)``
    the seconds of n steps. The loss is the trainer's (:func:`mohge.train.step.compute_loss`: the language-model loss
    and each aux term at its own coefficient) at the last step of ``run_cfg``'s schedule, where every term is on.

    ``bf16``: the step runs under bf16 autocast (fp32 weights, gradients and optimizer state; fp32 loss), as
    ``train.precision: bf16`` does. ``compiled``: the forward runs through ``torch.compile(model)`` (the optimizer
    stays eager); ``mohge bench compile``. ``adamw``: ``train.adamw`` (on a CPU ``auto`` is foreach). ``fused``: the
    fused path (``train.fused``, :func:`mohge.model.fused.use_fused`)."""

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        seq: int,
        seed: int = 0,
        bf16: bool = False,
        compiled: bool = False,
        adamw: str = "auto",
        fused: bool = False,
    ) -> None:
        train = TrainConfig(steps=10, warmup_steps=1, lr=1e-3, min_lr=1e-4, adamw=adamw)
        data = {"vocab_size": cfg.vocab_size, "seq_len": min(seq, cfg.max_seq_len)}
        self.run_cfg = RunConfig(name="bench", model=cfg, loss=LossConfig(), train=train, data=data)
        # the trainer's loss at the schedule's last step, where every aux term is on (group_aux from its start_frac)
        self.loss_step = train.steps - 1
        torch.manual_seed(seed)
        self.model = LanguageModel(cfg, self.run_cfg.loss).train()
        if fused:
            use_fused(self.model)
        self.net = torch.compile(self.model) if compiled else self.model
        self.opt = build_optimizer(self.model, train, fused=fused_adamw(train, torch.device("cpu")))
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.bf16 = bf16

    def step(self) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = compute_loss(self.net, self.x, self.y, self.run_cfg, self.loss_step)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def run(self, n: int) -> float:
        t0 = clock()
        for _ in range(n):
            self.step()
        return clock() - t0


def model_gemms(cfg: ModelConfig, batch: int, seq: int) -> list[tuple[int, int, int, int]]:
    """The forward GEMMs of one step as (m, k, n, count): attention projections and scores, routed experts at the
    uniform-routing row count, shared/dense FFNs, router, LM head (the backward runs the same FLOPs transposed)."""
    T, D, L, H = batch * seq, cfg.d_model, cfg.n_layers, cfg.n_heads
    dh = D // H
    ffn, K = cfg.ffn, cfg.router.topk
    moe_layers = L - ffn.dense_layers
    out = [(T, D, 3 * D, L), (T, D, D, L), (seq, dh, seq, 2 * L * batch * H), (T, D, cfg.vocab_size, 1)]
    out.append((T, D, ffn.num_experts, moe_layers))
    C = max(1, T * K // ffn.num_experts)
    for h in ffn.expert_widths:
        out += [(C, D, 2 * h, moe_layers * ffn.experts_per_group), (C, h, D, moe_layers * ffn.experts_per_group)]
    for h, n in ((ffn.shared_expert_width, moe_layers), (ffn.dense_width, ffn.dense_layers)):
        if h and n:
            out += [(T, D, 2 * h, n), (T, h, D, n)]
    return out


def measure(
    cfg: ModelConfig,
    batch: int = 8,
    seq: int = 256,
    steps: int = 10,
    warmup: int = 2,
    adamw: Sequence[str] = ("auto",),
    fused: bool = False,
) -> dict:
    """Tokens/s of MoHGE and of its ``moe_equal`` baseline, each in fp32 and under bf16 autocast; CPU MFU.

    Single steps of the four trainers alternate (the order flips every round) and each one's tokens/s is taken
    from its median step time, so load from other processes on a shared machine hits all alike. With one torch
    thread the clock is the thread's CPU time (:mod:`mohge.kernels.cpu_gemm`), otherwise the wall clock.
    MFU = model FLOPs/s (:func:`mohge.train.distributed.flops.model_flops_per_token`, forward + backward, attention
    included) over the GEMM rate this CPU measures in the same run on the model's own GEMM shapes.

    ``adamw``: the ``train.adamw`` implementations to time, each model and precision with each, in the same rounds; the
    first one's trainers are ``mohge_fp32`` ... as with one, the others' carry the name as a suffix
    (``mohge_fp32_fused``), and ``adamw_step_ratio`` divides each one's median step by the first's. ``fused``: every
    trainer on the fused path (``train.fused``)."""
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq))
    moe_cfg = derive(cfg, "moe_equal")
    impls = list(adamw)
    models = {
        f"{name}_{prec}" + ("" if impl == impls[0] else f"_{impl}"): Trainer(
            c, batch, seq, bf16=prec == "bf16", adamw=impl, fused=fused
        )
        for impl in impls
        for name, c in (("mohge", cfg), ("moe", moe_cfg))
        for prec in ("fp32", "bf16")
    }
    for t in models.values():
        t.run(warmup)
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(steps):
        for name in sorted(models, reverse=bool(r % 2)):
            times[name].append(models[name].run(1))
    tps = {name: batch * seq / statistics.median(ts) for name, ts in times.items()}
    shapes = model_gemms(cfg, batch, seq)
    rate = {prec: gemm_rate(shapes, dt) for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    flops_tok = {"mohge": model_flops_per_token(cfg, seq), "moe": model_flops_per_token(moe_cfg, seq)}
    mfu = {name: flops_tok[name.split("_")[0]] * v / rate[name.split("_")[1]] for name, v in tps.items()}
    ratio = {
        name: statistics.median(ts) / statistics.median(times[name.rsplit("_", 1)[0]])
        for name, ts in times.items()
        if name.count("_") == 2
    }
    ffn = cfg.ffn
    return {
        "tokens_per_s": tps,
        "ratio_mohge_over_moe": tps["mohge_fp32"] / tps["moe_fp32"],
        "ratio_mohge_over_moe_bf16": tps["mohge_bf16"] / tps["moe_bf16"],
        "ratio_bf16_over_fp32": tps["mohge_bf16"] / tps["mohge_fp32"],
        "ratio_bf16_over_fp32_moe": tps["moe_bf16"] / tps["moe_fp32"],
        "mfu_fp32": mfu["mohge_fp32"],
        "mfu_bf16": mfu["mohge_bf16"],
        "mfu": mfu,
        "adamw_step_ratio": ratio,
        "model_flops_per_token": flops_tok,
        "gemm_rate_flops": rate,
        "gemm_shapes": [list(s) for s in shapes],
        "step_seconds": times,
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "threads": torch.get_num_threads(),
        "loadavg": list(os.getloadavg()),
        "cpu_bf16": cpu_bf16_support(),
        "setup": {
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "batch": batch,
            "seq": seq,
            "mohge_widths": list(ffn.expert_widths),
            "experts": ffn.num_experts,
            "topk": cfg.router.topk,
            "group_topk": cfg.router.group_topk,
            "moe_width": moe_cfg.ffn.expert_widths[0],
            "backend": ffn.backend,
            "timed_steps": steps,
            "warmup_steps": warmup,
            "adamw": impls,
            "fused": fused,
        },
    }


def refuse_fused_without_compiler(ap: argparse.ArgumentParser, fused: bool) -> None:
    """``--fused`` refused before any trainer is built where no C++ compiler is found (the fused path needs one)."""
    if fused and preflight.cpp_compiler() is None:
        ap.error("--fused: the fused path needs a C++ compiler on a CPU ($CXX, else g++), and none was found")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge bench train",
        description="Training tokens/s of MoHGE vs a homogeneous MoE of equal activated FLOPs (moe_equal), "
        "fp32 and bf16 autocast on this CPU, and the CPU MFU of each, measured in one interleaved run.",
    )
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8, help="MoHGE groups (widths 128, 160, ... step 32)")
    ap.add_argument("--per-group", type=int, default=4, help="experts per group")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--backend", default="auto", choices=BACKENDS, help="expert backend of both models")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per trainer, alternating between them")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock; 0 = torch's default)")
    ap.add_argument(
        "--adamw",
        default="auto",
        help=f"train.adamw of the trainers, comma-separated of {', '.join(ADAMW_IMPLS)} (auto: foreach on a CPU); "
        "with several, each model and precision is timed with each, and the others' steps against the first's",
    )
    ap.add_argument(
        "--fused", action="store_true", help="every trainer on the fused path (train.fused: needs a C++ compiler)"
    )
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    refuse_fused_without_compiler(ap, args.fused)
    impls = args.adamw.split(",")
    if any(i not in ADAMW_IMPLS for i in impls) or len(set(impls)) != len(impls):
        ap.error(f"--adamw {args.adamw}: expected distinct values, comma-separated, of {', '.join(ADAMW_IMPLS)}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    kept = keep_freed_memory()  # as mohge.train.runtime.setup_runtime does
    cfg = bench_config(args.d_model, args.layers, args.groups, args.per_group)
    cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, backend=args.backend))
    res = measure(cfg, args.batch, args.seq, args.steps, args.warmup, impls, args.fused)
    res["freed_memory_kept"] = kept
    tps = res["tokens_per_s"]
    print(
        f"MoHGE fp32 {tps['mohge_fp32']:.0f} tok/s, bf16 {tps['mohge_bf16']:.0f} tok/s "
        f"(bf16/fp32 {res['ratio_bf16_over_fp32']:.2f}, target >= 1.6); MoE fp32 {tps['moe_fp32']:.0f}: "
        f"MoHGE/MoE {res['ratio_mohge_over_moe']:.3f} (bf16 {res['ratio_mohge_over_moe_bf16']:.3f}, target >= 1.0); "
        f"CPU MFU fp32 {res['mfu_fp32']:.2f}, bf16 {res['mfu_bf16']:.2f} (target >= 0.70); "
        f"{res['threads']} thread(s), {res['clock']} clock, load {res['loadavg'][0]:.1f}"
    )
    for name, r in res["adamw_step_ratio"].items():
        print(f"{name}: {r:.3f}x the step of {impls[0]}, MFU {res['mfu'][name]:.2f}")
    print(json.dumps(res))
    if args.json:
        write_json_atomic(args.json, res)
    return 0
