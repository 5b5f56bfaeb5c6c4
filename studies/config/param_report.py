"""The ``mohge params`` command: total and activated parameters by component of a model preset, of a resolved run
config, or of a run that a workflow config plans (the counts are :mod:`mohge.config.sizes`'s closed forms).

    mohge params configs/models/mohge-3b.yaml [--compare configs/models/moe-3b.yaml]
    mohge params configs/paper.yaml [--run web-moe-s0]      # a workflow config: one of its runs
    mohge params results/<study>/runs/<run>/config.json      # a resolved run config
        [--histogram trace.json] [--json out.json]

A workflow config (a file with ``study``, ``datasets`` or ``experiments``) is merged over the checkout's
configs/config.yaml, as the workflow merges a ``--configfile`` over it, and planned
(:func:`mohge_studies.config.runs.plan`, without the checks of files, tasks and devices), so each run's model has its
dataset's vocabulary and context. The run counted is ``--run``, else the first MoHGE run the config plans (as ``mohge
sizing`` picks), else, when every run has the same size, the first run; a config that plans runs of several sizes and no
MoHGE run needs ``--run``, and the refusal lists its runs. Torch is not imported: the command answers in a fraction of a
second.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from mohge.config.sections import ModelConfig, RunConfig, load_model_config
from mohge.config.sizes import COMPONENTS, count_params, param_totals
from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError, load_yaml_or_json

from .runs import merge_config, plan

# the workflow's default config (the Snakefile's `configfile:`), which every --configfile is merged over
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "config.yaml"
# top-level keys that only a workflow config has (a run config has `dataset` and `data`; a preset has neither)
WORKFLOW_KEYS = ("study", "datasets", "experiments")


def is_workflow_config(data: dict) -> bool:
    return any(k in data for k in WORKFLOW_KEYS)


def planned_runs(path: str | Path, base: Path = DEFAULT_CONFIG) -> dict[str, RunConfig]:
    """The runs of the workflow config ``path`` merged over ``base`` (when the checkout has it), in plan order."""
    config = load_yaml_or_json(path)
    if base.is_file() and Path(path).resolve() != base.resolve():
        config = merge_config(load_yaml_or_json(base), config)
    return plan(config, preflight=False)


def pick_run(runs: dict[str, RunConfig], run: str | None, where: str, option: str = "--run") -> str:
    """``run``, else the first MoHGE run, else the first run when all have one size (module docstring)."""
    if run is not None:
        if run not in runs:
            raise ConfigError(f"{option} {run!r}: not a run of {where} (runs: {', '.join(runs)})")
        return run
    mohge = next((name for name, cfg in runs.items() if cfg.family == "mohge"), None)
    if mohge is not None:
        return mohge
    sizes = {json.dumps(param_totals(cfg.model), sort_keys=True) for cfg in runs.values()}
    if len(sizes) > 1:
        raise ConfigError(
            f"{option}: {where} plans runs of {len(sizes)} sizes and no MoHGE run; pick one with {option} NAME "
            f"(runs: {', '.join(runs)})"
        )
    return next(iter(runs))


def load_counted(path: str, run: str | None, option: str = "--run") -> tuple[ModelConfig, str | None, int]:
    """(model, run name or None, runs planned) of a model preset, a resolved run config or a workflow config."""
    data = load_yaml_or_json(path)
    if not is_workflow_config(data):
        if run is not None:
            raise ConfigError(f"{option} {run!r}: {path} is not a workflow config (it plans no runs)")
        return load_model_config(path), None, 0
    runs = planned_runs(path)
    name = pick_run(runs, run, path, option)
    return runs[name].model, name, len(runs)


def _fmt(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def report(name: str, counts: dict, other: dict | None = None) -> str:
    lines = [
        f"{name}",
        f"  {'component':<16}{'total':>12}{'activated':>12}" + ("   vs compare" if other else ""),
    ]
    for c in COMPONENTS:
        t, a = counts["total"][c], counts["activated"][c]
        if t == 0 and not (other and other["total"][c]):
            continue
        rel = ""
        if other and other["total"][c]:
            rel = f"   {100 * (t / other['total'][c] - 1):+.2f}%"
        lines.append(f"  {c:<16}{_fmt(t):>12}{_fmt(a):>12}{rel}")
    for label, tkey, akey in (
        ("sum", "total_sum", "activated_sum"),
        ("non-embedding", "total_non_embedding", "activated_non_embedding"),
    ):
        rel = ""
        if other:
            rel = f"   {100 * (counts[tkey] / other[tkey] - 1):+.2f}% / {100 * (counts[akey] / other[akey] - 1):+.2f}%"
        lines.append(f"  {label:<16}{_fmt(counts[tkey]):>12}{_fmt(counts[akey]):>12}{rel}")
    return "\n".join(lines)


def _title(path: str, run: str | None, n_runs: int) -> str:
    return f"{path}: run {run} (of {n_runs} planned)" if run else path


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge params",
        description="Total and activated parameters by component of a model preset, a resolved run config, or a "
        "run of a workflow config.",
        epilog="A workflow config (with study, datasets or experiments) is merged over configs/config.yaml, as the "
        "workflow merges it, and its runs are planned: each model has its dataset's vocabulary. Without --run the "
        "first MoHGE run is counted (the first run when the config plans no MoHGE run and all its runs have one "
        "size; else --run is needed).",
    )
    ap.add_argument(
        "config",
        help="model preset (configs/models/*.yaml), resolved run config (results/<study>/runs/<run>/config.json) "
        "or workflow config (configs/*.yaml)",
    )
    ap.add_argument("--run", help="which run of a workflow config (default: its first MoHGE run)")
    ap.add_argument("--compare", help="a second config to compare against (e.g. the homogeneous MoE)")
    ap.add_argument("--compare-run", help="which run of a workflow --compare config (default: its first MoHGE run)")
    ap.add_argument(
        "--histogram",
        help="JSON file: a list (one per MoE layer, or one for all) of per-expert token counts, router order",
    )
    ap.add_argument("--json", help="also write the counts as JSON here")
    args = ap.parse_args(argv)
    cfg, run, n_runs = load_counted(args.config, args.run)
    hist = json.loads(Path(args.histogram).read_text()) if args.histogram else None
    counts = count_params(cfg, hist)
    other = other_run = None
    if args.compare:
        other_cfg, other_run, other_n = load_counted(args.compare, args.compare_run, "--compare-run")
        other = count_params(other_cfg)
    elif args.compare_run:
        raise ConfigError(f"--compare-run {args.compare_run!r}: goes with --compare")
    print(report(_title(args.config, run, n_runs), counts, other))
    if other:
        print(report(_title(args.compare, other_run, other_n), other))
    if args.json:
        out = {"config": args.config, **({"run": run} if run else {}), **counts}
        if other:
            out["compare"] = {"config": args.compare, **({"run": other_run} if other_run else {}), **other}
        write_json_atomic(args.json, out)
    return 0
