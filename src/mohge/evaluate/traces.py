"""Routing traces: the one owner of the trace format (written and read here only), and the tracer.

    mohge traces --ckpt results/<run>/model --data data/<source> --out results/<run>/trace.json
    python -m mohge.evaluate trace ...          (the same command)

A trace records, per MoE layer, how many routed slots every expert received; the utilization study
(:mod:`mohge_studies.analysis.utilization`, docs/method.md §11) and the expert-parallel measurement read it.

TRACE FORMAT. A JSON file::

    {"model": name, "d_model": D, "expert_widths": [G widths], "num_experts": E, "experts_per_group": n,
     "tokens": T, "topk": K,                                  # optional for a reader
     "family": ..., "split": "test",                          # written by the tracer, not needed by a reader
     "layers": [{"layer": i, "counts": [E],
                 "group_counts": [G], "counts_by_level": {"easy": [E], ...}},   # the last two optional
                ...]}

* ``layer`` is the index among the MoE layers (0 = first MoE layer; unique within a trace);
* ``counts`` are routed slots per expert in router order (group-major: group g holds experts g*n .. g*n+n-1),
  so a traced layer's counts sum to T * K; ``group_counts`` sums them per width class;
* ``counts_by_level`` (graded data only, else {}) attributes a position to the level of the token it predicts
  (the target at that position: the routed hidden state is the one that must produce that token); separator
  positions (newline, EOT) count in ``counts`` but in no level.
* ``token_q3`` (graded data only; top level, optional, absent from traces written before it): the token-level Q3
  record over every traced token, each token's gate-weighted routed width against its loss
  (:mod:`mohge.evaluate.token_width`); its per-token arrays go to ``<stem>_tokens.npz`` beside the trace.

Beside it, ``<stem>.npz`` (optional) keeps raw routing for replay: ``idx_<layer>`` [T', K] int expert ids
(router order) and ``gates_<layer>`` [T', K] float, plus ``levels`` [T'] int8 when the data has levels. The
tracer keeps the first ``eval.trace_batches`` batches; :func:`synthetic_trace` builds a trace and a matching
replay from chosen group popularities. :func:`write_trace` is the one writer (it validates what it writes),
:func:`load_trace` / :func:`load_replay` the readers; a malformed file is a :class:`TraceError` naming the
file and the key.

The tracer reads the test split in order (non-overlapping windows of the training length), every MoE layer
recording its routing.

Legend: B batch, S sequence, T tokens, K top-k, E experts, G groups, n experts per group.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mohge.config import LEVEL_NAMES
from mohge.core.atomic import write_bytes_atomic, write_json_atomic
from mohge.core.cli import setup_logging, user_errors
from mohge.core.knobs import ConfigError
from mohge.data import TokenStream
from mohge.train.checkpoint import check_trained_on, load_trained

from .eval_section import eval_run_config
from .token_width import routed_width, token_summary

log = logging.getLogger("mohge.evaluate.traces")

WIDTHS_3B = (384, 512, 640, 768, 896, 1024, 1152, 1280)
# Group popularity skewed toward small groups, as L_G pushes it (docs/method.md §5.1): 0.75**g, the demo default.
# (A milder skew such as 0.22 .. 0.06 happens to make popularity x width nearly flat across groups.)
SKEWED_POPULARITY = tuple(round(0.75**g, 6) for g in range(8))
Replay = Mapping[int, tuple[np.ndarray, np.ndarray]]  # layer -> (idx [T, K], gates [T, K])


# --------------------------------------------------------------------------------------------------------------
# The format: reading, validating, writing


class TraceError(ConfigError):
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


def tokens_path(trace_path: str | Path) -> Path:
    """The per-token arrays of the token-level Q3 record: ``<stem>_tokens.npz`` beside the trace."""
    p = Path(trace_path)
    return p.with_name(f"{p.stem}_tokens.npz")


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


def replay_arrays(replay: Replay) -> dict[str, np.ndarray]:
    """The .npz arrays of a per-layer replay routing: ``idx_<layer>``, ``gates_<layer>``."""
    arrays = {}
    for layer, (idx, gates) in replay.items():
        arrays[f"idx_{layer}"], arrays[f"gates_{layer}"] = np.asarray(idx), np.asarray(gates)
    return arrays


def write_trace(
    trace: Trace | dict[str, Any], path: str | Path, arrays: Mapping[str, np.ndarray] | None = None
) -> Path:
    """Write a trace JSON atomically (and ``arrays`` as the .npz beside it when given); returns the JSON path.

    ``trace`` is a :class:`Trace` or a format mapping (which may carry the optional keys); it is validated
    first, so no writer can produce a file the readers refuse.
    """
    p = Path(path)
    data = trace.to_json() if isinstance(trace, Trace) else trace
    trace_from_dict(data, f"trace to write to {str(p)!r}")
    write_json_atomic(p, data)
    if arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        write_bytes_atomic(replay_path(p), buf.getvalue())
    if isinstance(trace, Trace):
        trace.path = p
    return p


# --------------------------------------------------------------------------------------------------------------
# Synthetic traces


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
        raise ConfigError(f"group_popularity={list(group_popularity)} needs {G} non-negative values, not all 0")
    if not 0.0 <= noise < 1.0:
        raise ConfigError(f"noise={noise} must lie in [0, 1)")
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
# Tracing a trained model


@torch.no_grad()
def collect_trace(
    model: torch.nn.Module,
    cfg: Any,
    data_dir: str | Path,
    split: str = "test",
    batch_size: int = 16,
    max_batches: int = 0,
    keep_batches: int = 0,
    token_arrays: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(trace dict, raw arrays of the first ``keep_batches`` batches) for a model in eval mode.

    On graded data the trace also holds ``token_q3`` (every traced token's routed width against its loss); the
    per-token arrays behind it (width_TL, loss_T, level_T, target_T) are put into ``token_arrays`` when given."""
    ffn, K = cfg.model.ffn, cfg.model.router.topk
    E, G = ffn.num_experts, ffn.num_groups
    layers = model.moe_layers()
    if not layers:
        raise ConfigError(f"model.ffn.kind={ffn.kind!r} has no MoE layer to trace")
    stream = TokenStream.open(data_dir, split, verify=True)  # every shard, sha256 once per process
    with_levels = stream.levels is not None
    device = next(model.parameters()).device
    counts_LE = torch.zeros(len(layers), E, dtype=torch.int64)
    by_level = torch.zeros(len(LEVEL_NAMES), len(layers), E, dtype=torch.int64)
    raw: dict[str, list[np.ndarray]] = {}
    widths_E = np.asarray([w for w in ffn.expert_widths for _ in range(ffn.experts_per_group)], dtype=np.float64)
    per_token: dict[str, list[np.ndarray]] = {"width_TL": [], "loss_T": [], "level_T": [], "target_T": []}
    T = 0
    for layer in layers:
        layer.record = True
    try:
        batches = stream.iter_eval_batches(batch_size, cfg.data_config.seq_len, with_levels=with_levels)
        for b, batch in enumerate(batches):
            if max_batches and b >= max_batches:
                break
            x_BS, y_BS, level_BS = batch[0], batch[1], (batch[2] if with_levels else None)
            out = model(x_BS.to(device))
            T += x_BS.numel()
            level_T = level_BS.reshape(-1) if level_BS is not None else None
            if level_T is not None:  # the token-level record: loss of the next token, routed width per layer
                logits_TV = out.logits.reshape(-1, out.logits.shape[-1]).float()
                loss_T = torch.nn.functional.cross_entropy(logits_TV, y_BS.reshape(-1).to(device), reduction="none")
                per_token["loss_T"].append(loss_T.cpu().numpy().astype(np.float32))
                per_token["level_T"].append(level_T.numpy().astype(np.int8))
                per_token["target_T"].append(y_BS.reshape(-1).numpy().astype(np.int32))
                width_TL = [
                    routed_width(s.routing.idx_TK.cpu().numpy(), s.routing.gates_TK.float().cpu().numpy(), widths_E)
                    for s in out.layers
                ]
                per_token["width_TL"].append(np.stack(width_TL, 1).astype(np.float32))
            for i, stats in enumerate(out.layers):
                idx_TK = stats.routing.idx_TK.cpu()
                counts_LE[i] += torch.bincount(idx_TK.reshape(-1), minlength=E)
                if level_T is not None:
                    for lv in range(len(LEVEL_NAMES)):
                        sel_TK = idx_TK[level_T == lv]
                        by_level[lv, i] += torch.bincount(sel_TK.reshape(-1), minlength=E)
                if b < keep_batches:
                    raw.setdefault(f"idx_{i}", []).append(idx_TK.numpy().astype(np.int32))
                    raw.setdefault(f"gates_{i}", []).append(stats.routing.gates_TK.float().cpu().numpy())
            if level_T is not None and b < keep_batches:
                raw.setdefault("levels", []).append(level_T.numpy().astype(np.int8))
    finally:
        for layer in layers:
            layer.record = False
    trace = {
        "model": cfg.name,
        "family": cfg.family,
        "d_model": cfg.model.d_model,
        "expert_widths": list(ffn.expert_widths),
        "num_experts": E,
        "experts_per_group": ffn.experts_per_group,
        "topk": K,
        "tokens": T,
        "split": split,
        "layers": [
            {
                "layer": i,
                "counts": counts_LE[i].tolist(),
                "group_counts": counts_LE[i].view(G, -1).sum(1).tolist(),
                "counts_by_level": (
                    {name: by_level[lv, i].tolist() for lv, name in enumerate(LEVEL_NAMES)} if with_levels else {}
                ),
            }
            for i in range(len(layers))
        ],
    }
    for row in trace["layers"]:
        assert sum(row["counts"]) == T * K, "every token routes to exactly K experts"
    if with_levels and T:
        arrays = {k: np.concatenate(v) for k, v in per_token.items()}
        trace["token_q3"] = token_summary(**arrays)
        if token_arrays is not None:
            token_arrays.update(arrays)
    return trace, {k: np.concatenate(v) for k, v in raw.items()}


def trace_checkpoint(
    ckpt: str | Path,
    data_dir: str | Path,
    out: str | Path,
    npz: bool = True,
    batch_size: int | None = None,
    max_batches: int | None = None,
    device: str = "cpu",
    eval_config: str | Path | None = None,
) -> dict[str, Any]:
    """Trace a trained model folder on ``data_dir``'s test split, its first ``max_batches`` batches (default:
    eval.heldout_batches; 0 = all), and write ``out`` (+ the .npz and, on graded data, the per-token arrays
    ``<stem>_tokens.npz``); returns the trace."""
    cfg, model = load_trained(ckpt, device)
    check_trained_on(ckpt, cfg, data_dir)  # another tokenizer or data config: refused, naming both
    run_cfg, source = eval_run_config(ckpt, eval_config, cfg)  # the workflow passes the study's current one
    log.info("eval section: %s", source)
    ec = run_cfg.eval
    tokens: dict[str, np.ndarray] = {}
    trace, raw = collect_trace(
        model,
        cfg,
        data_dir,
        batch_size=batch_size or ec.batch_size,
        max_batches=ec.heldout_batches if max_batches is None else max_batches,
        keep_batches=ec.trace_batches if npz else 0,
        token_arrays=tokens,
    )
    write_trace(trace, out, raw if npz else None)
    if npz and tokens:
        buf = io.BytesIO()
        np.savez_compressed(buf, **tokens)
        write_bytes_atomic(tokens_path(out), buf.getvalue())
    return trace


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge traces",
        description="Per MoE layer: routed tokens per expert and per group on the test split, "
        "overall and per difficulty level (graded data); optional raw routing (.npz) for replay.",
    )
    ap.add_argument("--ckpt", required=True, help="trained model folder (model.safetensors + config.json)")
    ap.add_argument("--data", required=True, help="prepared data folder the model was trained on")
    ap.add_argument("--out", required=True, help="trace JSON to write (the .npz goes beside it)")
    ap.add_argument("--no-npz", action="store_true", help="do not write the raw routing of eval.trace_batches")
    ap.add_argument("--batch-size", type=int, help="sequences per forward pass (default eval.batch_size)")
    ap.add_argument(
        "--max-batches", type=int, help="trace at most this many batches, 0 = all (default: eval.heldout_batches)"
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument(
        "--eval-config",
        help="run config whose eval section is read (default: for work/<study>/runs/<run>, the study's "
        "results/<study>/runs/<run>/config.json, as the workflow traces it; else the model folder's own)",
    )
    args = ap.parse_args(argv)
    setup_logging()
    trace = trace_checkpoint(
        args.ckpt,
        args.data,
        args.out,
        not args.no_npz,
        args.batch_size,
        args.max_batches,
        args.device,
        eval_config=args.eval_config,
    )
    log.info("traced %d tokens in %d MoE layers -> %s", trace["tokens"], len(trace["layers"]), args.out)
    return 0
