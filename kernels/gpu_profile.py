"""Where a GPU forward+backward of the MoHGE layer spends its time: in kernels, or waiting on the host.

    python -m mohge.kernels.gpu_profile --out kernels_profile.json      (needs CUDA; kernels/gpu_check.sh runs it)

For each T and path of :mod:`mohge.kernels.bench` (the release's shapes, bf16), it times ``--iters`` forward+backward
passes by the wall clock (CUDA-synchronized), then profiles ``--profiled`` more with ``torch.profiler`` and sums the
device time of the CUDA kernels. ``gpu_busy_share`` = kernel time / wall time: near 1 the path is bound by its
kernels; far below 1 the GPU waits on the host (Python, dispatch, launches), which faster kernels cannot fix and
CUDA graphs or fewer launches can (``triton_graph``: the same kernels replayed from one CUDA graph). Writes one JSON
row per (T, path): wall_ms, kernel_ms, kernels_per_iter, gpu_busy_share (or ``error``, for a path that could not
run). Imports nothing beyond torch (tests/unit/test_gpu_check_imports.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence

import torch

from .bench import _runners

PATHS = ("triton", "triton_graph", "grouped_mm", "hom_grouped_mm")
TOKENS = (4096, 16384, 65536)


def kernel_ms(events: Iterable, iters: int) -> tuple[float, float]:
    """(milliseconds of CUDA kernel time per iteration, kernels per iteration) of profiler ``events``: the events on
    the device only (the host-side op events that launched them are not counted again)."""
    from torch.autograd import DeviceType

    kern = [e for e in events if e.device_type == DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kern) / iters / 1e3, len(kern) / iters


def profile_path(fwd_bwd, iters: int, profiled: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fwd_bwd()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fwd_bwd()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            fwd_bwd()
        torch.cuda.synchronize()
    ms, count = kernel_ms(prof.events(), profiled)
    return {"wall_ms": wall, "kernel_ms": ms, "kernels_per_iter": count, "gpu_busy_share": ms / wall}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mohge.kernels.gpu_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the JSON to write")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--iters", type=int, default=20, help="timed forward+backward passes (wall clock)")
    ap.add_argument("--profiled", type=int, default=5, help="profiled forward+backward passes (kernel time)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_profile: no CUDA device", file=sys.stderr)
        return 1
    rows = []
    for T in args.tokens:
        runners = _runners(T, torch.bfloat16, 0)
        for path in args.paths:
            try:
                row = {"T": T, "path": path, **profile_path(runners[path][1], args.iters, args.profiled)}
            except Exception as err:  # noqa: BLE001 - one path that cannot run (a graph not captured) is a row
                rows.append({"T": T, "path": path, "error": f"{type(err).__name__}: {str(err)[:400]}"})
                print(f"T={T:>6} {path:<15} failed: {rows[-1]['error']}", flush=True)
                continue
            print(
                f"T={T:>6} {path:<15} wall {row['wall_ms']:8.3f} ms, kernels {row['kernel_ms']:8.3f} ms "
                f"({row['kernels_per_iter']:.0f} a pass): GPU busy {row['gpu_busy_share']:.0%}",
                flush=True,
            )
            rows.append(row)
    rec = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": "bf16", "rows": rows}
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, args.out)  # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
