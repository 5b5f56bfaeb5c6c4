"""Timing of one forward+backward, shared by the layer benchmarks (``layer``, ``peers``).

With one torch thread the clock is the thread's CPU time (:func:`mohge.kernels.cpu_gemm.clock`), so other processes
on a shared machine do not count; paths are interleaved so that what does count hits all alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from mohge.kernels.cpu_gemm import clock


def time_fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reps: int) -> list[float]:
    """Seconds per forward+backward, one warm-up run first (CPU time of the thread with one torch thread)."""
    times = []
    for i in range(reps + 1):
        x.grad = None
        t0 = clock()
        fn(x).sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        if i:
            times.append(clock() - t0)
    return times


def time_interleaved(paths: dict[str, Callable], x: torch.Tensor, reps: int) -> dict[str, list[float]]:
    """:func:`time_fwd_bwd` of every path, one repetition of each in turn (order flipped every round)."""
    for fn in paths.values():
        time_fwd_bwd(fn, x, 0)
    times: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(reps):
        for name in sorted(paths, reverse=bool(r % 2)):
            times[name] += time_fwd_bwd(paths[name], x, 1)
    return times
