"""The utilization study's timing harness: under torchrun, each rank's expert compute timed per placement.

The expert-parallel layer itself (dispatch and combine with ``all_to_all_single``, autograd, placement) is
:class:`mohge.train.distributed.ep_layer.ExpertParallelExperts`, the one the trainer uses; this module only
drives it. Its correctness check against the single-process experts is :mod:`mohge.train.distributed.ep_equivalence`.

MEASUREMENT (``python -m torch.distributed.run --standalone --nproc-per-node N -m mohge_studies.analysis.ep_timing
measure --trace TRACE --out DIR``; usually launched by ``mohge utilization --measure``). For each
layer of the trace, the recorded routing (``.npz`` beside the trace), a routing rebuilt with exactly the
trace's counts (``--routing counts``) or a live router on random inputs (``--routing live``) is split over
the ranks by tokens and dispatched under every strategy allowed at EP = N; then each rank's local expert
compute on the rows it received is timed ``--repeats`` times after a warm-up and the median is kept (the
fastest repeat too). Timers: CUDA events on GPUs, ``time.perf_counter`` on CPU, where every rank runs
``torch.set_num_threads(1)``. Only the expert compute is timed, not the all-to-alls.

Timing method (``--timing``). ``sequential`` (the CPU default): ranks take turns, separated by barriers.
While one rank times its experts the others wait in the barrier; gloo waits block rather than spin
(measured: ~5 ms of CPU in a 3 s wait), so each timed turn runs alone. The turns are repeat-major over
strategies and ranks (repeat 0: strategy 0 ranks 0..N-1, strategy 1 ranks 0..N-1, ...; then repeat 1),
so a slow phase of a shared machine is spread over all of them, and by default every rank is pinned to the
same CPU (``--pin-cpu``), so every rank is timed on the same core. This makes per-rank timings comparable
when the ranks oversubscribe the cores (4 ranks on 2 cores); it measures each rank's compute time, whose
max over ranks is what a concurrent step on one device per rank would wait for. ``concurrent`` (the GPU
default): all ranks time at once after one barrier, one GPU per rank, and NVML utilization (``pynvml``,
optional: the columns stay empty without it) is sampled on each rank's GPU during its timed loop.

ONE DEVICE (``python -m mohge_studies.analysis.ep_timing measure-one --ranks N --trace TRACE --out DIR``; launched by
``mohge utilization --measure --one-device``): the same per-rank compute on one process and one device, for a machine
with fewer GPUs than ranks (one GPU, or a CPU). No process group: each rank's rows are the routed slots whose expert
the placement puts on that rank (exactly what ``dispatch`` would deliver it, every token of the layer being this
process's), and its local experts are timed on them in turns, repeat-major over strategies and ranks as in
``sequential``. ``timing`` is ``one_device``; on a GPU, NVML's utilization of the device is sampled over one further
block of at least ``--nvml-min-s`` seconds of each rank's compute (the busy share of that rank's kernels).

``measured.csv`` (written by rank 0): model, layer, strategy, ep_size, rank, experts, tokens, flops,
seconds, seconds_min, times_ms, repeats, timing, device, routing, gpu_util_pct, gpu_mem_util_pct. ``tokens`` are
the rows the rank actually received (checked equal to the analytic count), ``flops`` the analytic FLOPs of
those rows (:func:`mohge_studies.analysis.utilization.rank_loads`), ``seconds`` the median local compute time.

Legend: T tokens (of this rank), K experts per token, A = T*K routed slots, R rows received by this rank,
D model width, E experts, W ranks (= EP size), H intermediate width of one class.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mohge import kernels
from mohge.core.cli import setup_logging
from mohge.evaluate.traces import Trace, TraceError, load_replay, load_trace, routing_from_counts
from mohge.model.allocation import PLACEMENTS, place
from mohge.train.distributed.ep_layer import ExpertParallelExperts

from .utilization import rank_loads, write_csv

Tensor = torch.Tensor
log = logging.getLogger("mohge_studies.analysis.ep_timing")

MEASURED_COLUMNS = (
    "model",
    "layer",
    "strategy",
    "ep_size",
    "rank",
    "experts",
    "tokens",
    "flops",
    "seconds",
    "seconds_min",
    "times_ms",
    "repeats",
    "timing",
    "device",
    "routing",
    "gpu_util_pct",
    "gpu_mem_util_pct",
)


def expert_weights(e: int, width: int, d_model: int, seed: int, std: float = 0.02) -> tuple[Tensor, Tensor]:
    """Deterministic fp32 weights of expert e (W1 [2H, D], W2 [D, H]), the same on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + e)
    w1 = torch.randn(2 * width, d_model, generator=g) * std
    w2 = torch.randn(d_model, width, generator=g) * std
    return w1, w2


# --------------------------------------------------------------------------------------------------------------
# The torchrun worker


def _init() -> tuple[int, int, torch.device]:
    """Start the process group: nccl and one GPU per rank when CUDA is there, gloo on CPU otherwise."""
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun, e.g. python -m torch.distributed.run --standalone --nproc-per-node 2 ...")
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        if local >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} GPU(s) are visible")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        device = torch.device("cuda", local)
    else:
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


class _NvmlSampler:
    """Mean GPU and memory utilization (%) of this rank's GPU over a window; inert without pynvml or CUDA."""

    def __init__(self, device: torch.device, period_s: float = 0.005) -> None:
        self.handle, self.period_s, self.samples = None, period_s, []
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            p = torch.cuda.get_device_properties(device)
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            except pynvml.NVMLError:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
            self.nvml = pynvml
        except Exception as err:  # optional instrument: any failure means "no NVML numbers"
            log.info("NVML utilization unavailable: %s", err)
            self.handle = None

    def __enter__(self):
        self.samples, self._stop = [], threading.Event()
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            self.samples.append((u.gpu, u.memory))
            time.sleep(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.handle is not None:
            self._thread.join()

    def means(self) -> tuple[float | str, float | str]:
        if not self.samples:
            return "", ""
        return statistics.fmean(s[0] for s in self.samples), statistics.fmean(s[1] for s in self.samples)


def time_once(mod: ExpertParallelExperts, xs_RD: Tensor, le_R: Tensor, weights: tuple, train: bool) -> float:
    """Seconds of one run of this rank's expert compute (forward, or forward + backward) on ``weights``
    (the class-stacked leaves of :func:`_stacked`, so stacking is not timed)."""
    cuda = xs_RD.is_cuda
    xs_RD = xs_RD.detach()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    else:
        t0 = time.perf_counter()
    if train:
        out = mod.compute(xs_RD.requires_grad_(True), le_R, weights)
        out.backward(torch.ones_like(out))
    else:
        with torch.no_grad():
            mod.compute(xs_RD, le_R, weights)
    if cuda:
        end.record()
        torch.cuda.synchronize()
        dt = start.elapsed_time(end) / 1e3
    else:
        dt = time.perf_counter() - t0
    for w in (*weights[0], *weights[1]):
        w.grad = None
    return dt


def _stacked(mod: ExpertParallelExperts, train: bool) -> tuple[list[Tensor], list[Tensor]]:
    """The layer's class-stacked weights as leaves (gradients land on them when timing a backward)."""
    w1s, w2s = mod.class_weights()
    return [w.detach().requires_grad_(train) for w in w1s], [w.detach().requires_grad_(train) for w in w2s]


def time_entries(entries: list[dict], repeats: int, warmup: int, train: bool, sequential: bool, device) -> None:
    """Fill ``entry["times"]`` (``repeats`` timings, after ``warmup`` untimed runs) for every prepared entry.

    sequential: repeat-major turns over entries and ranks, each rank alone between two barriers (repeat 0:
    strategy 0 rank 0, 1, ..., W-1, strategy 1 rank 0, ...; then repeat 1, ...), so a slow phase of a
    shared machine is spread over all ranks and strategies instead of hitting one of them.
    concurrent: per entry, all ranks at once after one barrier, with NVML sampling on GPUs.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    for entry in entries:
        entry["times"], entry["util"] = [], ("", "")
    if sequential:
        for i in range(warmup + repeats):
            for entry in entries:
                for turn in range(world):
                    dist.barrier()
                    if turn == rank:
                        dt = time_once(entry["mod"], entry["xs_RD"], entry["le_R"], entry["weights"], train)
                        if i >= warmup:
                            entry["times"].append(dt)
                dist.barrier()
        return
    for entry in entries:
        sampler = _NvmlSampler(device)
        dist.barrier()
        with sampler:
            for i in range(warmup + repeats):
                dt = time_once(entry["mod"], entry["xs_RD"], entry["le_R"], entry["weights"], train)
                if i >= warmup:
                    entry["times"].append(dt)
        entry["util"] = sampler.means()


def _router_configs(args, trace: Trace):
    """The live router's sections: the run config's (``--config``), or, for a trace without a run (synthetic),
    a router over the trace's widths."""
    from mohge.config import FFNConfig, RouterConfig, load_run_config

    if args.config is not None:
        model = load_run_config(args.config).model
        if list(model.ffn.per_expert_widths) != trace.widths_E:
            raise SystemExit(f"--config {args.config}: its expert widths are not those of the trace {trace.path}")
        return model.ffn, model.router
    G = len(trace.expert_widths)
    kind = "mohge" if G >= 2 else "moe"
    ffn = FFNConfig(
        kind=kind, num_experts=trace.num_experts, expert_widths=tuple(trace.expert_widths), placement="contiguous"
    )
    return ffn, RouterConfig(topk=trace.topk or args.topk, group_topk=min(args.group_topk, G))


def _layer_routing(args, trace: Trace, replay, layer_pos: int, rank: int, world: int, device):
    """(this rank's x [T_r, D], idx [T_r, K], gates [T_r, K], global counts [E]) for one trace layer."""
    lay = trace.layers[layer_pos]
    D, E = args.d_model or trace.d_model, trace.num_experts
    g = torch.Generator().manual_seed(args.seed * 7919 + 31 * lay.layer + rank)
    if args.routing == "live":
        from mohge.model.routing import GroupedRouter, TopKRouter

        T = (trace.tokens or args.tokens) // world
        x_TD = torch.randn(T, D, generator=g)
        ffn, rcfg = _router_configs(args, trace)
        torch.manual_seed(args.seed + lay.layer)  # same router on every rank
        router = (GroupedRouter if ffn.kind == "mohge" else TopKRouter)(D, ffn, rcfg)
        with torch.no_grad():
            r = router(x_TD)
        idx_TK, gates_TK = r.idx_TK, r.gates_TK.float()
        counts = torch.bincount(idx_TK.reshape(-1), minlength=E).to(device)
        dist.all_reduce(counts)
        counts = counts.cpu()
    else:
        if replay is not None:
            idx_np, gates_np = replay[lay.layer]
        else:
            topk = trace.topk or args.topk
            idx_np, gates_np = routing_from_counts(lay.counts, topk, seed=args.seed + lay.layer)
        if args.max_tokens and idx_np.shape[0] > args.max_tokens:
            idx_np, gates_np = idx_np[: args.max_tokens], gates_np[: args.max_tokens]
        counts = torch.bincount(torch.from_numpy(idx_np).reshape(-1), minlength=E)
        part = np.array_split(np.arange(idx_np.shape[0]), world)[rank]
        idx_TK, gates_TK = torch.from_numpy(idx_np[part]), torch.from_numpy(gates_np[part])
        x_TD = torch.randn(len(part), D, generator=g)
    return x_TD.to(device), idx_TK.to(device), gates_TK.to(device), counts.tolist()


def _trace_and_routing(args: argparse.Namespace):
    """(trace, its replay or None, the routing used: replay or counts) for ``--trace`` and ``--routing``; a missing or
    malformed trace, or a replay asked for and absent, ends the command in one line."""
    try:
        trace = load_trace(args.trace)
        replay = load_replay(trace) if args.routing in ("auto", "replay") else None
    except TraceError as err:
        raise SystemExit(str(err)) from err
    if replay is None and args.routing == "replay":
        raise SystemExit(f"--routing replay: no replay file beside {args.trace} (expected a .npz)")
    return trace, replay, args.routing if args.routing != "auto" else ("replay" if replay is not None else "counts")


def measure(args: argparse.Namespace) -> int:
    rank, world, device = _init()
    setup_logging()
    trace, replay, routing_kind = _trace_and_routing(args)
    timing = args.timing if args.timing != "auto" else ("concurrent" if device.type == "cuda" else "sequential")
    if device.type == "cpu" and timing == "sequential" and args.pin_cpu != "none" and hasattr(os, "sched_setaffinity"):
        # All ranks on one core: each timed turn runs on the same core while the others block in a barrier.
        cpu = max(os.sched_getaffinity(0)) if args.pin_cpu == "auto" else int(args.pin_cpu)
        os.sched_setaffinity(0, {cpu})
        log.info("ranks pinned to CPU %d", cpu)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    D = args.d_model or trace.d_model
    widths_E = trace.widths_E
    layers = [i for i, lay in enumerate(trace.layers) if not args.layers or lay.layer in args.layers]
    if not layers:
        raise SystemExit(f"none of --layers {args.layers} is in the trace ({[lay.layer for lay in trace.layers]})")
    log.info(
        "EP=%d on %s (%s), routing %s, timing %s, d_model %d, %s, %d repeats",
        world,
        device,
        dist.get_backend(),
        routing_kind,
        timing,
        D,
        dtype,
        args.repeats,
    )
    rows = []
    for pos in layers:
        x_TD, idx_TK, gates_TK, counts = _layer_routing(args, trace, replay, pos, rank, world, device)
        x_TD = x_TD.to(dtype)
        layer_id = trace.layers[pos].layer
        y_first, entries = None, []
        for strategy in args.strategies:
            try:
                ranks = place(strategy, widths_E, world, counts, trace.experts_per_group)
            except ValueError as err:
                log.warning("skipping: %s", err)
                continue
            mine = [e for e in range(len(widths_E)) if ranks[e] == rank]
            weights = {
                e: tuple(w.to(device, dtype) for w in expert_weights(e, widths_E[e], D, args.seed)) for e in mine
            }
            mod = ExpertParallelExperts(widths_E, ranks, rank, D, weights, backend=args.backend).to(device)
            with torch.no_grad():
                xs_RD, le_R, plan = mod.dispatch(x_TD, idx_TK)
                y_TD = mod.combine(mod.compute(xs_RD, le_R), plan, gates_TK)
            # Every strategy holds the same experts (weights seeded per expert), so outputs must agree.
            if y_first is None:
                y_first = y_TD
            elif y_TD.numel():
                diff = (y_TD.float() - y_first.float()).abs().max().item()
                if diff > (1e-4 if dtype == torch.float32 else 5e-2):
                    log.warning("layer %s %s: output differs from the first strategy by %.3g", layer_id, strategy, diff)
            analytic = rank_loads(counts, widths_E, ranks, world, D, args.flop_mult)[rank]
            assert analytic["tokens"] == xs_RD.shape[0], (analytic["tokens"], xs_RD.shape[0])
            entries.append(
                {
                    "strategy": strategy,
                    "mod": mod,
                    "xs_RD": xs_RD,
                    "le_R": le_R,
                    "weights": _stacked(mod, args.train),
                    "analytic": analytic,
                }
            )
        time_entries(entries, args.repeats, args.warmup, args.train, timing == "sequential", device)
        for entry in entries:
            times, analytic = entry["times"], entry["analytic"]
            rows.append(
                {
                    "model": trace.model,
                    "layer": layer_id,
                    "strategy": entry["strategy"],
                    "ep_size": world,
                    "rank": rank,
                    "experts": analytic["experts"],
                    "tokens": analytic["tokens"],
                    "flops": analytic["flops"],
                    "seconds": statistics.median(times),
                    "seconds_min": min(times),
                    "times_ms": ";".join(f"{1e3 * t:.3f}" for t in times),
                    "repeats": len(times),
                    "timing": timing,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "routing": routing_kind,
                    "gpu_util_pct": entry["util"][0],
                    "gpu_mem_util_pct": entry["util"][1],
                }
            )
            log.info(
                "layer %s %-12s rank %d: %d rows, median %.2f ms",
                layer_id,
                entry["strategy"],
                rank,
                analytic["tokens"],
                1e3 * statistics.median(times),
            )
        del entries
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        all_rows = sorted((r for part in gathered for r in part), key=lambda r: (r["layer"], r["strategy"], r["rank"]))
        path = write_csv(all_rows, Path(args.out) / "measured.csv", MEASURED_COLUMNS)
        log.info("wrote %s (%d rows)", path, len(all_rows))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def local_rows(mod: ExpertParallelExperts, x_TD: Tensor, idx_TK: Tensor) -> tuple[Tensor, Tensor]:
    """(rows [R, D], local expert ids [R]) that rank ``mod.rank`` receives under its placement when every token of the
    layer is this process's: the routed slots whose expert lives on that rank, in slot order (what ``dispatch``
    delivers on one rank, without the all_to_all)."""
    T, K = idx_TK.shape
    flat_A = idx_TK.reshape(-1)
    mine_A = mod.rank_of_expert[flat_A] == mod.rank
    x_AD = x_TD[:, None].expand(T, K, x_TD.shape[1]).reshape(T * K, -1)
    return x_AD[mine_A], mod.local_id_of_expert[flat_A[mine_A]]


def _turns(entries: list[dict], repeats: int, warmup: int, train: bool) -> None:
    """``entry["times"]`` of every entry, repeat-major (repeat 0: every entry once, then repeat 1, ...)."""
    for entry in entries:
        entry["times"] = []
    for i in range(warmup + repeats):
        for entry in entries:
            dt = time_once(entry["mod"], entry["xs_RD"], entry["le_R"], entry["weights"], train)
            if i >= warmup:
                entry["times"].append(dt)


def _nvml_block(entry: dict, device, train: bool, min_s: float) -> tuple[float | str, float | str]:
    """NVML's mean GPU and memory utilization over at least ``min_s`` seconds of one entry's compute ("" off a GPU)."""
    if device.type != "cuda":
        return "", ""
    sampler = _NvmlSampler(device)
    with sampler:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < min_s:
            time_once(entry["mod"], entry["xs_RD"], entry["le_R"], entry["weights"], train)
    return sampler.means()


def measure_one_device(args: argparse.Namespace) -> int:
    """Every rank's local expert compute at EP = ``args.ranks``, in one process on one device (module docstring)."""
    setup_logging()
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
    if args.routing == "live":
        raise SystemExit("--routing live draws each rank's tokens under torchrun: use `measure`")
    trace, replay, routing_kind = _trace_and_routing(args)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    D, widths_E, world = args.d_model or trace.d_model, trace.widths_E, args.ranks
    layers = [i for i, lay in enumerate(trace.layers) if not args.layers or lay.layer in args.layers]
    if not layers:
        raise SystemExit(f"none of --layers {args.layers} is in the trace ({[lay.layer for lay in trace.layers]})")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    log.info("EP=%d on one device (%s), routing %s, d_model %d, %s, %d repeats", world, name, routing_kind, D, dtype,
             args.repeats)  # fmt: skip
    rows = []
    for pos in layers:
        x_TD, idx_TK, _, counts = _layer_routing(args, trace, replay, pos, 0, 1, device)
        x_TD, layer_id, entries = x_TD.to(dtype), trace.layers[pos].layer, []
        for strategy in args.strategies:
            try:
                ranks = place(strategy, widths_E, world, counts, trace.experts_per_group)
            except ValueError as err:
                log.warning("skipping: %s", err)
                continue
            analytic = rank_loads(counts, widths_E, ranks, world, D, args.flop_mult)
            for rank in range(world):
                mine = [e for e in range(len(widths_E)) if ranks[e] == rank]
                weights = {
                    e: tuple(w.to(device, dtype) for w in expert_weights(e, widths_E[e], D, args.seed)) for e in mine
                }
                mod = ExpertParallelExperts(widths_E, ranks, rank, D, weights, backend=args.backend).to(device)
                xs_RD, le_R = local_rows(mod, x_TD, idx_TK)
                assert analytic[rank]["tokens"] == xs_RD.shape[0], (analytic[rank]["tokens"], xs_RD.shape[0])
                weights = _stacked(mod, args.train)
                entries.append({"strategy": strategy, "rank": rank, "mod": mod, "xs_RD": xs_RD, "le_R": le_R,
                                "weights": weights, "analytic": analytic[rank]})  # fmt: skip
        _turns(entries, args.repeats, args.warmup, args.train)
        for entry in entries:
            times, a = entry["times"], entry["analytic"]
            util = _nvml_block(entry, device, args.train, args.nvml_min_s)
            rows.append({"model": trace.model, "layer": layer_id, "strategy": entry["strategy"], "ep_size": world,
                         "rank": entry["rank"], "experts": a["experts"], "tokens": a["tokens"], "flops": a["flops"],
                         "seconds": statistics.median(times), "seconds_min": min(times),
                         "times_ms": ";".join(f"{1e3 * t:.3f}" for t in times), "repeats": len(times),
                         "timing": "one_device", "device": name, "routing": routing_kind, "gpu_util_pct": util[0],
                         "gpu_mem_util_pct": util[1]})  # fmt: skip
            log.info("layer %s %-12s rank %d: %d rows, median %.3f ms", layer_id, entry["strategy"], entry["rank"],
                     a["tokens"], 1e3 * statistics.median(times))  # fmt: skip
        del entries
    rows.sort(key=lambda r: (r["layer"], r["strategy"], r["rank"]))
    path = write_csv(rows, Path(args.out) / "measured.csv", MEASURED_COLUMNS)
    log.info("wrote %s (%d rows)", path, len(rows))
    return 0


def _common_args(m: argparse.ArgumentParser) -> None:
    """The options `measure` and `measure-one` share."""
    m.add_argument("--trace", type=Path, required=True, help="routing trace JSON (format: mohge.evaluate.traces)")
    m.add_argument("--out", type=Path, required=True, help="folder for measured.csv")
    m.add_argument("--strategies", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS, metavar="STRATEGY")
    m.add_argument("--layers", nargs="+", type=int, help="layer ids to measure (default: all)")
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--warmup", type=int, default=1)
    m.add_argument("--d-model", type=int, help="override the trace's d_model for the timed experts")
    m.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="default fp32 on CPU, bf16 on GPU")
    m.add_argument("--backend", default="torch", choices=kernels.BACKENDS)
    m.add_argument("--train", action="store_true", help="time forward + backward")
    m.add_argument("--flop-mult", type=float, default=6.0)
    m.add_argument("--max-tokens", type=int, help="replay only the first N tokens of each layer")
    m.add_argument("--topk", type=int, default=6, help="experts per token when the trace has no 'topk'")
    m.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun ... -m mohge_studies.analysis.ep_timing",
        description="Per-rank timing of the expert-parallel expert layer for the utilization study (measure).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time each rank's expert compute for every strategy (measured.csv)")
    _common_args(m)
    m.add_argument("--routing", choices=("auto", "replay", "counts", "live"), default="auto")
    m.add_argument("--timing", choices=("auto", "sequential", "concurrent"), default="auto")
    m.add_argument(
        "--pin-cpu",
        default="auto",
        help="sequential CPU timing: pin every rank to this CPU ('auto': the last allowed one; 'none': no pinning)",
    )
    m.add_argument("--tokens", type=int, default=4096, help="live routing: tokens when the trace has none")
    m.add_argument("--group-topk", type=int, default=4, help="live routing: groups per token")
    m.add_argument("--config", type=Path, help="live routing: the run config whose router to use (widths checked)")
    one = sub.add_parser(
        "measure-one", help="the same per-rank timing for --ranks ranks on one device, one process (no torchrun)"
    )
    _common_args(one)
    one.add_argument("--ranks", type=int, required=True, help="EP size whose ranks are timed in turns")
    one.add_argument("--routing", choices=("auto", "replay", "counts"), default="auto")
    one.add_argument("--device", choices=("auto", "cpu"), default="auto", help="auto: the first GPU when there is one")
    one.add_argument("--nvml-min-s", type=float, default=0.5, help="GPU: seconds of each rank's NVML-sampled block")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return measure_one_device(args) if args.command == "measure-one" else measure(args)


if __name__ == "__main__":
    sys.exit(main())
