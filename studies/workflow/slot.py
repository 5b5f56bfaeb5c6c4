"""The next runs of a study for one GPU slot: what ``kernels/gpu_all.sh``'s ladder step asks Snakemake to make.

A study too large for one slot (``studies/gpu_capacity/config.yaml``) grows slot by slot: each slot makes the results of
its next few runs, which are committed and so are sources of the next slot's workflow (a pre-declared study's committed
runs are never made again: :attr:`.plan.WorkflowPlan.committed`). The order is the declaration's, seed by seed: every
family's first seed, then every family's second, ..., families in the order the config lists them, so a study stopped
after any slot holds whole seeds of every family it can.

    mohge slot configs/config.yaml studies/gpu_capacity/config.yaml --runs 2     # the files of the next 2 runs

prints one file per line (a run's :func:`.targets.per_run_results` under the study's results root),
nothing when every run's results are in the checkout; ``--names`` prints the runs' names instead.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from mohge_studies.config.runs import RunConfig, load_yaml_or_json, merge_config, plan

from mohge.core.cli import user_errors

from .settings import trace_runs, utilization
from .targets import per_run_results


def declared_order(runs: dict[str, RunConfig], config: dict) -> list[str]:
    """Run names seed by seed (the seed's position in its experiment's list), families in the order their experiment
    lists them, experiments in the config's order."""
    rank: dict[str, tuple[int, int, int]] = {}
    for i, exp in enumerate(config["experiments"]):
        for name, cfg in runs.items():
            if name in rank or cfg.dataset != exp["dataset"] or cfg.family not in exp["families"]:
                continue
            if cfg.variant not in (exp.get("variants") or {"": None}):
                continue
            seeds = exp["seeds"]
            seeds = seeds.get(cfg.family, seeds.get("default", [])) if isinstance(seeds, dict) else seeds
            if cfg.train.seed in seeds:
                rank[name] = (seeds.index(cfg.train.seed), i, exp["families"].index(cfg.family))
    return sorted(runs, key=lambda name: (rank.get(name, (len(runs), 0, 0)), name))


def next_runs(config: dict, root: str, count: int) -> list[tuple[str, list[str]]]:
    """(run, its result files) of the next ``count`` runs, in :func:`declared_order`, whose results are not all
    under ``root``."""
    runs = plan(config, preflight=False)
    res, traced = f"results/{config.get('study', 'default')}", trace_runs(runs, utilization(config))
    out = []
    for name in declared_order(runs, config):
        files = per_run_results(res, name, traced)
        if not all(os.path.isfile(os.path.join(root, f)) for f in files):
            out.append((name, files))
        if len(out) == count:
            break
    return out


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge slot", description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", help="config files, merged in order as Snakemake does (--configfile)")
    ap.add_argument("--runs", type=int, default=2, help="how many runs (default 2)")
    ap.add_argument("--root", default=".", help="the checkout whose results/ is read (default: here)")
    ap.add_argument("--names", action="store_true", help="print the runs' names, not their result files")
    args = ap.parse_args(argv)
    config: dict = {}
    for path in args.configs:
        config = merge_config(config, load_yaml_or_json(path))
    for name, files in next_runs(config, args.root, args.runs):
        print(name if args.names else "\n".join(files))
    return 0
