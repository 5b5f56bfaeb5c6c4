"""This CPU's matrix units, detected and measured at run time: bf16 support and GEMM rates.

Machines of one kind differ: one CPU runs bf16 GEMMs about 2x faster than fp32 (``avx512_bf16``, oneDNN), another
(AVX2 only) about 20x slower. Nothing here is hard-coded: :func:`cpu_bf16_support` reads the ISA flags torch
sees and times a short GEMM in both dtypes; :func:`gemm_rate` measures FLOP/s at given shapes (the denominator
of the CPU MFU in ``mohge bench train``).

With one torch thread, times are the calling thread's CPU time (``time.thread_time``): on a shared machine wall
time counts other processes' time slices, CPU time does not. With several threads the wall clock is used (their
CPU time would include spin-waits).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

Tensor = torch.Tensor


def clock() -> float:
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def isa_flags() -> dict[str, bool]:
    """bf16-relevant ISA flags as torch sees them, and whether oneDNN takes bf16 here."""
    caps = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else ""
    flags: dict[str, bool] = {}
    get = getattr(torch.cpu, "get_capabilities", None)
    if get is not None:
        have = get()
        flags = {k: bool(have.get(k, False)) for k in ("avx512_bf16", "amx_bf16", "avx512_f", "avx2")}
    mkldnn_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    flags["mkldnn_bf16"] = bool(mkldnn_bf16()) if mkldnn_bf16 is not None else False
    flags["aten_capability"] = caps  # type: ignore[assignment]
    return flags


def time_gemm(m: int, k: int, n: int, dtype: torch.dtype, reps: int = 10) -> float:
    """Median seconds of one [m, k] x [k, n] product (after two warm-up calls)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(2):
        a @ b
    ts = []
    for _ in range(reps):
        t0 = clock()
        a @ b
        ts.append(clock() - t0)
    return statistics.median(ts)


def gemm_rate(shapes: Sequence[tuple[int, int, int, int]], dtype: torch.dtype, rounds: int = 3) -> float:
    """FLOP/s of a mix of GEMMs, each ``(m, k, n, weight)`` weighted by how often it runs (its FLOPs share).

    The rate is total FLOPs over total time of the mix: what a model made of exactly these GEMMs would reach.
    """
    flops = sum(2.0 * m * k * n * w for m, k, n, w in shapes)
    secs = [sum(time_gemm(m, k, n, dtype, reps=5) * w for m, k, n, w in shapes) for _ in range(rounds)]
    return flops / statistics.median(secs)


def cpu_bf16_support(m: int = 256, k: int = 256, n: int = 256, reps: int = 10) -> dict:
    """ISA flags plus a measured fp32 / bf16 GEMM time ratio (> 1: bf16 is faster), interleaved in one run, on one
    thread (CPU-time clock: robust to other processes on the machine; the caller's thread count is restored)."""
    flags = isa_flags()
    f32, b16 = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            f32.append(time_gemm(m, k, n, torch.float32, reps))
            b16.append(time_gemm(m, k, n, torch.bfloat16, reps))
    finally:
        torch.set_num_threads(threads)
    ratio = statistics.median(f32) / statistics.median(b16)
    units = flags.get("avx512_bf16", False) or flags.get("amx_bf16", False)
    return {
        **flags,
        "bf16_units": bool(units and flags["mkldnn_bf16"]),
        "gemm_shape": [m, k, n],
        "gemm_fp32_over_bf16_time": ratio,
        "threads": 1,
    }
