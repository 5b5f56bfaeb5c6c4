"""``mohge bench topk``: the fused path's top-k kernel (:mod:`mohge.model.topk`) against ATen's ``torch.topk``.

    mohge bench topk [--rows 10240] [--shapes 32:4,8:4] [--reps 50] [--json out.json]

Each shape ``n:k`` is a router's: the top k of n scores a token ([rows, n] floats, rows the tokens of a step). The two
run in turn, one call each per round (the order flipped every round), on the same scores, one torch thread, the clock
the thread's CPU time; a call's time is the median over the rounds, and the ratio is the kernel's over ATen's. The
scores are drawn as doubles and rounded to floats, so no row has two equal values, and the kernel's indices and
values must be ATen's: the record says whether they were.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import torch
from mohge.kernels.cpu_gemm import clock

from mohge.core.atomic import write_json_atomic
from mohge.model.topk import top_k

from .step import host


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"32:4,8:4"`` as [(32, 4), (8, 4)]; a malformed one is a ValueError naming it."""
    shapes = []
    for part in text.split(","):
        try:
            n, k = (int(v) for v in part.split(":"))
        except ValueError:
            raise ValueError(f"--shapes {text!r}: expected n:k pairs, comma-separated (e.g. 32:4,8:4)") from None
        if not 1 <= k <= n:
            raise ValueError(f"--shapes {text!r}: {part} needs 1 <= k <= n")
        shapes.append((n, k))
    return shapes


def measure(rows: int, shapes: Sequence[tuple[int, int]], reps: int) -> list[dict]:
    """One entry per shape: milliseconds per call of each, the ratio, whether the results were ATen's."""
    out = []
    for n, k in shapes:
        g = torch.Generator().manual_seed(n * 100 + k)
        v = torch.randn(rows, n, generator=g, dtype=torch.float64).float()
        want, got = torch.topk(v, k, dim=-1), top_k(v, k, native=True)  # also builds the kernel, untimed
        identical = torch.equal(got[1], want.indices) and torch.equal(got[0], want.values)
        calls = {
            "aten": lambda v=v, k=k: torch.topk(v, k, dim=-1),
            "kernel": lambda v=v, k=k: top_k(v, k, native=True),
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(reps):
            for name in sorted(calls, reverse=bool(r % 2)):
                t0 = clock()
                calls[name]()
                times[name].append(clock() - t0)
        ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
        out.append({"n": n, "k": k, "rows": rows, "ms": ms, "ratio": ms["kernel"] / ms["aten"], "identical": identical})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench topk", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--rows", type=int, default=10_240, help="rows (tokens) per call; the capacity study's step: 10 240"
    )
    ap.add_argument("--shapes", default="32:4,8:4", help="n:k per router top-k, comma-separated")
    ap.add_argument("--reps", type=int, default=50, help="rounds, one call of each per round")
    ap.add_argument("--json", help="also write the record here")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as err:
        ap.error(str(err))
    if args.rows < 1 or args.reps < 1:
        ap.error(f"--rows {args.rows} and --reps {args.reps}: both must be >= 1")
    torch.set_num_threads(1)
    results = measure(args.rows, shapes, args.reps)
    for r in results:
        print(
            f"top-{r['k']} of {r['n']}, {r['rows']} rows: ATen {r['ms']['aten']:.3f} ms, "
            f"kernel {r['ms']['kernel']:.3f} ms: {r['ratio']:.2f}x ATen's time (identical: {r['identical']})"
        )
    if args.json:
        record = {"bench": "topk", "clock": "thread_time", "threads": 1, "reps": args.reps, "host": host()}
        write_json_atomic(args.json, {**record, "results": results})
    return 0 if all(r["identical"] for r in results) else 1
