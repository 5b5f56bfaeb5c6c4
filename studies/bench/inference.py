"""Inference cost per token of trained models, and the quality a cheaper route costs.

    mohge bench inference --models results/<run>/model ... --data data/<source> --out inference.json
        [--group-topk 3 2 1] [--bar-widest 1 2] [--topk 3 2 1] [--prompt-lengths 16 64 128] [--batch-sizes 1 16]

For every model folder (what ``mohge.train`` writes), in one process, with the timed paths interleaved (one
repetition of every model and path in turn, the order flipped every round; one torch thread and the thread's CPU
time by default; the median of ``--reps``):

* ``prefill``: tokens/s of one forward pass over a prompt of each length (batch 1), through mohge's model and
  through the Hugging Face export (:mod:`mohge.evaluate.modeling_mohge`, which shares the weights);
* ``decode``: tokens/s of greedy decoding through the export's KV cache (``DynamicCache``) at each batch size,
  and without a cache at batch 1 (every step recomputes the whole prefix);
* ``memory``: the resident-set growth of one prefill at the longest prompt and of one cached decode at the largest
  batch (``VmHWM`` after a reset through ``/proc/self/clear_refs`` minus ``VmRSS`` before; Linux only, else null);
  torch's CPU allocator keeps no statistics, so this is the process's RSS, allocator caching included;
* ``cost``: per token of the validation split, as routed, the activated parameters and forward FLOPs (below):
  mean, quantiles and, on graded data, the mean by difficulty level of the token predicted; the export's
  routing gives the same counts (``cost_hf``, and ``hf_max_abs_diff``);
* ``knob``: validation perplexity and mean activated FLOPs per token at each served routing
  (:mod:`mohge.evaluate.route_override`): the trained one, and each knob point the model can take (:func:`knob_points`:
  group_topk, alone and with the experts per group kept, and bar_widest for MoHGE; topk for every routed model;
  points at or above the trained value are left out).

Forward FLOPs of a token and the matmul parameters N_t it activates (``params``) are those of
:mod:`mohge.evaluate.routed_cost`: 2 * N_t + 2 * L * H * (d_qk + d_v) * (t + 1) at position t of its window.

``ratios`` divide MoHGE's figures by the homogeneous MoE's and the dense model's of the same run (mean over seeds
of a family). The JSON records the CPU, threads and clock. Legend: B batch, S sequence, T tokens, K top-k, L
layers, E experts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from mohge.kernels.cpu_gemm import clock

from mohge.config import LEVEL_NAMES, ModelConfig, RunConfig
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.data import TokenStream
from mohge.data.tokenizer import EOT_ID
from mohge.evaluate.hf_export import context_length, to_hf_model
from mohge.evaluate.route_override import RouteOverride, apply_route_override
from mohge.evaluate.routed_cost import record_routing, token_cost
from mohge.train.checkpoint import load_trained

from .step import cpu_name

QUANTILES = (0.1, 0.5, 0.9, 0.99)


# --------------------------------------------------------------------------------------------------------------
# Cost per token, as routed


def summary(x: np.ndarray) -> dict[str, float]:
    out = {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}
    out.update({f"q{round(100 * q)}": float(np.quantile(x, q)) for q in QUANTILES})
    return out


@torch.no_grad()
def routed_pass(
    model: torch.nn.Module, cfg: RunConfig, data_dir: str | Path, split: str, batch_size: int, max_batches: int
) -> dict[str, np.ndarray]:
    """One pass over the first ``max_batches`` (0: all) windows of ``split``: per token its next-token loss, level
    (-1 where none, or where the data has none), params and flops as routed. ``model``: mohge's or the export."""
    stream = TokenStream.open(data_dir, split, verify=True)
    with_levels = stream.levels is not None
    seq = context_length(cfg)
    out: dict[str, list[np.ndarray]] = {"loss": [], "level": [], "params": [], "flops": []}
    for b, batch in enumerate(stream.iter_eval_batches(batch_size, seq, with_levels=with_levels)):
        if max_batches and b >= max_batches:
            break
        x_BS, y_BS = batch[0], batch[1]
        with record_routing(model) as calls:
            res = model(x_BS)
        logits = res.logits
        out["loss"].append(F.cross_entropy(logits.float().flatten(0, 1), y_BS.flatten(), reduction="none").numpy())
        level = batch[2] if with_levels else torch.full_like(y_BS, -1)
        out["level"].append(level.flatten().numpy().astype(np.int8))
        pos_T = torch.arange(x_BS.shape[1]).repeat(x_BS.shape[0])
        for k, v in token_cost(cfg.model, calls, pos_T).items():
            out[k].append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


def cost_record(tokens: dict[str, np.ndarray]) -> dict[str, Any]:
    """The ``cost`` block: params and flops per token (summary), and their means by level on graded data."""
    rec: dict[str, Any] = {"n_tokens": len(tokens["flops"]), "params": summary(tokens["params"])}
    rec["flops"] = summary(tokens["flops"])
    by_level = {}
    for lv, name in enumerate(LEVEL_NAMES):
        sel = tokens["level"] == lv
        if sel.any():
            by_level[name] = {
                "n": int(sel.sum()),
                "params_mean": float(tokens["params"][sel].mean()),
                "flops_mean": float(tokens["flops"][sel].mean()),
            }
    rec["by_level"] = by_level
    return rec


def knob_points(cfg: ModelConfig, group_topk=(), bar_widest=(), topk=()) -> list[RouteOverride]:
    """The trained routing, then every knob point this model can be served at below its training value.

    MoHGE: each K_g point twice, alone and with K scaled to keep the experts per group (K' = round(K K_g' / K_g),
    at least 1): K_g alone only narrows where the same K experts come from, so it need not cost less; then each
    bar_widest and each top-k point. Flat routers (moe, hmoe, modse): each top-k point."""
    kind, r = cfg.ffn.kind, cfg.router
    if kind == "dense":
        return [RouteOverride()]
    points = []
    if kind == "mohge":
        for k in sorted(set(group_topk), reverse=True):
            if k < r.group_topk:
                points.append(RouteOverride(group_topk=k))
                scaled = max(1, round(r.topk * k / r.group_topk))
                if scaled < r.topk:
                    points.append(RouteOverride(group_topk=k, topk=scaled))
        points += [RouteOverride(bar_widest=b) for b in sorted(set(bar_widest)) if b > 0]
    points += [RouteOverride(topk=k) for k in sorted(set(topk), reverse=True) if k < r.topk]
    ok = []
    for p in points:
        try:
            p.served(cfg)
        except ValueError:  # ConfigError: a point this model cannot take (too few groups or experts)
            continue
        ok.append(p)
    return [RouteOverride(), *ok]


# --------------------------------------------------------------------------------------------------------------
# Generation


@torch.no_grad()
def greedy_cached(hf: torch.nn.Module, prompt_BS: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation [B, new_tokens] through the export's KV cache: the prompt once, then one token a step."""
    out = hf(prompt_BS, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    got = [nxt]
    for _ in range(new_tokens - 1):
        out = hf(nxt, cache=out.cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        got.append(nxt)
    return torch.cat(got, 1)


@torch.no_grad()
def greedy_uncached(model: torch.nn.Module, prompt_BS: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation [B, new_tokens] recomputing the whole prefix every step (mohge's model or the export)."""
    seq = prompt_BS
    for _ in range(new_tokens):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return seq[:, prompt_BS.shape[1] :]


# --------------------------------------------------------------------------------------------------------------
# Timing and memory


def _timed(fn: Callable[[], Any]) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def rss_growth(fn: Callable[[], Any]) -> int | None:
    """Bytes the resident set grew to at its peak while ``fn`` ran (VmHWM after a reset minus VmRSS before);
    None where /proc/self/clear_refs cannot reset the peak."""

    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise OSError(key)

    try:
        Path("/proc/self/clear_refs").write_text("5")
        before = status("VmRSS")
    except OSError:
        return None
    fn()
    return max(0, status("VmHWM") - before)


class Served:
    """One trained model folder, loaded as mohge's model and as its HF export (shared weights)."""

    def __init__(self, ckpt: str | Path) -> None:
        self.ckpt = Path(ckpt)
        self.cfg, self.model = load_trained(self.ckpt, "cpu")
        self.hf = to_hf_model(self.model, context_length(self.cfg), eot_id=EOT_ID)
        self.name = self.cfg.name

    def paths(self, prompt_lengths: Sequence[int], batch_sizes: Sequence[int], prompt: int, new: int, seed: int):
        """name -> a no-argument function to time, and its tokens per call."""
        g = torch.Generator().manual_seed(seed)
        V = self.cfg.model.vocab_size
        out: dict[str, tuple[Callable[[], Any], int]] = {}
        for S in prompt_lengths:
            x = torch.randint(0, V, (1, S), generator=g)
            out[f"prefill_ours_{S}"] = (lambda x=x: self.model(x), S)
            out[f"prefill_hf_{S}"] = (lambda x=x: self.hf(x), S)
        for B in batch_sizes:
            x = torch.randint(0, V, (B, prompt), generator=g)
            prime = self.hf(x, use_cache=True, logits_to_keep=1)

            def decode(prime=prime):  # the new tokens only: the cached prompt is kept, its growth cut off each call
                cache = prime.cache
                extra = cache.get_seq_length() - prompt
                if extra:
                    cache.crop(-extra)
                nxt = prime.logits[:, -1].argmax(-1, keepdim=True)
                for _ in range(new):
                    nxt = self.hf(nxt, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1)[:, None]

            out[f"decode_cache_b{B}"] = (decode, B * new)
        x1 = torch.randint(0, V, (1, prompt), generator=g)
        out["decode_nocache_b1"] = (lambda: greedy_uncached(self.hf, x1, new), new)
        return out


def time_interleaved(jobs: dict[tuple[str, str], Callable[[], Any]], reps: int) -> dict[tuple[str, str], float]:
    """Median seconds of each job over ``reps`` rounds after one warm-up round; each round runs every job once, in
    an order flipped every round."""
    keys = sorted(jobs)
    with torch.no_grad():
        for k in keys:
            jobs[k]()
        times: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
        for r in range(reps):
            for k in reversed(keys) if r % 2 else keys:
                times[k].append(_timed(jobs[k]))
    return {k: statistics.median(v) for k, v in times.items()}


# --------------------------------------------------------------------------------------------------------------
# The benchmark


def bench_inference(
    ckpts: Sequence[str | Path],
    data_dir: str | Path,
    *,
    group_topk: Sequence[int] = (),
    bar_widest: Sequence[int] = (),
    topk: Sequence[int] = (),
    prompt_lengths: Sequence[int] = (16, 64, 128),
    batch_sizes: Sequence[int] = (1, 16),
    decode_tokens: int = 16,
    reps: int = 5,
    eval_batches: int = 4,
    batch_size: int = 16,
    timing: bool = True,
) -> dict[str, Any]:
    """The inference record of every model (module docstring); ``timing=False`` skips prefill, decode and memory."""
    served = [Served(c) for c in ckpts]
    records: list[dict[str, Any]] = []
    for s in served:
        seq = context_length(s.cfg)
        rec: dict[str, Any] = {
            "run": s.name,
            "family": s.cfg.family,
            "variant": s.cfg.variant,
            "dataset": s.cfg.dataset,
            "ckpt": str(s.ckpt),
            "routing": RouteOverride().served(s.cfg.model),
        }
        ours = routed_pass(s.model, s.cfg, data_dir, "val", batch_size, eval_batches)
        theirs = routed_pass(s.hf, s.cfg, data_dir, "val", batch_size, eval_batches)
        rec["cost"], rec["cost_hf"] = cost_record(ours), cost_record(theirs)
        rec["hf_max_abs_diff"] = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ("params", "flops")}
        knob = []
        for point in knob_points(
            s.cfg.model, group_topk=group_topk, bar_widest=bar_widest, topk=topk
        ):  # a fresh copy per point: the override changes the routers in place
            cfg, model = load_trained(s.ckpt, "cpu")
            routing = apply_route_override(model, cfg.model, point)
            tok = ours if point.is_identity else routed_pass(model, cfg, data_dir, "val", batch_size, eval_batches)
            loss = float(tok["loss"].mean())
            knob.append(
                {
                    "point": point.label(),
                    "routing": routing,
                    "val_loss": loss,
                    "val_ppl": float(np.exp(min(loss, 700.0))),
                    "flops_mean": float(tok["flops"].mean()),
                    "params_mean": float(tok["params"].mean()),
                    "n_tokens": len(tok["loss"]),
                }
            )
        rec["knob"] = knob
        rec["context"] = seq
        records.append(rec)
    out: dict[str, Any] = {
        "bench": "inference",
        "data": str(data_dir),
        "split": "val",
        "eval_batches": eval_batches,
        "flops": "forward, 2 x activated matmul params + causal attention scores (mohge_studies.bench.inference)",
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "torch": torch.__version__,
        "loadavg": list(os.getloadavg()),
        "models": records,
    }
    if timing:
        _time_all(served, records, prompt_lengths, batch_sizes, decode_tokens, reps)
        out["reps"] = reps
        out["memory"] = "RSS growth: VmHWM after a /proc/self/clear_refs reset minus VmRSS before (bytes)"
    out["ratios"] = family_ratios(records)
    return out


def _time_all(served, records, prompt_lengths, batch_sizes, decode_tokens, reps) -> None:
    jobs, per_call = {}, {}
    shapes = {}
    for s in served:
        seq = context_length(s.cfg)
        lengths = sorted({min(S, seq) for S in prompt_lengths})
        prompt = max(1, min(16, seq // 2))
        new = max(1, min(decode_tokens, seq - prompt))
        shapes[s.name] = {"prompt_lengths": lengths, "decode_prompt": prompt, "decode_new": new}
        for name, (fn, n) in s.paths(lengths, batch_sizes, prompt, new, seed=0).items():
            jobs[(s.name, name)], per_call[(s.name, name)] = fn, n
    med = time_interleaved(jobs, reps)
    for s, rec in zip(served, records, strict=True):
        sh = shapes[s.name]
        tps = {name: per_call[(s.name, name)] / t for (run, name), t in med.items() if run == s.name}
        rec["prefill"] = [
            {"prompt_len": S, "ours_tokens_per_s": tps[f"prefill_ours_{S}"], "hf_tokens_per_s": tps[f"prefill_hf_{S}"]}
            for S in sh["prompt_lengths"]
        ]
        rec["decode"] = [
            {
                "batch": B,
                "cache": True,
                "prompt": sh["decode_prompt"],
                "new_tokens": sh["decode_new"],
                "tokens_per_s": tps[f"decode_cache_b{B}"],
            }
            for B in batch_sizes
        ]
        rec["decode"].append(
            {
                "batch": 1,
                "cache": False,
                "prompt": sh["decode_prompt"],
                "new_tokens": sh["decode_new"],
                "tokens_per_s": tps["decode_nocache_b1"],
            }
        )
        fns = s.paths([max(sh["prompt_lengths"])], [max(batch_sizes)], sh["decode_prompt"], sh["decode_new"], 1)
        with torch.no_grad():
            rec["memory"] = {
                f"prefill_{max(sh['prompt_lengths'])}_rss_bytes": rss_growth(
                    fns[f"prefill_ours_{max(sh['prompt_lengths'])}"][0]
                ),
                f"decode_b{max(batch_sizes)}_rss_bytes": rss_growth(fns[f"decode_cache_b{max(batch_sizes)}"][0]),
            }


def _headline(rec: dict[str, Any]) -> dict[str, float]:
    """The figures a ratio is taken of: mean flops and params per token, and (when timed) tokens/s."""
    out = {"flops_per_token": rec["cost"]["flops"]["mean"], "params_per_token": rec["cost"]["params"]["mean"]}
    for p in rec.get("prefill", []):
        out[f"prefill_{p['prompt_len']}_tokens_per_s"] = p["ours_tokens_per_s"]
    for d in rec.get("decode", []):
        out[f"decode_b{d['batch']}{'' if d['cache'] else '_nocache'}_tokens_per_s"] = d["tokens_per_s"]
    return out


def family_ratios(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """MoHGE / MoE and MoHGE / dense of every headline figure both have (means over a family's runs, per dataset,
    variants apart)."""
    means: dict[tuple[str, str], dict[str, list[float]]] = {}
    for rec in records:
        fam = rec["family"] + (f"+{rec['variant']}" if rec.get("variant") else "")
        for k, v in _headline(rec).items():
            means.setdefault((rec["dataset"], fam), {}).setdefault(k, []).append(v)
    out = {}
    for (ds, fam), vals in means.items():
        if fam != "mohge":
            continue
        for ref in ("moe", "dense"):
            other = means.get((ds, ref))
            if other:
                common = sorted(set(vals) & set(other))
                key = f"{ds}:mohge_over_{ref}"
                out[key] = {k: statistics.mean(vals[k]) / statistics.mean(other[k]) for k in common}
    return out


def _print(out: dict[str, Any]) -> None:
    print(f"inference: {out['cpu']}, {out['threads']} thread(s), clock {out['clock']}")
    for rec in out["models"]:
        c = rec["cost"]
        print(
            f"  {rec['run']:<28} flops/token {c['flops']['mean']:.4g} (p90 {c['flops']['q90']:.4g})"
            f"  params/token {c['params']['mean']:.4g}"
        )
        for p in rec.get("prefill", []):
            ours, hf = p["ours_tokens_per_s"], p["hf_tokens_per_s"]
            print(f"    prefill {p['prompt_len']:>4}: {ours:9.0f} tok/s (HF {hf:.0f})")
        for d in rec.get("decode", []):
            cache = "cache" if d["cache"] else "no cache"
            print(f"    decode b{d['batch']:<3} {cache}: {d['tokens_per_s']:9.0f} tok/s")
        for k in rec["knob"]:
            print(f"    {k['point']:<20} val ppl {k['val_ppl']:8.3f}  flops/token {k['flops_mean']:.4g}", end="")
            print(f"  n {k['n_tokens']}")
    for name, r in out["ratios"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge bench inference",
        description="Per-token inference cost of trained models (prefill, cached decode, memory, activated FLOPs as "
        "routed) and validation perplexity along the cost knobs (mohge.evaluate.route_override).",
    )
    ap.add_argument("--models", nargs="+", required=True, help="trained model folders (python -m mohge.train)")
    ap.add_argument("--data", required=True, help="prepared data folder the models were trained on")
    ap.add_argument("--out", help="JSON to write")
    ap.add_argument("--group-topk", type=int, nargs="*", default=[], help="MoHGE knob points: groups per token")
    ap.add_argument("--bar-widest", type=int, nargs="*", default=[], help="MoHGE knob points: widest groups barred")
    ap.add_argument("--topk", type=int, nargs="*", default=[], help="flat-router knob points: experts per token")
    ap.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 64, 128], help="prefill lengths (capped)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16], help="cached-decode batch sizes")
    ap.add_argument("--decode-tokens", type=int, default=16, help="new tokens per decode (capped by the context)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (median)")
    ap.add_argument("--eval-batches", type=int, default=4, help="validation batches of the cost and knob passes")
    ap.add_argument("--batch-size", type=int, default=16, help="sequences per validation batch")
    ap.add_argument("--no-timing", action="store_true", help="costs and knob only: no prefill, decode, memory")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock; 0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = bench_inference(
        args.models,
        args.data,
        group_topk=args.group_topk,
        bar_widest=args.bar_widest,
        topk=args.topk,
        prompt_lengths=args.prompt_lengths,
        batch_sizes=args.batch_sizes,
        decode_tokens=args.decode_tokens,
        reps=args.reps,
        eval_batches=args.eval_batches,
        batch_size=args.batch_size,
        timing=not args.no_timing,
    )
    _print(out)
    if args.out:
        write_json_atomic(args.out, out)
    return 0
