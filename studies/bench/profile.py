"""Where a training step's time goes, by aten op, in CPU time: fp32 against bf16 autocast, in one run.

    mohge bench profile [--json results/bench/profile_train_cpu.json] [--warmup 5]

A ``TorchDispatchMode`` times every aten op with the thread's CPU clock (``time.thread_time_ns``), so other
processes on a shared machine do not show up in the figures, as they do in ``torch.profiler``'s wall times. On a
CPU the backward runs on the calling thread, so the backward's ops are included. GEMMs are split into ``mm
expert`` (the routed experts' ragged GEMMs) and ``mm dense`` (attention, router, LM head: a dimension equal to
the step's token count). One thread; the model and batch are ``mohge bench train``'s.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GEMMS = ("mm", "addmm", "bmm", "_grouped_mm")


class OpTimer(TorchDispatchMode):
    """CPU milliseconds and call counts per aten op (GEMMs keyed by kind and dtype)."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.ms: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.thread_time_ns()
        out = func(*args, **(kwargs or {}))
        dt = time.thread_time_ns() - t0
        key = func.overloadpacket.__name__
        if key in GEMMS:
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            kind = "dense" if any(self.tokens in s for s in shapes) else "expert"
            key = f"{key} {kind} {str(args[0].dtype).removeprefix('torch.')}"
        self.ms[key] += dt / 1e6
        self.calls[key] += 1
        return out


def main(argv: list[str] | None = None) -> int:
    from mohge_studies.bench.train import Trainer, bench_config

    ap = argparse.ArgumentParser(prog="mohge bench profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--warmup", type=int, default=5, help="steps of each precision before the profiled one")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = bench_config()
    cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, backend=args.backend))
    batch, seq = 8, 256
    trainers = {p: Trainer(cfg, batch, seq, bf16=p == "bf16") for p in ("fp32", "bf16")}
    for _ in range(args.warmup):  # bf16 GEMM kernels are built per shape: profile a warm step
        for t in trainers.values():
            t.step()
    out: dict = {"loadavg": list(os.getloadavg()), "backend": args.backend, "warmup": args.warmup}
    out["clock"] = "thread_time"
    for prec, t in trainers.items():
        timer = OpTimer(batch * seq)
        c0 = time.thread_time()
        with timer:
            t.step()
        out[prec] = {"step_ms": 1e3 * (time.thread_time() - c0), "ops_ms": dict(timer.ms), "calls": dict(timer.calls)}
    ops = sorted(set(out["fp32"]["ops_ms"]) | set(out["bf16"]["ops_ms"]),
                 key=lambda k: -(out["fp32"]["ops_ms"].get(k, 0) + out["bf16"]["ops_ms"].get(k, 0)))  # fmt: skip
    print(f"step (with the timer): fp32 {out['fp32']['step_ms']:.0f} ms, bf16 {out['bf16']['step_ms']:.0f} ms")
    print(f"{'op':44s} {'fp32 ms':>9s} {'bf16 ms':>9s}")
    for k in ops[: args.top]:
        print(f"{k:44s} {out['fp32']['ops_ms'].get(k, 0):9.1f} {out['bf16']['ops_ms'].get(k, 0):9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0
