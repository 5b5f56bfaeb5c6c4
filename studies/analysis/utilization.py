"""Per-GPU utilization under expert parallelism: analytic per-rank load from routing traces, and its CLI.

MoHGE claims "balanced GPU utilization" (arXiv 2604.23108; docs/method.md §4 and §11): with the all-size
allocation every expert-parallel rank holds every width, so group popularity does not become rank
imbalance. This module measures that claim analytically on recorded routing, for each placement strategy
of :mod:`mohge.model.allocation` and each EP size the strategy allows, and (``--measure``) launches the
torch.distributed measurement of :mod:`mohge_studies.analysis.ep_timing` and compares the two.

Per rank rho and layer, with f_e tokens routed to expert e (router order) and h_e its width:

    tokens_rho = sum_{e on rho} f_e
    params_rho = sum_{e on rho} 3 * d * h_e                       (mohge.model.experts.swiglu_params)
    flops_rho  = sum_{e on rho} f_e * flop_mult * 3 * d * h_e     (flop_mult FLOPs per token per parameter)

``flop_mult`` = 6 counts training (forward 2 + backward 4 per parameter per token, the "6N" rule), 2
counts inference. A per-token forward proxy 2 * 3 * d * h_e is flop_mult 2 (docs/method.md §11); the
imbalance ratios below do not depend on the multiplier. Imbalance is reported as max/mean over ranks and
the coefficient of variation (population std / mean). For the layer 'all' rows: max_over_mean is
sum_layers(max) / sum_layers(mean), the slowdown of a whole step over a perfectly balanced one (each
layer's all-to-all waits for its slowest rank), and cv is the mean of the per-layer cvs.

INPUT: a routing trace (format and readers in :mod:`mohge.evaluate.traces`), recorded from a trained model or
built synthetically from chosen group popularities (``--synthetic``, :func:`mohge.evaluate.traces.synthetic_trace`).

OUTPUTS (``--out DIR``):

* ``analytic.csv``: model, layer, strategy, ep_size, rank, experts, width_sum, tokens, flops, params
* ``summary.csv``: model, strategy, ep_size, layer (an int or 'all'), max_over_mean (FLOPs), cv (FLOPs),
  tokens_max_over_mean, params_max_over_mean
* with ``--measure``: ``measured.csv`` (schema in :mod:`mohge_studies.analysis.ep_timing`) and ``comparison.csv``:
  model, layer, strategy, ep_size, analytic_max_over_mean, measured_max_over_mean, rel_diff, analytic_cv,
  measured_cv, measured_min_max_over_mean, rel_diff_min (analytic from the FLOPs of exactly the replayed
  routing; measured from the per-rank median seconds, the ``_min`` pair from the per-rank fastest repeat, which
  is robust to other load on a shared machine; rel_diff = measured / analytic - 1). With ``--one-device`` the ranks
  are timed in turns in one process on one device (:func:`.ep_timing.measure_one_device`): a machine
  with one GPU measures every rank's compute on it, with NVML's busy share of each rank's kernels.

Example::

    mohge utilization --trace results/eval/trace.json --ep 2 4 8 --out results/utilization
    mohge utilization --synthetic --measure --nproc 4 --out results/utilization

Legend: T tokens, K experts per token, E experts, G groups, n experts per group, EP ranks.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from mohge_studies.config.runs import UtilizationConfig

from mohge.config.sizes import swiglu_params
from mohge.core.cli import setup_logging, user_errors
from mohge.evaluate.traces import (
    SKEWED_POPULARITY,
    WIDTHS_3B,
    Trace,
    load_trace,
    replay_arrays,
    replay_path,
    synthetic_trace,
    write_trace,
)
from mohge.model.allocation import PLACEMENTS, place

log = logging.getLogger("mohge.utilization")

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
        row["params"] += swiglu_params(d_model, int(w))
        row["flops"] += float(f) * flop_mult * swiglu_params(d_model, int(w))
    return rows


def imbalance(values: Sequence[float]) -> tuple[float, float]:
    """(max/mean, coefficient of variation = population std / mean); NaN for an all-zero load."""
    mean = statistics.fmean(values)
    if mean == 0:
        return math.nan, math.nan
    return max(values) / mean, statistics.pstdev(values) / mean


def analyze(
    trace: Trace,
    strategies: Sequence[str] = PLACEMENTS,
    ep_sizes: Sequence[int] = UtilizationConfig().ep_sizes,
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
        prog="mohge utilization",
        description=(
            "Per-rank expert load under expert parallelism for each placement strategy: analytic FLOPs / "
            "parameter memory / tokens per rank from a routing trace (analytic.csv, summary.csv) and, with "
            "--measure, timed per-rank expert compute under torchrun (measured.csv, comparison.csv)."
        ),
        epilog="CSV schemas and formulas: the docstring of mohge/utilization.py; trace format: mohge/traces.py.",
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
        default=list(PLACEMENTS),
        choices=PLACEMENTS,
        metavar="STRATEGY",
        help=f"placements to compare (default: all of {', '.join(PLACEMENTS)})",
    )
    eps = list(UtilizationConfig().ep_sizes)  # utilization.ep_sizes's default
    p.add_argument("--ep", nargs="+", type=int, default=eps, help=f"EP sizes (default {' '.join(map(str, eps))})")
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
        help="ranks take turns (CPU default) or time at once (GPU default); see mohge_studies.analysis.ep_timing",
    )
    m.add_argument(
        "--one-device",
        action="store_true",
        help="time the --nproc ranks in turns in one process on one device (a machine with fewer GPUs than ranks)",
    )
    m.add_argument("--backend", default="torch", help="expert compute backend (mohge.kernels), default torch")
    m.add_argument("--train", action="store_true", help="time forward + backward of the local experts")
    return p


def run_measurement(args: argparse.Namespace, trace_path: Path) -> Path:
    """Launch ``torchrun --standalone -m mohge_studies.analysis.ep_timing measure`` (or, with ``--one-device``, one
    process of ``ep_timing measure-one``) and return measured.csv."""
    if args.one_device:
        launch = [sys.executable, "-m", "mohge_studies.analysis.ep_timing", "measure-one", "--ranks", str(args.nproc)]
    else:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
        launch += ["-m", "mohge_studies.analysis.ep_timing", "measure", "--timing", args.timing]
    cmd = [
        *launch,
        "--trace",
        str(trace_path),
        "--out",
        str(args.out),
        "--strategies",
        *args.strategies,
        "--repeats",
        str(args.repeats),
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
        raise RuntimeError(f"the measurement ({launch[2]}) failed with exit status {done.returncode}")
    return args.out / "measured.csv"


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    args = build_parser().parse_args(argv)
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
        trace_path = write_trace(trace, args.out / "synthetic_trace.json", replay_arrays(replay))
        log.info("wrote synthetic trace %s (+ %s)", trace_path, replay_path(trace_path).name)
    else:
        trace_path = args.trace
        trace = load_trace(trace_path)
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
