"""One MoE layer's forward+backward against the layers a user would pick instead: torchtitan and transformers.

    mohge bench peers [--shapes d128,d256,release] [--dtypes fp32,bf16] [--reps 5]
                                [--json results/bench/peers_cpu.json] [--doc docs/benchmarks.md]

Every layer gets the same problem: d_model D, T tokens, E routed experts of width F, top-K, no shared expert.

* ours, homogeneous ``moe`` (:class:`mohge.model.moe.MoELayer`): flat top-K router, one backend per path:
  ``moe`` (the default CPU path, ``torch``) and ``moe_grouped_mm`` (``grouped_mm``);
* ours, ``mohge``: G groups of E/G experts, widths spread around F with mean F (equal activated FLOPs under
  uniform routing), the two-level router; ``mohge`` and ``mohge_grouped_mm``;
* ours on the fused path (``train.fused``, :func:`mohge.model.fused.use_fused`; other roundings, an opt-in of new
  runs): ``moe_fused`` and ``mohge_fused``, the ``torch`` backend with the same weights as ``moe`` and ``mohge``
  (compiled routers, the routers' top-k and the experts' SiLU products through kernels of our own, the experts of an
  fp32 layer in a transposed buffer per width class); timed only where the C++ compiler it needs is found;
* ``torchtitan`` (``torchtitan.models.common.moe.MoE``: ``TokenChoiceTopKRouter``, ``LocalTokenDispatcher``,
  ``GroupedExperts`` on ``torch._grouped_mm``), softmax scores renormalised over the top-K, no load-balance bias;
* ``hf_<impl>``: transformers' ``Qwen3MoeSparseMoeBlock`` through each experts implementation that runs on a
  CPU (``eager``: a loop over experts; ``grouped_mm``; ``batched_mm``, which gathers one [2F, D] weight copy per
  routed slot).

The routers agree: top-K of the logits, gates the softmax over the chosen K (Qwen3's ``norm_topk_prob``). The peers
get our homogeneous layer's router and expert weights, so all route every token alike and compute the same
function; :func:`check_agreement` checks their outputs against ours. ``fp32``: parameters and input in fp32;
``bf16``: both in bf16. torchtitan's ``GroupedExperts`` casts activations and weights to bf16 in every case, so
its fp32 row is a bf16 expert computation (recorded in the output as ``expert_dtype``).

Timing as :func:`.timing.time_interleaved`: one torch thread (clock: the thread's CPU time), one warm-up
run, the paths interleaved, median of ``--reps``. Our layers run in training mode, so they also compute their aux
loss in the forward (not backpropagated); the peers' layers compute none. A path slower than ``SLOW_FACTOR``
times the fastest after its warm-up, or whose buffers would pass ``MAX_GATHER_BYTES``, is skipped with the reason.
Then ``GEMM_REPS`` rounds of the paths under an op timer give each one's share of time in its GEMMs
(:func:`gemm_shares`). Last, the layer's expert GEMMs are timed alone, each shape repeated on operands kept in cache
(:func:`layer_gemms`, :func:`mohge.kernels.cpu_gemm.gemm_rate`): the time the layer's expert FLOPs take at that rate,
over the fastest same-dtype peer's time (``gemm_floor_over_fastest_same_dtype_peer``), is what any path computing those
FLOPs in those GEMMs would reach if nothing else took time. The process keeps the memory a run frees, as a training
process does.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from mohge.kernels.cpu_gemm import cpu_bf16_support, gemm_rate

from mohge.config import FFNConfig, LossConfig, RouterConfig, preflight
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError
from mohge.model.fused import use_fused
from mohge.model.moe import MoELayer
from mohge.train.runtime import keep_freed_memory

from .step import cpu_name
from .step_worker import op_times
from .timing import time_fwd_bwd

Tensor = torch.Tensor

# The versions measured, pinned in constraints.txt (spmd_types: torchtitan's own import).
PEER_PACKAGES = {"torchtitan": "0.3.0", "transformers": "5.24.0", "spmd_types": "0.2.3"}
HF_IMPLS = ("eager", "grouped_mm", "batched_mm")
SLOW_FACTOR = 10.0
# our paths, in the order of the tables
OURS = ("moe", "moe_grouped_mm", "mohge", "mohge_grouped_mm", "moe_fused", "mohge_fused")
MAX_GATHER_BYTES = 2 << 30
# the aten ops a path's GEMMs reach the dispatcher as (torch.mm, F.linear, torch.bmm, F.grouped_mm and their forms)
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm")
GEMM_REPS = 3  # op-timed rounds of the paths, after the timed ones: the median share of each
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STD = 0.02


@dataclasses.dataclass(frozen=True)
class Shape:
    """One problem. ``widths``: MoHGE's G group widths (mean ``width``); ``group_topk``: its groups per token."""

    name: str
    d_model: int
    tokens: int
    experts: int
    width: int
    topk: int
    widths: tuple[int, ...]
    group_topk: int

    def spec(self) -> dict:
        return {**dataclasses.asdict(self), "widths": list(self.widths)}  # as the JSON record reads back


def _spread(mean: int, groups: int, step: int) -> tuple[int, ...]:
    """G widths ``step`` apart with mean ``mean`` (G even: mean +- step/2, +- 3 step/2, ...)."""
    lo = mean - step * (groups - 1) // 2
    return tuple(lo + step * g for g in range(groups))


# d128 and d256 are the CPU training bench's MoHGE (8 groups x 4, top-4 in top-4 groups; mean width 120 / 240).
# release: the release's 8 x 8 experts, top-6 in top-4 groups and widths 384..1280 at d_model 1024, at half scale
# (d_model 512, widths 192..640, mean 416) and 4096 tokens, so one forward+backward takes seconds on one core.
SHAPES = {
    "d128": Shape("d128", 128, 2048, 32, 120, 4, _spread(120, 8, 16), 4),
    "d256": Shape("d256", 256, 4096, 32, 240, 4, _spread(240, 8, 32), 4),
    "release": Shape("release", 512, 4096, 64, 416, 6, _spread(416, 8, 64), 4),
}


def peer_versions() -> dict[str, str]:
    """Installed versions of the peer packages; a ConfigError naming the first one missing."""
    out = {}
    for name in PEER_PACKAGES:
        if importlib.util.find_spec(name) is None:
            pin = PEER_PACKAGES["torchtitan"]
            raise ConfigError(
                f"peer package {name!r} is not installed: pip install --no-deps torchtitan=={pin}"
                " && pip install -e '.[peers]' (docs/benchmarks.md)"
            )
        out[name] = importlib.metadata.version(name)
    return out


# Our layers


def expert_flops(shape: Shape) -> float:
    """FLOPs of a forward+backward of the layer's routed experts (SwiGLU: [D, 2F] and [F, D] per slot, the backward
    twice the forward), at the mean width F: MoHGE's under uniform routing over its groups too."""
    return 3 * 2 * shape.tokens * shape.topk * 3 * shape.d_model * shape.width


def layer_gemms(shape: Shape) -> list[tuple[int, int, int, int]]:
    """The forward GEMMs of the homogeneous layer's experts under uniform routing, as ``(m, k, n, count)`` for
    :func:`~mohge.kernels.cpu_gemm.gemm_rate`: each expert's rows [C, D] x [D, 2F] and [C, F] x [F, D] (the backward
    runs the same FLOPs transposed)."""
    C = max(1, shape.tokens * shape.topk // shape.experts)
    return [(C, shape.d_model, 2 * shape.width, shape.experts), (C, shape.width, shape.d_model, shape.experts)]


def our_layer(shape: Shape, kind: str, backend: str) -> MoELayer:
    if kind == "moe":  # one width: the all-size placement (the default) needs several
        widths, placement = (shape.width,), "contiguous"
    else:
        widths, placement = shape.widths, "all_size"
    ffn = FFNConfig(
        kind=kind, num_experts=shape.experts, expert_widths=widths, shared_expert_width=0, placement=placement
    )
    ffn = dataclasses.replace(ffn, backend=backend)
    router = RouterConfig(topk=shape.topk, group_topk=shape.group_topk)
    return MoELayer(shape.d_model, ffn, router, LossConfig(), STD, STD).train()


# The peers, holding our homogeneous layer's weights


def torchtitan_layer(ours: MoELayer) -> torch.nn.Module:
    from torchtitan.models.common.config_utils import make_moe_config, make_router_config
    from torchtitan.models.common.moe import GroupedExperts, RoutedExperts
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    (w1,), (w2,) = ours.experts.w1, ours.experts.w2  # [E, 2F, D], [E, D, F]
    E, two_f, D = w1.shape
    F, K = two_f // 2, ours.router.K
    init = {"weight": torch.nn.init.zeros_}
    cfg = make_moe_config(
        num_experts=E,
        router=make_router_config(
            dim=D, num_experts=E, gate_param_init=init, top_k=K, score_func="softmax", route_norm=True
        ),
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=K),
        ),
        load_balance_coeff=None,
    )
    layer = cfg.build()
    experts = layer.routed_experts.inner_experts
    with torch.no_grad():
        layer.router.gate.weight.copy_(ours.router.router.weight)
        experts.w1_EFD.copy_(w1[:, :F])  # gate projection
        experts.w3_EFD.copy_(w1[:, F:])  # up projection
        experts.w2_EDF.copy_(w2)
    return layer.train()


def hf_layer(ours: MoELayer, impl: str) -> torch.nn.Module:
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    (w1,), (w2,) = ours.experts.w1, ours.experts.w2
    E, two_f, D = w1.shape
    cfg = Qwen3MoeConfig(
        hidden_size=D, moe_intermediate_size=two_f // 2, num_experts=E, num_experts_per_tok=ours.router.K,
        norm_topk_prob=True, hidden_act="silu",
    )  # fmt: skip
    cfg._experts_implementation = impl
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        block.gate.weight.copy_(ours.router.router.weight)
        block.experts.gate_up_proj.copy_(w1)  # rows [0, F) gate, [F, 2F) up: our layout
        block.experts.down_proj.copy_(w2)
    return block.train()


def gather_bytes(shape: Shape, impl: str, dtype: torch.dtype) -> int:
    """Bytes of the per-slot weight copies ``batched_mm`` gathers (forward copies and their gradients)."""
    if impl != "batched_mm":
        return 0
    per_slot = 3 * shape.width * shape.d_model * torch.finfo(dtype).bits // 8
    return 2 * shape.tokens * shape.topk * per_slot


def build_paths(shape: Shape, dtype: torch.dtype, peers: bool) -> tuple[dict[str, torch.nn.Module], dict[str, str]]:
    """Every layer of the comparison, in ``dtype``; and the paths skipped before timing, with the reason."""
    torch.manual_seed(0)
    moe = our_layer(shape, "moe", "torch")
    layers = {"moe": moe, "moe_grouped_mm": our_layer(shape, "moe", "grouped_mm")}
    layers["moe_grouped_mm"].load_state_dict(moe.state_dict())
    torch.manual_seed(1)
    layers["mohge"] = our_layer(shape, "mohge", "torch")
    layers["mohge_grouped_mm"] = our_layer(shape, "mohge", "grouped_mm")
    layers["mohge_grouped_mm"].load_state_dict(layers["mohge"].state_dict())
    skipped = {}
    for kind in ("moe", "mohge"):
        if preflight.cpp_compiler() is None:
            skipped[f"{kind}_fused"] = "no C++ compiler ($CXX, else g++): the fused path needs one on a CPU"
            continue
        layers[f"{kind}_fused"] = our_layer(shape, kind, "torch")
        layers[f"{kind}_fused"].load_state_dict(layers[kind].state_dict())
        use_fused(layers[f"{kind}_fused"])
    if peers:
        layers["torchtitan"] = torchtitan_layer(moe)
        for impl in HF_IMPLS:
            nbytes = gather_bytes(shape, impl, dtype)
            if nbytes > MAX_GATHER_BYTES:
                skipped[f"hf_{impl}"] = f"gathers {nbytes / 2**30:.1f} GiB of per-slot weight copies"
                continue
            layers[f"hf_{impl}"] = hf_layer(moe, impl)
    return {name: layer.to(dtype) for name, layer in layers.items()}, skipped


def forward_fn(layer: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    if isinstance(layer, MoELayer):
        return lambda x: layer(x)[0]
    return layer


def check_agreement(layers: dict[str, torch.nn.Module], x: Tensor) -> dict[str, float]:
    """Max |y_path - y_moe| / max |y_moe| of every path that holds our homogeneous layer's weights."""
    with torch.no_grad():
        ref = forward_fn(layers["moe"])(x).float()
        scale = ref.abs().max().item()
        return {
            name: (forward_fn(layer)(x).float() - ref).abs().max().item() / scale
            for name, layer in layers.items()
            if not name.startswith("mohge")
        }


def time_paths(fns: dict[str, Callable], x: Tensor, reps: int) -> tuple[dict[str, float], dict[str, str]]:
    """Median seconds per forward+backward of each path (interleaved), after dropping any peer slower than
    ``SLOW_FACTOR`` x the fastest path on its warm-up run."""
    warm = {}
    for name, fn in fns.items():
        time_fwd_bwd(fn, x, 0)
        warm[name] = statistics.median(time_fwd_bwd(fn, x, 1))
    fastest = min(warm.values())
    skipped = {
        name: f"{t / fastest:.0f}x the fastest path on its first timed run ({t:.2f} s)"
        for name, t in warm.items()
        if is_peer(name) and t > SLOW_FACTOR * fastest
    }
    keep = {name: fn for name, fn in fns.items() if name not in skipped}
    times: dict[str, list[float]] = {name: [] for name in keep}
    for r in range(reps):
        for name in sorted(keep, reverse=bool(r % 2)):
            times[name] += time_fwd_bwd(keep[name], x, 1)
    return {name: statistics.median(ts) for name, ts in times.items()}, skipped


def gemm_shares(fns: dict[str, Callable[[Tensor], Tensor]], x: Tensor, reps: int = GEMM_REPS) -> dict[str, float]:
    """The share of each path's forward+backward spent in its GEMMs (:data:`GEMM_OPS`), each op timed by the op timer
    of ``mohge bench step`` (:func:`.step_worker.op_times`): GEMM time over the run's time, both of one run under the
    timer, so a share does not move with the host's speed between runs; the median over ``reps`` rounds, the paths
    interleaved. A GEMM inside a graph torch.compile made runs unseen (the fused routers' [T, D] @ [D, E], 1-2% of the
    layer's FLOPs at the shapes here)."""
    shares: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(reps):
        for name in sorted(fns, reverse=bool(r % 2)):
            x.grad = None
            run = op_times(lambda fn=fns[name]: fn(x).sum().backward())
            shares[name].append(sum(ms for op, ms in run["ops_ms"].items() if op in GEMM_OPS) / run["step_ms"])
    return {name: statistics.median(v) for name, v in shares.items()}


def is_peer(name: str) -> bool:
    return name == "torchtitan" or name.startswith("hf_")


def expert_dtype(name: str, precision: str) -> str:
    """The dtype a path's expert GEMMs run in: torchtitan's ``GroupedExperts`` casts to bf16 always."""
    return "bf16" if name == "torchtitan" else precision


def ratios(
    seconds: dict[str, float],
    precision: str,
    shares: dict[str, float] | None = None,
    floor: float | None = None,
) -> dict[str, float]:
    """ours / fastest peer per our path of :data:`OURS` timed (also against the fastest peer whose experts compute in
    ``precision``, and, given the paths' GEMM shares, our path's time times its share against that peer: the ratio the
    path would have if nothing but its GEMMs took time); given ``floor`` (seconds: the experts' FLOPs at the GEMM rate
    measured alone), ``gemm_floor_over_fastest_same_dtype_peer``; our grouped_mm against torchtitan; MoHGE against our
    MoE (same backend)."""
    shares = shares or {}
    peer = {n: t for n, t in seconds.items() if is_peer(n)}
    same = {n: t for n, t in peer.items() if expert_dtype(n, precision) == precision}
    out = {}
    ours = [n for n in OURS if n in seconds]
    if peer:
        for name in ours:
            out[f"{name}_over_fastest_peer"] = seconds[name] / min(peer.values())
        if same:
            for name in ours:
                out[f"{name}_over_fastest_same_dtype_peer"] = seconds[name] / min(same.values())
                if name in shares:
                    gemms = seconds[name] * shares[name]
                    out[f"{name}_gemms_over_fastest_same_dtype_peer"] = gemms / min(same.values())
            if floor is not None:
                out["gemm_floor_over_fastest_same_dtype_peer"] = floor / min(same.values())
        if "torchtitan" in seconds:
            out["moe_grouped_mm_over_torchtitan"] = seconds["moe_grouped_mm"] / seconds["torchtitan"]
    out["mohge_over_moe"] = seconds["mohge"] / seconds["moe"]
    out["mohge_grouped_mm_over_moe_grouped_mm"] = seconds["mohge_grouped_mm"] / seconds["moe_grouped_mm"]
    return out


def bench_one(shape: Shape, precision: str, reps: int, peers: bool) -> dict:
    dtype = DTYPES[precision]
    torch._dynamo.reset()  # the fused rows' graphs of earlier shapes and dtypes: not against the recompile limit
    layers, skipped = build_paths(shape, dtype, peers)
    x = torch.randn(1, shape.tokens, shape.d_model, generator=torch.Generator().manual_seed(2)).to(dtype)
    agreement = check_agreement(layers, x)
    x.requires_grad_(True)
    fns = {name: forward_fn(layer) for name, layer in layers.items()}
    seconds, slow = time_paths(fns, x, reps)
    skipped.update(slow)
    shares = gemm_shares({name: fns[name] for name in seconds}, x)
    flops = expert_flops(shape)
    rate = gemm_rate(layer_gemms(shape), dtype)
    for name, t in seconds.items():
        print(
            f"  {shape.name:<8} {precision}  {name:<18} {1e3 * t:9.1f} ms  {flops / t / 1e9:6.1f} GFLOP/s"
            f"  (GEMMs {100 * shares[name]:.0f}%)"
        )
    print(f"  {shape.name:<8} {precision}  {'GEMMs alone':<18} {1e3 * flops / rate:9.1f} ms  {rate / 1e9:6.1f} GFLOP/s")
    for name, why in skipped.items():
        print(f"  {shape.name:<8} {precision}  {name:<18} skipped: {why}")
    return {
        "shape": shape.name,
        "precision": precision,
        "seconds": seconds,
        "gemm_share": shares,
        "expert_flops": flops,
        "gemm_rate": rate,
        "skipped": skipped,
        "ratios": ratios(seconds, precision, shares, flops / rate),
        "max_rel_diff_vs_moe": agreement,
        "expert_dtype": {name: expert_dtype(name, precision) for name in seconds},
    }


def machine() -> dict:
    model = cpu_name()
    # the vector unit ATen's CPU kernels use (AVX512, AVX2, ...): two hosts named alike can differ in it
    isa = torch.backends.cpu.get_cpu_capability()
    return {"cpu": model, "arch": platform.machine(), "cores": os.cpu_count(), "cpu_capability": isa}


def run(shapes: Sequence[Shape], precisions: Sequence[str], reps: int, peers: bool = True) -> dict:
    """Every (shape, precision), in one process that keeps the memory a step frees, as a training process does
    (``freed_memory_kept``: whether glibc took the setting); the record :func:`markdown_table` formats. Also this CPU's
    fp32 and bf16 GEMM speeds (``bf16_gemm``: ``gemm_fp32_over_bf16_time`` > 1 means bf16 GEMMs run faster here)."""
    versions = peer_versions() if peers else {}
    kept = keep_freed_memory()  # as a training process does (mohge.train.runtime.setup_runtime), for every path
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the clock is then the thread's CPU time
    try:
        results = [bench_one(shape, p, reps, peers) for shape in shapes for p in precisions]
        record = {**_record(versions, reps, shapes, results), "freed_memory_kept": kept}
    finally:
        torch.set_num_threads(threads)
    return record


def _record(versions: dict, reps: int, shapes: Sequence[Shape], results: list[dict]) -> dict:
    return {
        "bench": "peers",
        "date": datetime.date.today().isoformat(),
        "versions": {"torch": torch.__version__.split("+")[0], **versions},
        **machine(),
        "threads": torch.get_num_threads(),
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "reps": reps,
        "loadavg": list(os.getloadavg()),
        "bf16_gemm": cpu_bf16_support(),
        "shapes": {shape.name: shape.spec() for shape in shapes},
        "results": results,
    }


# The table in docs/benchmarks.md

TABLE_END = "<!-- end of peers table -->"


def table_begin(source: str) -> str:
    """The line that opens the generated table of the record ``source`` (a path as the repository names it): one
    table per record, so a page can hold the records of several hosts."""
    return f"<!-- peers table: generated by mohge bench peers from {source} -->"


COLUMNS = (
    ("moe_over_fastest_peer", "MoE / fastest peer"),
    ("moe_over_fastest_same_dtype_peer", "MoE / fastest same-dtype peer"),
    ("mohge_over_fastest_same_dtype_peer", "MoHGE / fastest same-dtype peer"),
    ("moe_fused_over_fastest_same_dtype_peer", "MoE fused / fastest same-dtype peer"),
    ("mohge_fused_over_fastest_same_dtype_peer", "MoHGE fused / fastest same-dtype peer"),
    ("mohge_fused_gemms_over_fastest_same_dtype_peer", "MoHGE fused, its GEMMs alone / fastest same-dtype peer"),
    (
        "gemm_floor_over_fastest_same_dtype_peer",
        "expert FLOPs at the GEMM rate alone / fastest same-dtype peer",
    ),
    ("moe_grouped_mm_over_torchtitan", "MoE grouped_mm / torchtitan"),
    ("mohge_over_moe", "MoHGE / MoE"),
    ("mohge_grouped_mm_over_moe_grouped_mm", "MoHGE / MoE (grouped_mm)"),
)


def markdown_table(record: dict, source: str) -> str:
    """Times (ms) of every path and the target ratios, one row per shape and precision, between the marker lines of
    the record ``source``."""
    names = sorted({n for r in record["results"] for n in r["seconds"]}, key=_path_order)
    head = ["shape", "precision", *names, *(title for _, title in COLUMNS), "fastest peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in record["results"]:
        s, q = r["seconds"], r["ratios"]
        peers = {n: t for n, t in s.items() if is_peer(n)}
        cells = [r["shape"], r["precision"]]
        cells += [f"{1e3 * s[n]:.0f}" if n in s else "skipped" for n in names]
        cells += [f"{q[key]:.2f}" if key in q else "-" for key, _ in COLUMNS]
        cells.append(min(peers, key=peers.get) if peers else "-")
        lines.append("| " + " | ".join(cells) + " |")
    skips = [
        f"- {r['shape']} {r['precision']}, `{n}`: {why}" for r in record["results"] for n, why in r["skipped"].items()
    ]
    if skips:
        lines += ["", "Not timed:", "", *skips]
    return "\n".join([table_begin(source), *lines, TABLE_END])


def _path_order(name: str) -> tuple[int, str]:
    order = (*OURS, "torchtitan")
    return (order.index(name), name) if name in order else (len(order), name)


def _doc_text(doc: Path, source: str) -> str:
    """``doc``'s text, refused unless it holds the opening line of the record ``source``'s table."""
    text = doc.read_text()
    if table_begin(source) not in text:
        raise ConfigError(f"{doc}: no line {table_begin(source)!r} to put the table of {source} after")
    return text


def write_table(doc: Path, record: dict, source: str) -> None:
    """Replace the generated table of the record ``source`` in ``doc`` (between its marker lines) by ``record``'s."""
    head, rest = _doc_text(doc, source).split(table_begin(source), 1)
    _, tail = rest.split(TABLE_END, 1)
    doc.write_text(head + markdown_table(record, source) + tail)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, of fp32, bf16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the record here (results/bench/peers_cpu.json)")
    ap.add_argument(
        "--doc",
        help="rewrite the generated table of the record (--json or --table) in this Markdown file (docs/benchmarks.md)",
    )
    ap.add_argument("--table", metavar="JSON", help="time nothing: format this record's table (into --doc if given)")
    args = ap.parse_args(argv)
    if args.table:
        record = json.loads(Path(args.table).read_text())
        if args.doc:
            write_table(Path(args.doc), record, args.table)
        print(markdown_table(record, args.table))
        return 0
    if args.doc and not args.json:
        raise ConfigError("--doc needs --json: the table names the record it is generated from")
    if args.doc:
        _doc_text(Path(args.doc), args.json)  # refused before any timing
    shapes, precisions = args.shapes.split(","), args.dtypes.split(",")
    for key, given, known in (("--shapes", shapes, SHAPES), ("--dtypes", precisions, DTYPES)):
        for v in given:
            if v not in known:
                raise ConfigError(f"{key}={v!r}: not one of {', '.join(known)}")
    versions = peer_versions()  # refuse before any timing
    print("peers benchmark: one thread, thread CPU time; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    record = run([SHAPES[s] for s in shapes], precisions, args.reps)
    if args.json:
        write_json_atomic(args.json, record)
    if args.doc:
        write_table(Path(args.doc), record, args.json)
    print(markdown_table(record, args.json or "this run"))
    return 0
