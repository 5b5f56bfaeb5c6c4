"""The capacity study's pilot (docs/study.md "The capacity study"): bits stored against exposures.

    python studies/capacity/scripts/pilot.py SPEC.yaml NAME [--work DIR] [--results results/capacity/pilot]

SPEC holds a run config's sections (data, model, loss, train; the rest from configs/config.yaml's defaults)
and the pilot's own `curve_points` (checkpoints to score, evenly spaced). The data is prepared with
`python -m mohge.data`, the model trained with `python -m mohge.train` (every checkpoint kept), and every
checkpoint scored by the direct route of mohge.evaluate.bits_stored (B over every fact). Written to RESULTS/NAME/:
config.json (the resolved run config), curve.csv (step, exposures, bits_stored, recall), summary.json
(tokens/s, parameters, the final B by the lm-eval route as well).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mohge.config import load_run_config
from mohge.config.sizes import count_params
from mohge.core.atomic import write_json_atomic
from mohge.data.facts import fact_len, total_bits
from mohge.evaluate.bits_stored import bits_stored
from mohge.train.checkpoint import list_checkpoints, load_trained


def score(rc, scratch: Path) -> list[dict]:
    """B (direct route) of every checkpoint in SCRATCH, by step."""
    tokens_per_step = rc.train.batch_size * rc.data_config.seq_len
    per_exposure = rc.data_config.facts_num * fact_len(rc.data_config)
    rows = []
    for step, folder in sorted(list_checkpoints(scratch)):
        _, model = load_trained(folder)
        b = bits_stored(model, rc.data_config)
        rows.append(
            {
                "step": step,
                "exposures": step * tokens_per_step / per_exposure,
                "bits_stored": b["bits_stored"],
                "recall": b["recall"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def write_curve(rows: list[dict], out: Path) -> None:
    with open(out / "curve.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def partial(rc, scratch: Path, out: Path) -> int:
    """A run stopped before its last step (the session ended): its checkpoints' curve, marked partial. Up to
    the last checkpoint its schedule is the full run's, so it compares with another run at the same steps."""
    rows = score(rc, scratch)
    write_curve(rows, out)
    log = [json.loads(line) for line in (scratch / "train_log.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in log if r.get("tokens_per_s")]
    summary = {
        "name": rc.name,
        "partial": True,
        "steps_done": rows[-1]["step"],
        "steps": rc.train.steps,
        "tokens_per_s": sum(speeds) / len(speeds),
        "params": count_params(rc.model),
        "final_direct": rows[-1],
        "final_lm_eval": None,
        "total_bits": total_bits(rc.data_config),
    }
    write_json_atomic(out / "summary.json", summary)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("name")
    ap.add_argument("--work", default="work/capacity-pilot")
    ap.add_argument("--results", default="results/capacity/pilot")
    ap.add_argument(
        "--partial", action="store_true", help="score the checkpoints a stopped run left (no training, no lm-eval)"
    )
    args = ap.parse_args(argv)
    spec = yaml.safe_load(Path(args.spec).read_text())
    points = int(spec.pop("curve_points", 10))
    cfg = {"name": args.name, "dataset": "facts", "family": spec.pop("family", "moe"), "variant": "", **spec}
    cfg["model"] = {**cfg["model"], "vocab_size": cfg["data"]["vocab_size"], "max_seq_len": cfg["data"]["seq_len"]}
    steps = cfg["train"]["steps"]
    cfg["train"] = {**cfg["train"], "ckpt_every": max(1, steps // points), "keep_checkpoints": points + 1}
    work, out = Path(args.work), Path(args.results) / args.name
    out.mkdir(parents=True, exist_ok=True)
    data_key = hashlib.sha256(json.dumps(cfg["data"], sort_keys=True).encode()).hexdigest()[:12]
    data_dir = work / "data" / data_key
    cfg_path = out / "config.json"
    if not args.partial:
        write_json_atomic(cfg_path, cfg)
    rc = load_run_config(cfg_path)  # strict: a bad key is refused here, naming it
    if args.partial:
        return partial(rc, work / "scratch" / args.name, out)
    py = sys.executable
    if not (data_dir / "meta.json").is_file():
        subprocess.run([py, "-m", "mohge.data", "--config", str(cfg_path), "--out", str(data_dir)], check=True)
    run_dir, scratch = work / "runs" / args.name, work / "scratch" / args.name
    t0 = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    subprocess.run(
        [
            py,
            "-m",
            "mohge.train",
            "--config",
            str(cfg_path),
            "--data",
            str(data_dir),
            "--out",
            str(run_dir),
            "--scratch",
            str(scratch),
        ],
        check=True,
    )
    wall = time.time() - t0
    rows = score(rc, scratch)
    write_curve(rows, out)
    summary = json.loads((run_dir / "summary.json").read_text())
    params = count_params(rc.model)
    res = subprocess.run(
        [py, "-m", "mohge.evaluate", "--ckpt", str(run_dir), "--data", str(data_dir)]
        + ["--out", str(out / "metrics.json"), "--tasks", "mohge_facts", "--limit", "0"]
        + ["--batch-size", "512", "--max-loss-batches", "1"],
        check=True,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    write_json_atomic(
        out / "summary.json",
        {
            "name": args.name,
            "started_utc": started,
            "wall_s": wall,
            "tokens_per_s": summary.get("tokens_per_s"),
            "train_summary": summary,
            "params": params,
            "final_direct": rows[-1],
            "final_lm_eval": metrics.get("facts"),
            "total_bits": total_bits(rc.data_config),
        },
    )
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
