"""Per-GPU utilization under expert parallelism: analytic per-rank load from routing traces, and its CLI.

MoHGE claims "balanced GPU utilization" (arXiv 2604.23108; docs/method.md §4 and §11): with the all-size
allocation every expert-parallel rank holds every width, so group popularity does not become rank
imbalance. This module measures that claim analytically on recorded routing, for each placement strategy
of :mod:`mohge.allocation` and each EP size the strategy allows, and (``--measure``) launches the
torch.distributed measurement of :mod:`mohge.expert_parallel` and compares the two.

Per rank rho and layer, with f_e tokens routed to expert e (router order) and h_e its width:

    tokens_rho = sum_{e on rho} f_e
    params_rho = sum_{e on rho} 3 * d * h_e                       (SwiGLU: W1 2h x d, W2 d x h)
    flops_rho  = sum_{e on rho} f_e * flop_mult * 3 * d * h_e     (flop_mult FLOPs per token per parameter)

``flop_mult`` = 6 counts training (forward 2 + backward 4 per parameter per token, the "6N" rule), 2
counts inference. A per-token forward proxy 2 * 3 * d * h_e is flop_mult 2 (docs/method.md §11); the
imbalance ratios below do not depend on the multiplier. Imbalance is reported as max/mean over ranks and
the coefficient of variation (population std / mean). For the layer 'all' rows: max_over_mean is
sum_layers(max) / sum_layers(mean), the slowdown of a whole step over a perfectly balanced one (each
layer's all-to-all waits for its slowest rank), and cv is the mean of the per-layer cvs.

TRACE FORMAT (written by the evaluation code; read by :func:`load_trace`). A JSON file::

    {"model": "mohge-small", "d_model": 256,
     "expert_widths": [384, 512, ...],        # per-group widths, group g = router experts g*n .. g*n+n-1
     "num_experts": 64, "experts_per_group": 8,
     "tokens": 4096, "topk": 6,               # optional: tokens per layer and experts per token
     "layers": [{"layer": 1, "counts": [E ints, tokens per expert in router order]}, ...]}

Optionally an ``.npz`` with the same stem beside it (``trace.json`` -> ``trace.npz``) holding, for each
layer i of the JSON, ``idx_<i>`` int [T, K] (router ids) and ``gates_<i>`` float [T, K] for replay by the
expert-parallel measurement. :func:`synthetic_trace` builds such a trace from chosen group popularities.

OUTPUTS (``--out DIR``):

* ``analytic.csv``: model, layer, strategy, ep_size, rank, experts, width_sum, tokens, flops, params
* ``summary.csv``: model, strategy, ep_size, layer (an int or 'all'), max_over_mean (FLOPs), cv (FLOPs),
  tokens_max_over_mean, params_max_over_mean
* with ``--measure``: ``measured.csv`` (schema in :mod:`mohge.expert_parallel`) and ``comparison.csv``:
  model, layer, strategy, ep_size, analytic_max_over_mean, measured_max_over_mean, rel_diff, analytic_cv,
  measured_cv, measured_min_max_over_mean, rel_diff_min (analytic from the FLOPs of exactly the replayed
  routing; measured from the per-rank median seconds, the ``_min`` pair from the per-rank fastest repeat, which
  is robust to other load on a shared machine; rel_diff = measured / analytic - 1).

Example::

    python -m mohge.utilization --trace results/eval/trace.json --ep 2 4 8 --out results/utilization
    python -m mohge.utilization --synthetic --measure --nproc 4 --out results/utilization

Legend: T tokens, K experts per token, E experts, G groups, n experts per group, EP ranks.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .allocation import STRATEGIES, place

log = logging.getLogger("mohge.utilization")

WIDTHS_3B = (384, 512, 640, 768, 896, 1024, 1152, 1280)
# Group popularity skewed toward small groups, as the Group-Wise Aux Loss pushes it (docs/method.md §5.1):
# 0.75**g, the demo default. (A milder skew such as 0.22 .. 0.06 happens to make popularity x width nearly
# flat across groups.)
SKEWED_POPULARITY = tuple(round(0.75**g, 6) for g in range(8))
ANALYTIC_COLUMNS = (
    "model",
    "layer",
    "strategy",
    "ep_size",
    "rank",
    "experts",
    "width_sum",
    "tokens",
    "flops",
    "params",
)
SUMMARY_COLUMNS = (
    "model",
    "strategy",
    "ep_size",
    "layer",
    "max_over_mean",
    "cv",
    "tokens_max_over_mean",
    "params_max_over_mean",
)
COMPARISON_COLUMNS = (
    "model",
    "layer",
    "strategy",
    "ep_size",
    "analytic_max_over_mean",
    "measured_max_over_mean",
    "rel_diff",
    "analytic_cv",
    "measured_cv",
    "measured_min_max_over_mean",
    "rel_diff_min",
)


class TraceError(ValueError):
    """A missing or malformed routing trace: the message names the file and the offending key."""


@dataclass
class TraceLayer:
    layer: int
    counts: list[int]  # tokens per expert, router order [E]


@dataclass
class Trace:
    model: str
    d_model: int
    expert_widths: list[int]  # per group
    num_experts: int
    experts_per_group: int
    layers: list[TraceLayer]
    tokens: int | None = None
    topk: int | None = None
    path: Path | None = field(default=None, compare=False)

    @property
    def widths_E(self) -> list[int]:
        """Width of every expert, router (group-major) order."""
        return [w for w in self.expert_widths for _ in range(self.experts_per_group)]

    def to_json(self) -> dict:
        out = {
            "model": self.model,
            "d_model": self.d_model,
            "expert_widths": list(self.expert_widths),
            "num_experts": self.num_experts,
            "experts_per_group": self.experts_per_group,
            "layers": [{"layer": lay.layer, "counts": [int(c) for c in lay.counts]} for lay in self.layers],
        }
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.topk is not None:
            out["topk"] = self.topk
        return out


def _need(data: dict, key: str, tp: type, where: str):
    if key not in data:
        raise TraceError(f"{where}: missing key {key!r}")
    value = data[key]
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceError(f"{where}: {key}={value!r} must be an integer")
    if tp is not int and not isinstance(value, tp):
        raise TraceError(f"{where}: {key}={value!r} must be a {tp.__name__}")
    return value


def trace_from_dict(data: dict, where: str = "trace") -> Trace:
    """Validate a trace mapping (format in the module docstring); errors name ``where`` and the key."""
    if not isinstance(data, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(data).__name__}")
    model = str(_need(data, "model", str, where))
    d_model = _need(data, "d_model", int, where)
    widths = _need(data, "expert_widths", list, where)
    E = _need(data, "num_experts", int, where)
    n = _need(data, "experts_per_group", int, where)
    layers = _need(data, "layers", list, where)
    if d_model <= 0:
        raise TraceError(f"{where}: d_model={d_model} must be > 0")
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
        raise TraceError(f"{where}: expert_widths={widths!r} must be a non-empty list of positive integers")
    if n <= 0 or E != n * len(widths):
        raise TraceError(
            f"{where}: num_experts={E} must equal experts_per_group={n} x len(expert_widths)={len(widths)}"
        )
    if not layers:
        raise TraceError(f"{where}: 'layers' is empty")
    out = []
    for i, lay in enumerate(layers):
        lw = f"{where}: layers[{i}]"
        if not isinstance(lay, dict):
            raise TraceError(f"{lw}: expected an object with 'layer' and 'counts'")
        layer = _need(lay, "layer", int, lw)
        counts = _need(lay, "counts", list, lw)
        if len(counts) != E:
            raise TraceError(f"{lw}: 'counts' has {len(counts)} entries, expected num_experts={E}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise TraceError(f"{lw}: 'counts' must hold non-negative integers")
        out.append(TraceLayer(layer, list(counts)))
    if len({lay.layer for lay in out}) != len(out):
        raise TraceError(f"{where}: duplicate layer ids {[lay.layer for lay in out]}")
    tokens, topk = data.get("tokens"), data.get("topk")
    for key, value in (("tokens", tokens), ("topk", topk)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise TraceError(f"{where}: {key}={value!r} must be a positive integer")
    return Trace(model, d_model, list(widths), E, n, out, tokens, topk)


def load_trace(path: str | Path) -> Trace:
    """Read a routing trace JSON; a missing, unreadable or malformed file is a TraceError naming it."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TraceError(f"trace file {str(p)!r} is not valid JSON: {err}") from err
    trace = trace_from_dict(data, f"trace file {str(p)!r}")
    trace.path = p
    return trace


def replay_path(trace_path: str | Path) -> Path:
    return Path(trace_path).with_suffix(".npz")


def load_replay(trace: Trace) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """Per-layer (idx [T,K] int64, gates [T,K] float32) from the .npz beside the trace, or None if absent."""
    if trace.path is None or not replay_path(trace.path).is_file():
        return None
    p = replay_path(trace.path)
    out = {}
    with np.load(p) as z:
        for lay in trace.layers:
            ki, kg = f"idx_{lay.layer}", f"gates_{lay.layer}"
            if ki not in z or kg not in z:
                raise TraceError(f"replay file {str(p)!r}: missing {ki!r} or {kg!r} for layer {lay.layer}")
            idx, gates = z[ki].astype(np.int64), z[kg].astype(np.float32)
            if idx.ndim != 2 or idx.shape != gates.shape:
                raise TraceError(f"replay file {str(p)!r}: {ki} {idx.shape} and {kg} {gates.shape} must be [T, K]")
            if idx.size and (idx.min() < 0 or idx.max() >= trace.num_experts):
                raise TraceError(f"replay file {str(p)!r}: {ki} holds ids outside [0, {trace.num_experts})")
            out[lay.layer] = (idx, gates)
    return out


def write_trace(trace: Trace, path: str | Path, replay: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> Path:
    """Write the JSON (and the .npz beside it when ``replay`` is given); returns the JSON path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(trace.to_json(), indent=1) + "\n")
    if replay is not None:
        arrays = {}
        for layer, (idx, gates) in replay.items():
            arrays[f"idx_{layer}"], arrays[f"gates_{layer}"] = np.asarray(idx), np.asarray(gates)
        np.savez(replay_path(p), **arrays)
    trace.path = p
    return p


def _round_to_total(x: np.ndarray, total: int) -> np.ndarray:
    """Largest-remainder rounding of non-negative reals to integers summing to ``total``."""
    x = x * (total / x.sum())
    base = np.floor(x).astype(np.int64)
    rest = total - int(base.sum())
    order = np.argsort(-(x - base), kind="stable")
    base[order[:rest]] += 1
    return base


def routing_from_counts(counts_E: Sequence[int], topk: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A routing (idx [T,K], gates [T,K]) with exactly ``counts_E`` tokens per expert, distinct experts per token.

    The T*K slots, sorted by expert, are laid out so slot s goes to token s mod T, position s // T; an
    expert's run of f_e <= T consecutive slots therefore hits f_e different tokens. Tokens are then
    shuffled, and gates are random positive weights summing to 1 per token.
    """
    counts = np.asarray(counts_E, dtype=np.int64)
    total = int(counts.sum())
    if topk <= 0 or total % topk:
        raise ValueError(f"sum(counts)={total} is not a multiple of topk={topk}")
    T = total // topk
    if counts.max(initial=0) > T:
        raise ValueError(f"an expert has {counts.max()} tokens, more than the T={T} tokens of the layer")
    rng = np.random.default_rng(seed)
    slots = np.repeat(np.arange(len(counts)), counts)
    idx_TK = slots.reshape(topk, T).T[rng.permutation(T)]
    idx_TK = np.take_along_axis(idx_TK, rng.random((T, topk)).argsort(1), axis=1)
    gates_TK = rng.random((T, topk)).astype(np.float32) + 0.1
    gates_TK /= gates_TK.sum(1, keepdims=True)
    return np.ascontiguousarray(idx_TK), gates_TK


def synthetic_trace(
    group_popularity: Sequence[float] = SKEWED_POPULARITY,
    *,
    tokens: int = 4096,
    topk: int = 6,
    expert_widths: Sequence[int] = WIDTHS_3B,
    experts_per_group: int = 8,
    d_model: int = 256,
    num_layers: int = 1,
    noise: float = 0.0,
    seed: int = 0,
    model: str = "synthetic",
) -> tuple[Trace, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """A trace whose group g receives a share popularity_g / sum(popularity) of the T*K routed slots.

    Within a group the share is uniform, times (1 + u_e) with u_e ~ U(-noise, noise) per expert and layer;
    counts are rounded to integers summing to T*K (exactly uniform when noise = 0 and the shares divide).
    Returns the trace and a matching replay routing (per layer: idx, gates; see :func:`routing_from_counts`).
    """
    G, n = len(expert_widths), experts_per_group
    pop = np.asarray(group_popularity, dtype=np.float64)
    if pop.shape != (G,) or (pop < 0).any() or pop.sum() <= 0:
        raise ValueError(f"group_popularity={list(group_popularity)} needs {G} non-negative values, not all 0")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise={noise} must lie in [0, 1)")
    rng = np.random.default_rng(seed)
    layers, replay = [], {}
    for layer in range(num_layers):
        share_E = np.repeat(pop / pop.sum() / n, n) * (1.0 + rng.uniform(-noise, noise, G * n))
        counts = _round_to_total(share_E, tokens * topk)
        layers.append(TraceLayer(layer, counts.tolist()))
        replay[layer] = routing_from_counts(counts, topk, seed=seed * 1000 + layer)
    trace = Trace(model, d_model, list(expert_widths), G * n, n, layers, tokens, topk)
    return trace, replay


# --------------------------------------------------------------------------------------------------------------
# Analytic per-rank load


def rank_loads(
    counts_E: Sequence[int],
    widths_E: Sequence[int],
    rank_of_expert: Sequence[int],
    ep_size: int,
    d_model: int,
    flop_mult: float = 6.0,
) -> list[dict]:
    """Per-rank rows {rank, experts, width_sum, tokens, flops, params} (formulas in the module docstring)."""
    rows = [{"rank": r, "experts": 0, "width_sum": 0, "tokens": 0, "flops": 0.0, "params": 0} for r in range(ep_size)]
    for f, w, r in zip(counts_E, widths_E, rank_of_expert, strict=True):
        row = rows[r]
        row["experts"] += 1
        row["width_sum"] += int(w)
        row["tokens"] += int(f)
        row["params"] += 3 * d_model * int(w)
        row["flops"] += float(f) * flop_mult * 3 * d_model * int(w)
    return rows


def imbalance(values: Sequence[float]) -> tuple[float, float]:
    """(max/mean, coefficient of variation = population std / mean); NaN for an all-zero load."""
    mean = statistics.fmean(values)
    if mean == 0:
        return math.nan, math.nan
    return max(values) / mean, statistics.pstdev(values) / mean


def analyze(
    trace: Trace,
    strategies: Sequence[str] = STRATEGIES,
    ep_sizes: Sequence[int] = (2, 4, 8, 16, 32),
    flop_mult: float = 6.0,
) -> tuple[list[dict], list[dict]]:
    """(analytic rows, summary rows) for every layer x strategy x EP size the strategy allows.

    ``flop_lpt`` is placed per layer on that layer's own counts (an in-sample, best-case balancer).
    A (strategy, EP) pair whose placement raises is logged and skipped.
    """
    widths_E = trace.widths_E
    analytic, summary = [], []
    for strategy in strategies:
        for ep in ep_sizes:
            per_layer = []  # (layer, flops_r, tokens_r, params_r)
            for lay in trace.layers:
                try:
                    ranks = place(strategy, widths_E, ep, lay.counts, trace.experts_per_group)
                except ValueError as err:
                    log.warning("skipping: %s", err)
                    break
                rows = rank_loads(lay.counts, widths_E, ranks, ep, trace.d_model, flop_mult)
                for row in rows:
                    analytic.append(
                        {"model": trace.model, "layer": lay.layer, "strategy": strategy, "ep_size": ep, **row}
                    )
                per_layer.append((lay.layer, *([row[k] for row in rows] for k in ("flops", "tokens", "params"))))
            if not per_layer:
                continue
            for layer, fl, tk, pa in per_layer:
                summary.append(_summary_row(trace.model, strategy, ep, layer, fl, tk, pa))
            summary.append(_summary_all(trace.model, strategy, ep, per_layer))
    return analytic, summary


def _summary_row(model, strategy, ep, layer, flops, tokens, params) -> dict:
    mm, cv = imbalance(flops)
    return {
        "model": model,
        "strategy": strategy,
        "ep_size": ep,
        "layer": layer,
        "max_over_mean": mm,
        "cv": cv,
        "tokens_max_over_mean": imbalance(tokens)[0],
        "params_max_over_mean": imbalance(params)[0],
    }


def _step_ratio(per_layer: list[list[float]]) -> float:
    """sum over layers of the slowest rank / sum over layers of the mean rank."""
    mean = sum(statistics.fmean(v) for v in per_layer)
    return sum(max(v) for v in per_layer) / mean if mean else math.nan


def _summary_all(model, strategy, ep, per_layer) -> dict:
    return {
        "model": model,
        "strategy": strategy,
        "ep_size": ep,
        "layer": "all",
        "max_over_mean": _step_ratio([p[1] for p in per_layer]),
        "cv": statistics.fmean(imbalance(p[1])[1] for p in per_layer),
        "tokens_max_over_mean": _step_ratio([p[2] for p in per_layer]),
        "params_max_over_mean": _step_ratio([p[3] for p in per_layer]),
    }


def compare(measured: Sequence[dict]) -> list[dict]:
    """Analytic vs measured imbalance per (model, layer, strategy, ep_size) from measured.csv rows."""
    keyed: dict[tuple, list[dict]] = {}
    for row in measured:
        keyed.setdefault((row["model"], int(row["layer"]), row["strategy"], int(row["ep_size"])), []).append(row)
    out = []
    for (model, layer, strategy, ep), rows in keyed.items():
        rows = sorted(rows, key=lambda r: int(r["rank"]))
        a_mm, a_cv = imbalance([float(r["flops"]) for r in rows])
        m_mm, m_cv = imbalance([float(r["seconds"]) for r in rows])
        mn_mm = imbalance([float(r["seconds_min"]) for r in rows])[0]
        out.append(
            {
                "model": model,
                "layer": layer,
                "strategy": strategy,
                "ep_size": ep,
                "analytic_max_over_mean": a_mm,
                "measured_max_over_mean": m_mm,
                "rel_diff": m_mm / a_mm - 1.0,
                "analytic_cv": a_cv,
                "measured_cv": m_cv,
                "measured_min_max_over_mean": mn_mm,
                "rel_diff_min": mn_mm / a_mm - 1.0,
            }
        )
    return out


def write_csv(rows: Sequence[dict], path: str | Path, columns: Sequence[str]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return p


def read_csv(path: str | Path) -> list[dict]:
    with Path(path).open(newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mohge.utilization",
        description=(
            "Per-rank expert load under expert parallelism for each placement strategy: analytic FLOPs / "
            "parameter memory / tokens per rank from a routing trace (analytic.csv, summary.csv) and, with "
            "--measure, timed per-rank expert compute under torchrun (measured.csv, comparison.csv)."
        ),
        epilog="Trace format, CSV schemas and formulas: see the docstring of mohge/utilization.py.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path, help="routing trace JSON (a .npz beside it enables replay)")
    src.add_argument(
        "--synthetic",
        action="store_true",
        help="no trained model: write and use a synthetic trace (OUT/synthetic_trace.json + .npz)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder for the CSVs")
    p.add_argument(
        "--strategies",
        nargs="+",
        default=list(STRATEGIES),
        choices=STRATEGIES,
        metavar="STRATEGY",
        help=f"placements to compare (default: all of {', '.join(STRATEGIES)})",
    )
    p.add_argument("--ep", nargs="+", type=int, default=[2, 4, 8, 16, 32], help="EP sizes (default 2 4 8 16 32)")
    p.add_argument(
        "--flop-mult",
        type=float,
        default=6.0,
        help="FLOPs per token per expert parameter: 6 training (default), 2 inference",
    )
    syn = p.add_argument_group("synthetic trace (--synthetic)")
    syn.add_argument(
        "--popularity",
        nargs="+",
        type=float,
        default=list(SKEWED_POPULARITY),
        help="group popularities, one per group (default skewed toward small groups)",
    )
    syn.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS_3B), help="per-group expert widths")
    syn.add_argument("--experts-per-group", type=int, default=8, help="experts per group (default 8)")
    syn.add_argument("--tokens", type=int, default=4096, help="tokens per layer (default 4096)")
    syn.add_argument("--topk", type=int, default=6, help="experts per token (default 6)")
    syn.add_argument("--d-model", type=int, default=256, help="model width of the trace (default 256)")
    syn.add_argument("--layers", type=int, default=1, help="number of synthetic layers")
    syn.add_argument("--noise", type=float, default=0.1, help="within-group multiplicative noise, +-noise")
    syn.add_argument("--seed", type=int, default=0, help="seed of the noise and of the replay routing")
    m = p.add_argument_group("measurement (--measure)")
    m.add_argument("--measure", action="store_true", help="also run the torchrun per-rank timing")
    m.add_argument("--nproc", type=int, default=4, help="ranks (= EP size) of the measurement")
    m.add_argument("--repeats", type=int, default=5, help="timed repeats per rank (median reported)")
    m.add_argument("--measure-layers", nargs="+", type=int, help="layer ids to measure (default: all)")
    m.add_argument("--measure-d-model", type=int, help="d_model of the timed experts (default: the trace's)")
    m.add_argument("--measure-max-tokens", type=int, help="replay only the first N tokens of each layer")
    m.add_argument(
        "--timing",
        choices=("auto", "sequential", "concurrent"),
        default="auto",
        help="ranks take turns (CPU default) or time at once (GPU default); see mohge.expert_parallel",
    )
    m.add_argument("--backend", default="torch", help="expert compute backend (mohge.kernels), default torch")
    m.add_argument("--train", action="store_true", help="time forward + backward of the local experts")
    return p


def run_measurement(args: argparse.Namespace, trace_path: Path) -> Path:
    """Launch ``torchrun --standalone -m mohge.expert_parallel measure`` and return measured.csv."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "-m",
        "mohge.expert_parallel",
        "measure",
        "--trace",
        str(trace_path),
        "--out",
        str(args.out),
        "--strategies",
        *args.strategies,
        "--repeats",
        str(args.repeats),
        "--timing",
        args.timing,
        "--backend",
        args.backend,
        "--flop-mult",
        str(args.flop_mult),
    ]
    if args.measure_layers:
        cmd += ["--layers", *map(str, args.measure_layers)]
    if args.measure_d_model:
        cmd += ["--d-model", str(args.measure_d_model)]
    if args.measure_max_tokens:
        cmd += ["--max-tokens", str(args.measure_max_tokens)]
    if args.train:
        cmd.append("--train")
    log.info("launching: %s", " ".join(cmd))
    done = subprocess.run(cmd, check=False)
    if done.returncode:
        raise RuntimeError(f"the torchrun measurement failed with exit status {done.returncode}")
    return args.out / "measured.csv"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.synthetic:
            trace, replay = synthetic_trace(
                args.popularity,
                tokens=args.tokens,
                topk=args.topk,
                expert_widths=args.widths,
                experts_per_group=args.experts_per_group,
                d_model=args.d_model,
                num_layers=args.layers,
                noise=args.noise,
                seed=args.seed,
            )
            trace_path = write_trace(trace, args.out / "synthetic_trace.json", replay)
            log.info("wrote synthetic trace %s (+ %s)", trace_path, replay_path(trace_path).name)
        else:
            trace_path = args.trace
            trace = load_trace(trace_path)
    except (TraceError, ValueError) as err:
        log.error("%s", err)
        return 2
    log.info(
        "trace %s: model %s, %d layers, E=%d (%d groups x %d), d_model=%d",
        trace_path,
        trace.model,
        len(trace.layers),
        trace.num_experts,
        len(trace.expert_widths),
        trace.experts_per_group,
        trace.d_model,
    )
    analytic, summary = analyze(trace, args.strategies, args.ep, args.flop_mult)
    write_csv(analytic, args.out / "analytic.csv", ANALYTIC_COLUMNS)
    write_csv(summary, args.out / "summary.csv", SUMMARY_COLUMNS)
    for row in summary:
        if row["layer"] == "all":
            log.info(
                "%-12s EP=%-3d FLOPs max/mean %.4f cv %.4f | tokens max/mean %.4f | params max/mean %.4f",
                row["strategy"],
                row["ep_size"],
                row["max_over_mean"],
                row["cv"],
                row["tokens_max_over_mean"],
                row["params_max_over_mean"],
            )
    log.info("wrote %s and %s", args.out / "analytic.csv", args.out / "summary.csv")
    if args.measure:
        try:
            measured = run_measurement(args, trace_path)
        except RuntimeError as err:
            log.error("%s", err)
            return 1
        comparison = compare(read_csv(measured))
        write_csv(comparison, args.out / "comparison.csv", COMPARISON_COLUMNS)
        for row in comparison:
            log.info(
                "layer %s %-12s EP=%d max/mean analytic %.4f measured %.4f (%+.1f%%), min-time %.4f (%+.1f%%)",
                row["layer"],
                row["strategy"],
                row["ep_size"],
                row["analytic_max_over_mean"],
                row["measured_max_over_mean"],
                100 * row["rel_diff"],
                row["measured_min_max_over_mean"],
                100 * row["rel_diff_min"],
            )
        log.info("wrote %s and %s", measured, args.out / "comparison.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
