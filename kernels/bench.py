"""Benchmark of the grouped SwiGLU experts: on a GPU at the release's shapes, on a CPU at the CPU-training shapes.

Without CUDA (or with ``--cpu``) it times, forward+backward in fp32 and bf16, ``grouped_mm`` vs ``torch`` vs
``loop`` vs an equal-FLOP ``dense`` SwiGLU at two CPU model sizes (the claims study's D 128 and the ``bench train``
model's D 256, 8 widths x 4 experts, top-4, uniform random routing), each at T and 4T tokens, one thread, CPU time
of the thread, interleaved repetitions, median; it prints each path's time ratio for 4x the routed FLOPs (target
>= 3) and writes a JSON (``--json``) with the load average. On a GPU:

d_model 1024, 8 groups x 8 experts of widths 384, 512, ..., 1280, top-4 groups then top-6 experts among the
32 candidates (random routing, as the router does at initialisation), bf16. For each T it times, forward
and forward+backward (CUDA events through ``triton.testing.do_bench``, median):

* ``triton`` - :func:`mohge.kernels.swiglu.swiglu_grouped_triton`;
* ``triton_graph`` - the same kernels from device-built tables (:class:`mohge.kernels.capture.CapturablePlan`), the
  forward and the forward+backward each captured once in a CUDA graph and replayed (no host work per pass);
* ``dense``  - one dense SwiGLU pair of equal FLOPs: [T, D] x [D, 2 F] and [T, F] x [F, D], F = K * mean width;
* ``loop``   - the per-expert loop :func:`mohge.kernels.reference.swiglu_loop` (what the release runs);
* ``torch``  - the pure-torch grouped path :func:`mohge.kernels.reference.swiglu_grouped_torch`;
* ``grouped_mm`` - one ``F.grouped_mm`` per width class (:mod:`mohge.kernels.torch_grouped_mm`);
* ``hom_grouped_mm`` - the same call over experts of one width (the mean routed), the homogeneous reference;
* ``mm`` - the roofline of plain ``torch.mm`` at the layer's own M, N, K: the T K routed rows through one [D, 2 h]
  and one [h, D] weight (h the mean routed width), forward and its four backward products, no routing at all.

FLOPs = 2 T K D 3 h_mean forward (h_mean the routed slots' mean width), twice that for the backward.
Prints a table (ratios last: triton/dense and triton/loop are throughput ratios, > 1 means triton is
faster) and writes a CSV with columns device, date, T, path, pass, ms, tflops and, from :mod:`mohge.kernels.roofline`,
the share of the device's dense bf16 peak, the bar it meets (15 / 25 / 40 %), the ratio to ``hom_grouped_mm`` (a
homogeneous grouped_mm layer of equal FLOPs: experts of the mean routed width, goal >= 0.8), the TFLOP/s of the
``mm`` roofline measured in the same run at the same T and pass and each row's share of it, and for a decode-shaped
batch (``pass`` decode, 64 tokens) the bytes of expert weights read, GB/s and the share of HBM bandwidth.

    python -m mohge.kernels.bench --out results/kernels_bench.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

from .roofline import HOMOGENEOUS, annotate, summary

D_MODEL, GROUPS, PER_GROUP, GROUP_TOPK, TOPK = 1024, 8, 8, 4, 6
WIDTHS = [384 + 128 * g for g in range(GROUPS)]
PATHS = ("triton", "triton_graph", "grouped_mm", "hom_grouped_mm", "dense", "loop", "torch", "mm")
DECODE_T = 64  # tokens of one decode step of a batch: the weights read dominate, so bandwidth is the measure
CPU_PATHS = ("grouped_mm", "torch", "loop", "dense")
SIZE_KEYS = ("name", "d_model", "widths", "per_width", "topk", "T")
# CPU-training sizes: (name, d_model, widths, experts per width, top-k, T)
CPU_SIZES = (
    ("study_d128", 128, tuple(96 + 32 * g for g in range(8)), 4, 4, 512),
    ("bench_train_d256", 256, tuple(128 + 32 * g for g in range(8)), 4, 4, 512),
)
PASSES = ("fwd", "fwd+bwd")


def release_problem(T: int, dtype: torch.dtype, seed: int = 0, dev: str = "cuda"):
    """x [T, D], idx [T, K] (4 random groups, then 6 random experts of their 32), gates [T, K], weights."""
    g = torch.Generator(device=dev).manual_seed(seed)
    groups_TG = torch.rand(T, GROUPS, generator=g, device=dev).topk(GROUP_TOPK, dim=1).indices
    cand_TC = (groups_TG[:, :, None] * PER_GROUP + torch.arange(PER_GROUP, device=dev)).reshape(T, -1)
    pick_TK = torch.rand(T, cand_TC.shape[1], generator=g, device=dev).topk(TOPK, dim=1).indices
    idx_TK = cand_TC.gather(1, pick_TK)
    gates_TK = torch.softmax(torch.randn(T, TOPK, generator=g, device=dev), dim=1).to(dtype)
    x_TD = torch.randn(T, D_MODEL, generator=g, device=dev).to(dtype)
    w1s = [(0.02 * torch.randn(PER_GROUP, 2 * h, D_MODEL, generator=g, device=dev)).to(dtype) for h in WIDTHS]
    w2s = [(0.02 * torch.randn(PER_GROUP, D_MODEL, h, generator=g, device=dev)).to(dtype) for h in WIDTHS]
    return x_TD, idx_TK, gates_TK, w1s, w2s


def _dense_swiglu(x_TD, w1_2FD, w2_DF):
    a_TF, u_TF = F.linear(x_TD, w1_2FD).chunk(2, dim=-1)
    return F.linear(F.silu(a_TF) * u_TF, w2_DF)


def mm_roofline(A: int, D: int, h: int, dtype: torch.dtype, dev: str = "cuda", seed: int = 0):
    """(forward thunk, forward+backward thunk, FLOPs of the forward) of plain ``torch.mm`` at an expert layer's M, N, K:
    A routed rows [A, D] x [D, 2h] (gate and up) and [A, h] x [h, D] (down); the backward is the four products of
    their input and weight gradients, 2x the forward's FLOPs, as the layer's."""
    g = torch.Generator(device=dev).manual_seed(seed)

    def leaf(*shape, std=1.0):
        return (std * torch.randn(*shape, generator=g, device=dev)).to(dtype).requires_grad_()

    x_AD, h_AH, w1_D2H, w2_HD = leaf(A, D), leaf(A, h), leaf(D, 2 * h, std=0.02), leaf(h, D, std=0.02)
    dy = (
        torch.randn(A, 2 * h, generator=g, device=dev).to(dtype),
        torch.randn(A, D, generator=g, device=dev).to(dtype),
    )

    def fwd():
        return torch.mm(x_AD, w1_D2H), torch.mm(h_AH, w2_HD)

    return fwd, lambda: torch.autograd.grad(fwd(), [x_AD, h_AH, w1_D2H, w2_HD], dy), 2 * A * D * 3 * h


def _runners(T: int, dtype: torch.dtype, seed: int):
    """{path: (forward thunk, forward+backward thunk, FLOPs of the forward)}."""
    from .capture import CapturablePlan, cuda_graphed
    from .reference import swiglu_grouped_torch, swiglu_loop
    from .swiglu import swiglu_grouped_triton
    from .torch_grouped_mm import swiglu_grouped_mm

    x, idx, gates, w1s, w2s = release_problem(T, dtype, seed)
    h_mean = torch.tensor(WIDTHS, device=idx.device)[idx // PER_GROUP].float().mean().item()
    moe_leaves = [t.requires_grad_() for t in (x, gates, *w1s, *w2s)]
    moe_flops = 2 * T * TOPK * D_MODEL * 3 * h_mean
    F_dense = round(TOPK * h_mean)
    w1d = (0.02 * torch.randn(2 * F_dense, D_MODEL, device="cuda")).to(dtype).requires_grad_()
    w2d = (0.02 * torch.randn(D_MODEL, F_dense, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(T, D_MODEL, device="cuda").to(dtype)

    def timed(fwd, leaves, flops):
        return fwd, lambda: torch.autograd.grad(fwd(), leaves, dy), flops

    def moe(fn):
        return timed(lambda: fn(x, idx, gates, w1s, w2s), moe_leaves, moe_flops)

    # the homogeneous layer of equal FLOPs: the same tokens and routing over experts of one width (the mean routed)
    h = round(h_mean)
    w1h = (0.02 * torch.randn(GROUPS * PER_GROUP, 2 * h, D_MODEL, device="cuda")).to(dtype).requires_grad_()
    w2h = (0.02 * torch.randn(GROUPS * PER_GROUP, D_MODEL, h, device="cuda")).to(dtype).requires_grad_()
    hom = timed(
        lambda: swiglu_grouped_mm(x, idx, gates, [w1h], [w2h]), [x, gates, w1h, w2h], 2 * T * TOPK * D_MODEL * 3 * h
    )
    plan = CapturablePlan(w1s, w2s, T, TOPK)
    graph_fwd = cuda_graphed(lambda: plan(x, idx, gates))
    graph_fwd_bwd = cuda_graphed(lambda: torch.autograd.grad(plan(x, idx, gates), moe_leaves, dy))
    return {
        HOMOGENEOUS: hom,
        "triton": moe(swiglu_grouped_triton),
        "triton_graph": (graph_fwd, graph_fwd_bwd, moe_flops),
        "grouped_mm": moe(swiglu_grouped_mm),
        "dense": timed(lambda: _dense_swiglu(x, w1d, w2d), [x, w1d, w2d], 2 * T * D_MODEL * 3 * F_dense),
        "loop": moe(swiglu_loop),
        "torch": moe(swiglu_grouped_torch),
        "mm": mm_roofline(T * TOPK, D_MODEL, h, dtype, "cuda", seed),
    }


CSV_COLUMNS = ["device", "date", "T", "path", "pass", "ms", "tflops", "peak_tflops", "share_of_peak", "bar",
               "ratio_to_homogeneous", "mm_tflops", "share_of_mm", "bytes", "gbps", "share_of_hbm"]  # fmt: skip


def decode_bytes(idx_TK: torch.Tensor, itemsize: int) -> int:
    """Bytes of expert weights a step must read: each expert routed at least once, its [2h, D] and [D, h] pair."""
    used = torch.unique(idx_TK).tolist()
    return sum(3 * WIDTHS[e // PER_GROUP] * D_MODEL * itemsize for e in used)


def decode_rows(device: str, date: str, dtype: torch.dtype, args, do_bench) -> list[dict]:
    """Forward of a decode-shaped batch (DECODE_T tokens) through the Triton and grouped_mm paths, with the bytes of
    expert weights it reads (its measure is bandwidth, not FLOP/s)."""
    from .swiglu import swiglu_grouped_triton
    from .torch_grouped_mm import swiglu_grouped_mm

    x, idx, gates, w1s, w2s = release_problem(DECODE_T, dtype, args.seed)
    h_mean = torch.tensor(WIDTHS, device=idx.device)[idx // PER_GROUP].float().mean().item()
    flops, nbytes = 2 * DECODE_T * TOPK * D_MODEL * 3 * h_mean, decode_bytes(idx, x.element_size())
    out = []
    if "mm" in args.paths:  # the roofline of the same routed rows as plain torch.mm (forward only, as decode)
        mm_fwd, _, mm_flops = mm_roofline(DECODE_T * TOPK, D_MODEL, round(h_mean), dtype, "cuda", args.seed)
        with torch.no_grad():
            ms = do_bench(mm_fwd, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median")
        out.append({"device": device, "date": date, "T": DECODE_T, "path": "mm", "pass": "decode", "ms": ms,
                    "tflops": mm_flops / ms / 1e9})  # fmt: skip
    with torch.no_grad():
        for path, fn in (("triton", swiglu_grouped_triton), ("grouped_mm", swiglu_grouped_mm)):
            if path not in args.paths:
                continue
            ms = do_bench(lambda fn=fn: fn(x, idx, gates, w1s, w2s), warmup=args.warmup_ms, rep=args.rep_ms,
                          return_mode="median")  # fmt: skip
            out.append({"device": device, "date": date, "T": DECODE_T, "path": path, "pass": "decode", "ms": ms,
                        "tflops": flops / ms / 1e9, "bytes": nbytes})  # fmt: skip
    return out


def _table(rows: list[dict], paths: list[str]) -> str:
    head = ["T", "pass", *(f"{p} ms" for p in paths), *(f"{p} TF/s" for p in paths)]
    ratios = [(a, b) for a, b in (("triton", "dense"), ("triton", "loop")) if a in paths and b in paths]
    head += [f"{a}/{b}" for a, b in ratios]
    lines = []
    for T in sorted({r["T"] for r in rows}):
        for ps in PASSES:
            by = {r["path"]: r for r in rows if r["T"] == T and r["pass"] == ps}
            cells = [str(T), ps, *(f"{by[p]['ms']:.3f}" for p in paths), *(f"{by[p]['tflops']:.1f}" for p in paths)]
            cells += [f"{by[a]['tflops'] / by[b]['tflops']:.2f}x" for a, b in ratios]
            lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) for cells in [head, *lines])


def cpu_problem(T: int, D: int, widths, per: int, K: int, dtype: torch.dtype, seed: int = 0):
    """Uniform random top-K routing over all experts; weights as the model initialises them (std 0.02)."""
    g = torch.Generator().manual_seed(seed)
    idx_TK = torch.rand(T, per * len(widths), generator=g).topk(K, dim=1).indices
    gates_TK = torch.softmax(torch.randn(T, K, generator=g), dim=1).to(dtype).requires_grad_()
    x_TD = torch.randn(T, D, generator=g).to(dtype).requires_grad_()
    w1s = [(0.02 * torch.randn(per, 2 * h, D, generator=g)).to(dtype).requires_grad_() for h in widths]
    w2s = [(0.02 * torch.randn(per, D, h, generator=g)).to(dtype).requires_grad_() for h in widths]
    F_dense = K * sum(widths) // len(widths)
    dense = [(0.02 * torch.randn(*s, generator=g)).to(dtype).requires_grad_() for s in ((2 * F_dense, D), (D, F_dense))]
    return x_TD, idx_TK, gates_TK, w1s, w2s, dense


def cpu_step(path: str, prob) -> None:
    """One forward + backward of ``path`` on ``prob`` (:func:`cpu_problem`)."""
    from . import expert_swiglu

    x, idx, gates, w1s, w2s, (w1d, w2d) = prob
    y = _dense_swiglu(x, w1d, w2d) if path == "dense" else expert_swiglu(x, idx, gates, w1s, w2s, path)
    y.backward(torch.ones_like(y))


def cpu_main(args) -> int:
    import os
    import statistics

    from .cpu_gemm import clock, cpu_bf16_support

    torch.set_num_threads(args.threads)
    rows, ratios = [], {}
    for name, D, widths, per, K, T in CPU_SIZES:
        for dt_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            probs = {t: cpu_problem(t, D, widths, per, K, dtype, args.seed) for t in (T, 4 * T)}
            times = {(p, t): [] for p in CPU_PATHS for t in probs}
            for r in range(args.reps + 2):  # two warm-up rounds (bf16 kernels are built per shape)
                for p in CPU_PATHS if r % 2 else reversed(CPU_PATHS):
                    for t, prob in probs.items():
                        t0 = clock()
                        cpu_step(p, prob)
                        if r >= 2:
                            times[(p, t)].append(clock() - t0)
            for p in CPU_PATHS:
                ms = {t: 1e3 * statistics.median(times[(p, t)]) for t in probs}
                ratio = ms[4 * T] / ms[T]
                ratios[f"{name}_{dt_name}_{p}_time_4x_flops"] = ratio
                for t in probs:
                    rows.append({"size": name, "dtype": dt_name, "T": t, "path": p, "ms_fwd_bwd": ms[t]})
                line = f"{name:17s} {dt_name} {p:10s} T {T:5d}: {ms[T]:8.2f} ms  4T: {ms[4 * T]:8.2f} ms"
                print(f"{line}  time ratio for 4x FLOPs {ratio:.2f} (target >= 3)", flush=True)
            by = {(r["path"], r["T"]): r["ms_fwd_bwd"] for r in rows if r["size"] == name and r["dtype"] == dt_name}
            for t in probs:
                gd = by[("grouped_mm", t)] / by[("dense", t)]
                print(f"{name:17s} {dt_name} T {t:5d}: grouped_mm / dense {gd:.2f}, loop / grouped_mm "
                      f"{by[('loop', t)] / by[('grouped_mm', t)]:.2f}, torch / grouped_mm "
                      f"{by[('torch', t)] / by[('grouped_mm', t)]:.2f}")  # fmt: skip
    out = {
        "bench": "kernels_cpu",
        "threads": torch.get_num_threads(),
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "reps": args.reps,
        "loadavg": list(os.getloadavg()),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_bf16": cpu_bf16_support(),
        "sizes": [dict(zip(SIZE_KEYS, c, strict=True)) for c in CPU_SIZES],
        "rows": rows,
        **ratios,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mohge.kernels.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 16384, 65536], help="token counts")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--out", type=Path, default=None, help="CSV to write (device, date, T, path, pass, ms, tflops)")
    ap.add_argument("--warmup-ms", type=float, default=50.0)
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true", help="the CPU benchmark (the default without CUDA)")
    ap.add_argument("--reps", type=int, default=7, help="CPU: timed repetitions per path and size")
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch threads (1: CPU-time clock)")
    ap.add_argument("--json", help="CPU: write the timings and ratios here")
    args = ap.parse_args(argv)
    if args.cpu or not torch.cuda.is_available():
        return cpu_main(args)
    from triton.testing import do_bench

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    device, date = torch.cuda.get_device_name(), datetime.now(UTC).isoformat(timespec="seconds")
    rows = []
    for T in args.T:
        runners = _runners(T, dtype, args.seed)
        if "triton" in args.paths and "torch" in args.paths:
            with torch.no_grad():
                y_tri, y_ref = runners["triton"][0](), runners["torch"][0]()
            rel = ((y_tri.float() - y_ref.float()).abs().max() / y_ref.float().abs().max()).item()
            print(f"T={T:6d} check: max|triton - torch| / max|torch| = {rel:.2e}", flush=True)
        if "triton_graph" in args.paths:  # capture both graphs now: a path that cannot be captured is reported
            try:
                with torch.no_grad():
                    y_graph = runners["triton_graph"][0]().clone()
                runners["triton_graph"][1]()
                if "triton" in args.paths:
                    with torch.no_grad():
                        same = torch.equal(y_graph, runners["triton"][0]())
                    print(f"T={T:6d} check: triton_graph {'equals' if same else 'DIFFERS FROM'} triton bit for bit")
            except Exception as err:  # noqa: BLE001 - a path that cannot run is reported, the others still measured
                print(f"T={T:6d} triton_graph failed: {type(err).__name__}: {str(err)[:400]}", flush=True)
                args.paths = [p for p in args.paths if p != "triton_graph"]
        for path in args.paths:
            fwd, fwd_bwd, flops = runners[path]
            for ps, fn, mult in (("fwd", fwd, 1), ("fwd+bwd", fwd_bwd, 3)):
                ms = do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median")
                rows.append({"device": device, "date": date, "T": T, "path": path, "pass": ps, "ms": ms,
                             "tflops": mult * flops / ms / 1e9})  # fmt: skip
                print(f"T={T:6d} {path:6s} {ps:7s} {ms:9.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s", flush=True)
        del runners
        torch.cuda.empty_cache()
    rows += decode_rows(device, date, dtype, args, do_bench)
    rows = annotate(rows)
    print(f"\n{device}, {args.dtype}, d_model {D_MODEL}, widths {WIDTHS[0]}..{WIDTHS[-1]}, top-{TOPK}")
    print(_table([r for r in rows if r["pass"] != "decode"], args.paths))
    print("\nagainst the machine (kernels/roofline.py):", *summary(rows), sep="\n  ")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows({**r, "ms": f"{r['ms']:.4f}", "tflops": f"{r['tflops']:.2f}"} for r in rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
