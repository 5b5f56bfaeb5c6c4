"""Benchmarks: every figure is a ratio against a reference measured in the same run.

    mohge bench layer              # MoHGE layer vs dense SwiGLU of equal activated FLOPs vs per-expert loop (CPU)
    mohge bench kernels            # Triton grouped experts vs dense matmul, loop and torch path (needs a GPU)
    mohge bench train              # training tokens/s of MoHGE vs a homogeneous MoE of equal activated FLOPs
    mohge bench data               # data preparation vs tokenizers' encode_batch (tokens/s per core), peak RSS
    mohge bench eval               # lm-eval with each choice context computed once vs every request scored whole
    mohge bench inference          # trained models: prefill, cached decode, memory, FLOPs per token as routed,
                                   # validation perplexity along the cost knobs; MoHGE / MoE and / dense
    mohge bench peers              # MoE / MoHGE layers vs torchtitan's MoE and transformers' Qwen3-MoE block (CPU)
    mohge bench profile            # CPU time per aten op of a ``bench train`` step, fp32 and bf16, by phase
    mohge bench compile            # one run config's training step eager vs torch.compile: does compiling pay
    mohge bench step               # training tokens/s of this checkout vs a baseline commit on a study's run configs
    mohge bench front-door         # make test and make run in a fresh clone, timed, with the host's vector unit
    mohge bench topk               # the fused path's top-k kernel vs ATen's torch.topk on a router's shapes (CPU)

``python -m mohge_studies.bench ...`` is the same command (mohge.cli dispatches to it).

``layer`` times forward+backward of one MoE layer (router, routed experts, shared expert) on T tokens:
the MoHGE layer through the grouped torch path, the same layer through ``grouped_mm`` and through the
per-expert loop the official release runs, and a dense SwiGLU whose width is the MoHGE layer's activated
width under uniform routing (top-k x mean expert width + shared width), i.e. the same activated FLOPs.
Median of ``--reps`` runs after one warm-up run, the paths interleaved; with one thread (the default) the
clock is the thread's CPU time.

Owns: this package's ``layer`` benchmark and the command (``__main__``), `train` (<- train_bench: training
tokens/s of MoHGE against a homogeneous MoE), `data` (the data preparation against ``encode_batch``),
`inference` (<- inference: per-token serving cost of trained models and the route-override knob sweep) and
`peers` (one layer against torchtitan's and transformers' MoE layers), `profile` (one training step's CPU time per
aten op), `compile` (a run's training step eager against ``torch.compile``), `step` (this checkout's training step
against a baseline commit's, each in its own process, on a study's run configs), `front_door` (the README's two
commands in a fresh clone, timed, with the host they ran on), `topk` (the fused path's top-k kernel against
``torch.topk``).
``mohge.kernels.bench`` stays beside the kernels: GPU boxes run it without an install of this package.
May import: every layer below (core, config, model, data, train, evaluate, analysis) and mohge.kernels;
nothing imports mohge_studies.bench.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
from collections.abc import Callable, Sequence

import torch

from mohge.config import FFNConfig, LossConfig, RouterConfig
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.model.experts import SwiGLU
from mohge.model.moe import MoELayer

from .timing import time_fwd_bwd, time_interleaved

__all__ = ["main", "time_fwd_bwd", "time_interleaved"]


def layer_bench(args: argparse.Namespace) -> dict:
    D, T, G, n = args.d_model, args.tokens, args.groups, args.experts_per_group
    scale = D / 1024  # the release's widths 384..1280 at d_model 1024, scaled to this d_model
    widths = tuple(int(round((384 + 128 * g) * scale / 8)) * 8 for g in range(G))
    shared = 2 * D
    ffn = FFNConfig(kind="mohge", num_experts=G * n, expert_widths=widths, shared_expert_width=shared)
    router = RouterConfig(topk=args.topk, group_topk=args.group_topk)
    std, out_std = 0.02, 0.02
    torch.manual_seed(0)
    mohge = MoELayer(D, ffn, router, LossConfig(), std, out_std)
    loop = MoELayer(D, dataclasses.replace(ffn, backend="loop"), router, LossConfig(), std, out_std)
    loop.load_state_dict(mohge.state_dict())
    gmm = MoELayer(D, dataclasses.replace(ffn, backend="grouped_mm"), router, LossConfig(), std, out_std)
    gmm.load_state_dict(mohge.state_dict())
    dense_width = int(round(args.topk * sum(widths) / G)) + shared
    dense = SwiGLU(D, dense_width, std, out_std)
    x = torch.randn(1, T, D, requires_grad=True)

    def moe_fn(layer: MoELayer) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda inp: layer(inp)[0]

    paths = {"mohge": moe_fn(mohge), "dense": dense, "loop": moe_fn(loop), "grouped_mm": moe_fn(gmm)}
    results = {}
    for name, ts in time_interleaved(paths, x, args.reps).items():
        results[name] = statistics.median(ts)
        flops = 3 * 2 * T * D * 3 * dense_width  # fwd + bwd of the activated FFN
        print(f"  {name:<6} {1e3 * results[name]:9.1f} ms   {flops / results[name] / 1e9:7.1f} GFLOP/s (activated)")
    ratios = {
        "mohge_over_dense": results["mohge"] / results["dense"],
        "loop_over_mohge": results["loop"] / results["mohge"],
        "grouped_mm_over_dense": results["grouped_mm"] / results["dense"],
    }
    print(f"ratio MoHGE / dense = {ratios['mohge_over_dense']:.2f}   (target <= 1.25 at T 1024, <= 1.10 at T 8192)")
    print(f"ratio MoHGE grouped_mm / dense = {ratios['grouped_mm_over_dense']:.2f}")
    print(f"ratio loop / MoHGE  = {ratios['loop_over_mohge']:.2f}   (target >= 2)")
    return {
        "bench": "layer",
        "d_model": D,
        "tokens": T,
        "widths": list(widths),
        "experts_per_group": n,
        "topk": args.topk,
        "group_topk": args.group_topk,
        "dense_width": dense_width,
        "threads": torch.get_num_threads(),
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "loadavg": list(os.getloadavg()),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "seconds": results,
        **ratios,
    }


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    lay = sub.add_parser("layer", help="MoHGE layer vs dense SwiGLU of equal activated FLOPs vs per-expert loop")
    lay.add_argument("--d-model", type=int, default=512)
    lay.add_argument("--tokens", type=int, default=8192)
    lay.add_argument("--groups", type=int, default=8)
    lay.add_argument("--experts-per-group", type=int, default=8)
    lay.add_argument("--topk", type=int, default=6)
    lay.add_argument("--group-topk", type=int, default=4)
    lay.add_argument("--reps", type=int, default=3)
    lay.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock; 0: torch's default)")
    lay.add_argument("--json", help="write the timings and ratios here")
    # these two forward every argument, --help included, to their own parsers
    sub.add_parser("kernels", add_help=False, help="Triton kernels vs dense matmul, loop and torch path (GPU)")
    sub.add_parser("train", add_help=False, help="training tokens/s, MoHGE vs a homogeneous MoE of equal FLOPs")
    sub.add_parser("data", add_help=False, help="data preparation vs tokenizers' encode_batch, peak RSS (--mb)")
    sub.add_parser("precision", add_help=False, help="bf16 vs fp32 training of one run config: final val loss")
    sub.add_parser("eval", add_help=False, help="lm-eval with each choice context computed once vs scored whole")
    sub.add_parser("inference", add_help=False, help="trained models: prefill, decode, memory, FLOPs per token, knob")
    sub.add_parser("peers", add_help=False, help="MoE and MoHGE layers vs torchtitan's and transformers' MoE layers")
    sub.add_parser("profile", add_help=False, help="CPU time per aten op of one bench train step, by MoE phase")
    sub.add_parser("compile", add_help=False, help="a run config's training step, eager vs torch.compile")
    sub.add_parser("step", add_help=False, help="training tokens/s of this checkout vs a baseline commit")
    sub.add_parser("front-door", add_help=False, help="make test and make run in a fresh clone, timed, with the host")
    sub.add_parser("topk", add_help=False, help="the fused path's top-k kernel vs ATen's torch.topk (CPU)")
    args, rest = ap.parse_known_args(argv)
    if args.what == "kernels":
        from mohge.kernels.bench import main as kernels_main

        return kernels_main(rest)
    if args.what == "train":
        from .train import main as train_main

        return train_main(rest)
    if args.what == "data":
        from .data import main as data_main

        return data_main(rest)
    if args.what == "inference":
        from .inference import main as inference_main

        return inference_main(rest)
    if args.what == "precision":
        from .precision import main as precision_main

        return precision_main(rest)
    if args.what == "eval":
        from .evaluation import main as eval_main

        return eval_main(rest)
    if args.what == "peers":
        from .peers import main as peers_main

        return peers_main(rest)
    if args.what == "compile":
        from .compile import main as compile_main

        return compile_main(rest)
    if args.what == "step":
        from .step import main as step_main

        return step_main(rest)
    if args.what == "front-door":
        from .front_door import main as front_door_main

        return front_door_main(rest)
    if args.what == "topk":
        from .topk import main as topk_main

        return topk_main(rest)
    if args.what == "profile":
        from .profile import main as profile_main

        return profile_main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"layer benchmark: d_model {args.d_model}, T {args.tokens}, {args.groups}x{args.experts_per_group} experts")
    out = layer_bench(args)
    if args.json:
        write_json_atomic(args.json, out)
    return 0
