"""``mohge bench precision``: does bf16 training follow fp32 at a study's own size and length?

Trains one run config in fp32 and in bf16 (``train.precision``; mohge.train.runtime: fp32 master weights and
optimizer state, bf16 matrix products forward and backward) on the same seeds, data and schedule, and reports each
pair's final validation loss, their relative difference and the tokens/s ratio, with the verdict of the precision
criterion (every seed's final val loss within ``--tolerance``, 1 %). Each training is a normal ``mohge.train`` run in
``OUT/<precision>-s<seed>/``: a rerun resumes or skips what has finished.

    mohge bench precision --config results/claims/runs/shakespeare-mohge-s0/config.json \\
        --data work/claims/data/shakespeare --seeds 0 1 2 --out work/bench/precision --json results/bench/precision.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from mohge_studies.config.runs import merge_config

from mohge.config import RunConfig, load_run_config, to_dict
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors

PRECISIONS = ("fp32", "bf16")


def variant(cfg: RunConfig, seed: int, precision: str, steps: int | None) -> RunConfig:
    """The run config with its seed, precision (and optionally its length) replaced, validated again."""
    train = {"seed": seed, "precision": precision, **({"steps": steps} if steps else {})}
    return RunConfig.from_dict(merge_config(to_dict(cfg), {"train": train}))


def compare(rows: list[dict], tolerance: float) -> dict:
    """Per seed: bf16's final val loss relative to fp32's, and the tokens/s ratio; the verdict over all seeds."""
    by = {(r["seed"], r["precision"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows if (r["seed"], "fp32") in by and (r["seed"], "bf16") in by})
    pairs = []
    for s in seeds:
        a, b = by[(s, "fp32")], by[(s, "bf16")]
        pairs.append(
            {
                "seed": s,
                "val_loss_fp32": a["val_loss"],
                "val_loss_bf16": b["val_loss"],
                "rel_diff": b["val_loss"] / a["val_loss"] - 1,
                "tokens_per_s_ratio": b["tokens_per_s"] / a["tokens_per_s"],
            }
        )
    diffs = [p["rel_diff"] for p in pairs]
    fp32 = [p["val_loss_fp32"] for p in pairs]
    return {
        "pairs": pairs,
        "n_seeds": len(pairs),
        "tolerance": tolerance,
        "max_abs_rel_diff": max(map(abs, diffs)) if diffs else None,
        "mean_rel_diff": statistics.fmean(diffs) if diffs else None,
        # how far apart the fp32 seeds themselves end: the scale bf16's differences are read against
        "fp32_seed_spread": (max(fp32) / min(fp32) - 1) if len(fp32) > 1 else None,
        "within_tolerance": bool(diffs) and all(abs(d) <= tolerance for d in diffs),
    }


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge bench precision",
        description="Train one run config in fp32 and bf16 on the same seeds; compare final val loss.",
    )
    ap.add_argument("--config", required=True, help="a resolved run config (results/<study>/runs/<run>/config.json)")
    ap.add_argument("--data", required=True, help="its prepared dataset (work/<study>/data/<dataset>)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=0, help="training steps (0: the config's own)")
    ap.add_argument("--tolerance", type=float, default=0.01, help="allowed |bf16 / fp32 - 1| of the final val loss")
    ap.add_argument("--out", required=True, help="folder of the trainings, OUT/<precision>-s<seed>/")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    from mohge.train.trainer import train  # the training stack only once the arguments parsed

    base = load_run_config(args.config)
    rows = []
    for seed in args.seeds:
        for precision in PRECISIONS:
            cfg = variant(base, seed, precision, args.steps or None)
            out = Path(args.out) / f"{precision}-s{seed}"
            done = out / "summary.json"
            if done.is_file() and json.loads((out / "config.json").read_text()) == to_dict(cfg):
                summary = json.loads(done.read_text())
            else:
                print(f"precision: training {cfg.name} seed {seed} in {precision} -> {out}", flush=True)
                summary = train(cfg, out, data=args.data)
            rows.append(
                {
                    "seed": seed,
                    "precision": precision,
                    "steps": cfg.train.steps,
                    "val_loss": summary["val_loss"],
                    "tokens_per_s": summary["tokens_per_s"],
                    "wall_time_s": summary["wall_time_s"],
                    "precision_used": summary.get("precision"),
                }
            )
    result = {
        "config": str(args.config),
        "run": base.name,
        "rows": rows,
        **compare(rows, args.tolerance),
        "cpu_bf16": summary.get("cpu_bf16"),
        "code": summary.get("code"),
    }
    for p in result["pairs"]:
        print(
            f"seed {p['seed']}: val loss fp32 {p['val_loss_fp32']:.4f}  bf16 {p['val_loss_bf16']:.4f}"
            f"  ({p['rel_diff']:+.2%}), tokens/s bf16/fp32 {p['tokens_per_s_ratio']:.2f}"
        )
    verdict = "within" if result["within_tolerance"] else "NOT within"
    print(f"bf16 vs fp32: {verdict} {args.tolerance:.0%} on {result['n_seeds']} seeds")
    if args.json:
        write_json_atomic(args.json, result)
    return 0
