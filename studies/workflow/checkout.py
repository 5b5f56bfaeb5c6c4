"""What the workflow reads of the checkout it runs in: tracked files, the configs that name a study, the targets
Snakemake was asked for, the committed studies and whether a kernel benchmark holds a GPU measurement."""

from __future__ import annotations

import copy
import csv
import functools
import glob
import os
import subprocess
from collections.abc import Sequence

from mohge_studies import config_file
from mohge_studies.config.runs import merge_config

from mohge.config import load_yaml_or_json


def git_tracked(folder: str) -> list[str]:
    """Files git tracks under ``folder`` of the working directory ([] outside a git work tree, or without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", folder], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [f for f in out.stdout.split("\0") if f] if out.returncode == 0 else []


def asked_targets(argv: Sequence[str]) -> set[str]:
    """The targets on snakemake's command line ``argv`` (the Snakefile is parsed before the API hands them
    over); nothing when ``argv`` is not a snakemake command line."""
    # .../bin/snakemake, or .../snakemake/__main__.py under `python -m snakemake`
    cli = os.path.normpath(argv[0]).split(os.sep)[-2:] if argv else []
    if not cli or (cli[-1] != "snakemake" and cli != ["snakemake", "__main__.py"]):
        return set()
    from snakemake.cli import get_argument_parser

    args, _ = get_argument_parser().parse_known_args(list(argv[1:]))
    return set(args.targets or ())


def _load(path: str) -> dict:
    """A config file's mapping, parsed once per version of the file (its size and modification time) a process sees:
    the plan asks for every study's config, and each search reads the folder's files."""
    st = os.stat(path)
    return copy.deepcopy(_parsed(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return load_yaml_or_json(path)


def study_config_file(checkout: str, study: str) -> tuple[dict | None, str | None]:
    """(config, file) of ``study`` in ``checkout``: configs/config.yaml when it names the study, else the study's
    folder's config.yaml (mohge_studies.STUDIES), else the first file in configs/ (by name) that names it, merged
    over configs/config.yaml as --configfile merges it; (None, None) when no file names it."""
    configs = os.path.join(checkout, "configs")
    default = os.path.join(configs, "config.yaml")
    base = _load(default)
    if base.get("study", "default") == study:
        return base, default
    own = config_file(study, checkout)
    for path in ([own] if own else []) + sorted(glob.glob(os.path.join(configs, "*.yaml"))):
        data = _load(path)
        if data.get("study") == study:
            return merge_config(base, data), path
    return None, None


def committed_studies(root: str = ".") -> list[str]:
    """Every study with collected results under ``root`` (results/<study>/runs.csv): the figures target."""
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(root, "results/*/runs.csv")))


def measured_kernels(path: str) -> bool:
    """Whether the kernel benchmark CSV ``path`` holds a GPU measurement (a row with a device that is not a CPU
    and a TFLOP/s value): only then is F6 part of a study's figures; a placeholder never is."""
    if not os.path.isfile(path):
        return False
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return any(
        (r.get("device") or "").strip() and "cpu" not in r["device"].lower() and (r.get("tflops") or "").strip()
        for r in rows
    )
