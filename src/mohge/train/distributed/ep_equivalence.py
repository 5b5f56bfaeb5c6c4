"""The expert-parallel layer against the single-process experts: a small fixed problem under every placement,
forward and backward, on CPU ranks (gloo), each placement run twice; rank 0 saves the inputs, the weights and the
gathered outputs and gradients of both runs, which the tests compare with ``swiglu_grouped_torch`` and with each
other (bitwise).

    torchrun --standalone --nproc-per-node 2 -m mohge.train.distributed.ep_equivalence --out FILE.pt
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mohge import kernels
from mohge.model.allocation import PLACEMENTS, place

from .ep_layer import ExpertParallelExperts

CHECK_WIDTHS = (8, 12, 16, 20)  # G = 4 width classes, symmetric (8 + 20 = 12 + 16)
CHECK_N, CHECK_D, CHECK_T, CHECK_K = 2, 16, 75, 3


def check_problem(seed: int = 0) -> dict:
    """The fixed small problem of ``check``: inputs, routing (expert 5 gets no token), weights, upstream grad."""
    g = torch.Generator().manual_seed(seed)
    E = len(CHECK_WIDTHS) * CHECK_N
    scores_TE = torch.rand(CHECK_T, E, generator=g)
    scores_TE[:, 5] = -1.0  # an expert that receives no token
    idx_TK = scores_TE.topk(CHECK_K, dim=-1).indices
    gates_TK = torch.softmax(torch.randn(CHECK_T, CHECK_K, generator=g), dim=-1)
    w1s = [torch.randn(CHECK_N, 2 * h, CHECK_D, generator=g) * 0.3 for h in CHECK_WIDTHS]
    w2s = [torch.randn(CHECK_N, CHECK_D, h, generator=g) * 0.3 for h in CHECK_WIDTHS]
    return {
        "x": torch.randn(CHECK_T, CHECK_D, generator=g),
        "idx": idx_TK,
        "gates": gates_TK,
        "w1s": w1s,
        "w2s": w2s,
        "dy": torch.randn(CHECK_T, CHECK_D, generator=g),
        "widths_E": [h for h in CHECK_WIDTHS for _ in range(CHECK_N)],
    }


def check(args: argparse.Namespace) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    p = check_problem(args.seed)
    widths_E, E = p["widths_E"], len(p["widths_E"])
    counts = torch.bincount(p["idx"].reshape(-1), minlength=E).tolist()
    part = np.array_split(np.arange(CHECK_T), world)[rank]
    flat_w1 = [w[j] for w in p["w1s"] for j in range(CHECK_N)]
    flat_w2 = [w[j] for w in p["w2s"] for j in range(CHECK_N)]
    results, repeats = {}, {}
    for strategy in [*args.strategies, *args.strategies]:  # every placement twice: the second run must be bitwise equal
        ranks = place(strategy, widths_E, world, counts, CHECK_N)
        weights = {e: (flat_w1[e].clone(), flat_w2[e].clone()) for e in range(E) if ranks[e] == rank}
        mod = ExpertParallelExperts(widths_E, ranks, rank, CHECK_D, weights, backend=args.backend)
        x = p["x"][part].clone().requires_grad_(True)
        gates = p["gates"][part].clone().requires_grad_(True)
        y = mod(x, p["idx"][part], gates)
        (y * p["dy"][part]).sum().backward()
        # Weight grads back to full class-major shapes; each expert lives on one rank, so a sum gathers them.
        dw1s = [torch.zeros_like(w) for w in p["w1s"]]
        dw2s = [torch.zeros_like(w) for w in p["w2s"]]
        for e in mod.local_experts:
            c, j = divmod(e, CHECK_N)
            dw1s[c][j], dw2s[c][j] = mod.local[str(e)].w1.grad, mod.local[str(e)].w2.grad
        for t in (*dw1s, *dw2s):
            dist.all_reduce(t)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, (y.detach(), x.grad, gates.grad))
        (repeats if strategy in results else results)[strategy] = {
            "rank_of_expert": ranks,
            "y": torch.cat([g[0] for g in gathered]),
            "dx": torch.cat([g[1] for g in gathered]),
            "dgates": torch.cat([g[2] for g in gathered]),
            "dw1s": dw1s,
            "dw2s": dw2s,
        }
    if rank == 0:
        torch.save({"problem": p, "world": world, "results": results, "repeats": repeats}, args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun ... -m mohge.train.distributed.ep_equivalence",
        description="EP forward/backward on a small fixed problem, saved for the tests.",
    )
    p.add_argument("--out", type=Path, required=True, help="file (.pt) for the gathered results")
    p.add_argument("--strategies", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS, metavar="STRATEGY")
    p.add_argument("--backend", default="torch", choices=kernels.BACKENDS)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return check(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
