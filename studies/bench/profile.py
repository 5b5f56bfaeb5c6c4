"""Where a training step's time goes, by aten op, in CPU time: fp32 against bf16 autocast, in one run.

    mohge bench profile [--adamw fused] [--fused] [--steps 3] [--json results/bench/profile_train_amx.json]

A ``TorchDispatchMode`` times every aten op with the thread's CPU clock (``time.thread_time_ns``), so other
processes on a shared machine do not show up in the figures, as they do in ``torch.profiler``'s wall times. On a
CPU the backward runs on the calling thread, so the backward's ops are included. GEMMs are split into ``mm
expert`` (the routed experts' ragged GEMMs) and ``mm dense`` (attention, router, LM head: a dimension equal to
the step's token count). One thread; the model and batch are ``mohge bench train``'s. Each round takes one step of
each precision without the timer, then one with it (the order flips every round): the record holds both medians, so
what the timer itself adds is measured beside what it attributes. Every op falls in one of :data:`PHASES`. With
``--fused`` both trainers take the fused path (``train.fused``): the kernels inductor generates run outside the
dispatcher, so their time is in the step but in no op's row.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import time

import torch
from mohge.kernels.cpu_gemm import clock, cpu_bf16_support
from mohge_studies.bench.step import host
from torch.utils._python_dispatch import TorchDispatchMode

from mohge.config import ADAMW_IMPLS, BACKENDS
from mohge.core.atomic import write_json_atomic

GEMMS = ("mm", "addmm", "bmm", "_grouped_mm")
PRECISIONS = ("fp32", "bf16")
# where an op's time goes, in the order docs/speed.md lists it: (phase, whether an op key belongs to it)
PHASES = (
    ("GEMMs of the routed experts", lambda k: k.split(" ")[0] in GEMMS and " expert " in k),
    ("GEMMs of attention, routers and head", lambda k: k.split(" ")[0] in GEMMS and " dense " in k),
    ("attention's kernel", lambda k: "scaled_dot_product" in k or "flash_attention" in k),
    ("gradient clipping and the optimizer's update", lambda k: k.startswith(("_foreach_", "_fused_adam"))),
    ("autocast's casts", lambda k: k == "_to_copy"),
    ("everything else: element-wise, routing, losses", lambda k: True),
)


def phase_of(op: str) -> str:
    """The phase of :data:`PHASES` an op key of :class:`OpTimer` belongs to (the first that claims it)."""
    return next(name for name, claims in PHASES if claims(op))


class OpTimer(TorchDispatchMode):
    """CPU milliseconds and call counts per aten op (GEMMs keyed by kind and dtype). Graphs compiled by
    ``torch.compile`` run compiled under it (``ignore_compile_internals``): without it, torch.compile skips every
    function it meets under the mode, and goes on running them eagerly after the mode has ended."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

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


def profile(
    cfg, batch: int, seq: int, adamw: str = "auto", steps: int = 3, warmup: int = 5, fused: bool = False
) -> dict:
    """Per precision: the median step without and with the timer (ms), and per op and per phase the mean ms of a
    timed step (calls per step beside), from ``steps`` rounds after ``warmup`` steps of each (bf16 GEMM kernels are
    built per shape: the rounds see warm ones)."""
    from mohge_studies.bench.train import Trainer

    trainers = {p: Trainer(cfg, batch, seq, bf16=p == "bf16", adamw=adamw, fused=fused) for p in PRECISIONS}
    for _ in range(warmup):
        for t in trainers.values():
            t.step()
    timers = {p: OpTimer(batch * seq) for p in PRECISIONS}
    plain: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    timed: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for r in range(steps):
        for p in PRECISIONS[:: -1 if r % 2 else 1]:
            c0 = clock()
            trainers[p].step()
            plain[p].append(clock() - c0)
            c0 = clock()
            with timers[p]:
                trainers[p].step()
            timed[p].append(clock() - c0)
    out: dict = {}
    for p in PRECISIONS:
        ops = {k: v / steps for k, v in sorted(timers[p].ms.items(), key=lambda kv: -kv[1])}
        phases = {name: 0.0 for name, _ in PHASES}
        for k, v in ops.items():
            phases[phase_of(k)] += v
        out[p] = {
            "step_ms": 1e3 * statistics.median(plain[p]),
            "timed_step_ms": 1e3 * statistics.median(timed[p]),
            "ops_ms": ops,
            "calls": {k: timers[p].calls[k] / steps for k in ops},
            "phases_ms": phases,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    from mohge_studies.bench.train import bench_config, refuse_fused_without_compiler

    ap = argparse.ArgumentParser(prog="mohge bench profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=BACKENDS, help="expert backend of both trainers")
    ap.add_argument("--adamw", default="auto", choices=ADAMW_IMPLS, help="train.adamw of both trainers")
    ap.add_argument(
        "--fused", action="store_true", help="both trainers on the fused path (train.fused: needs a C++ compiler)"
    )
    ap.add_argument(
        "--steps", type=int, default=3, help="rounds: a step of each precision without, then with the timer"
    )
    ap.add_argument("--warmup", type=int, default=5, help="steps of each precision before the rounds")
    ap.add_argument("--top", type=int, default=25, help="ops printed")
    ap.add_argument("--json", help="also write the record here")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    refuse_fused_without_compiler(ap, args.fused)
    torch.set_num_threads(1)
    cfg = bench_config()
    cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, backend=args.backend))
    batch, seq = 8, 256
    res = profile(cfg, batch, seq, args.adamw, args.steps, args.warmup, args.fused)
    if args.json:  # written before the printing, which a closed pipe may stop
        res.update(
            backend=args.backend,
            adamw=args.adamw,
            fused=args.fused,
            steps=args.steps,
            warmup=args.warmup,
            batch=batch,
            seq=seq,
            d_model=cfg.d_model,
            clock="thread_time",
            threads=torch.get_num_threads(),
            loadavg=list(os.getloadavg()),
            machine=host(),
            cpu_bf16=cpu_bf16_support(),
        )
        write_json_atomic(args.json, res)
    fp32, bf16 = res["fp32"], res["bf16"]
    print(f"step without the timer: fp32 {fp32['step_ms']:.0f} ms, bf16 {bf16['step_ms']:.0f} ms; with it: "
          f"{fp32['timed_step_ms']:.0f} / {bf16['timed_step_ms']:.0f} ms")  # fmt: skip
    print(f"{'phase':50s} {'fp32 ms':>9s} {'bf16 ms':>9s}")
    for name, _ in PHASES:
        print(f"{name:50s} {fp32['phases_ms'][name]:9.1f} {bf16['phases_ms'][name]:9.1f}")
    ops = sorted(set(fp32["ops_ms"]) | set(bf16["ops_ms"]),
                 key=lambda k: -(fp32["ops_ms"].get(k, 0) + bf16["ops_ms"].get(k, 0)))  # fmt: skip
    print(f"\n{'op':50s} {'fp32 ms':>9s} {'bf16 ms':>9s}")
    for k in ops[: args.top]:
        print(f"{k:50s} {fp32['ops_ms'].get(k, 0):9.1f} {bf16['ops_ms'].get(k, 0):9.1f}")
    return 0
