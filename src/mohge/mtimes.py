"""Give every tracked file the time of the last commit that changed it (git does not keep modification times).

A fresh clone writes its files in checkout order, so Snakemake may find a committed result older than the config
or the code it was made from and plan to remake it; with no trained models in the clone that means retraining a
whole committed study. After ``mohge mtimes``, a file is as new as its last commit: results committed
after their inputs are up to date, and a figure whose script changed after it was drawn is redrawn, as it should be.

    mohge mtimes [--repo DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode:
        raise ConfigError(f"{repo}: git {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def last_commit_times(repo: Path) -> dict[str, int]:
    """Tracked path -> commit time (seconds) of the newest commit that touched it, from one walk of the history."""
    tracked = set(_git(repo, "ls-files", "-z").split("\0")) - {""}
    times: dict[str, int] = {}
    stamp = 0
    # newest first; "@<time>" lines start a commit, the names that follow are the files it changed
    for line in _git(repo, "log", "--format=@%ct", "--name-only", "--no-renames", "-z", "HEAD").split("\0"):
        for part in line.split("\n"):
            if part.startswith("@") and part[1:].isdigit():
                stamp = int(part[1:])
            elif part in tracked and part not in times:
                times[part] = stamp
    return times


def restore(repo: Path) -> int:
    """Set each tracked file's mtime (and atime) to its last commit time; return how many files were set.
    Files with uncommitted changes keep their own time (they are newer than any commit)."""
    changed = set(_git(repo, "diff", "--name-only", "-z", "HEAD").split("\0")) - {""}
    n = 0
    times = last_commit_times(repo)
    for path, stamp in times.items():
        target = repo / path
        if path in changed or not target.is_file() or target.is_symlink():
            continue
        os.utime(target, (stamp, stamp))
        n += 1
    _date_derived_after_runs(repo, changed, set(times), _newest_drawing_code(times, changed))
    return n


# the per-run results of a committed study (results/<study>/<one of these>/...); everything else under
# results/<study>/ and figures/<study>/ is derived from them by collect, the analysis, tables and figures
PER_RUN = ("runs", "utilization", "benchmarks", "params")
# the code that draws the derived files: the workflow's scripts (Snakemake redraws an output older than its script)
# and the studies' package they import
DRAWING_CODE = ("workflow/scripts/", "studies/")


def _newest_drawing_code(times: dict[str, int], changed: set[str]) -> float:
    """The commit time of the newest committed change to the drawing code (0 without any); uncommitted changes
    are left out: they keep their own, newer time, and Snakemake redraws what they draw."""
    return max((t for p, t in times.items() if p.startswith(DRAWING_CODE) and p not in changed), default=0)


def _date_derived_after_runs(repo: Path, changed: set[str], tracked: set[str], code: float) -> None:
    """Date each derived file of a study (tracked: one second after its own commit) no older than one second after the
    study's newest per-run file and the newest committed drawing code. A rerun can leave a derived file
    byte-identical (results/<study>/params.csv when no parameter count moved; every figure when only the code that
    draws it moved): it keeps the time of an older commit than the per-run files or the script it is made from, and
    Snakemake would remake it and everything after it. Dating it after the drawing code is true because the suite
    redraws every committed table and figure from a fresh clone with today's code and finds each byte as committed
    (tests/workflow/test_study_roots.py, test_readme_commands_in_a_fresh_clone)."""
    results = repo / "results"
    for study in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        stamps = [
            f.stat().st_mtime for d in PER_RUN if (study / d).is_dir() for f in (study / d).rglob("*") if f.is_file()
        ]
        floor = max([*stamps, code]) + 1 if stamps else 0
        derived = [f for f in study.rglob("*") if f.is_file() and f.relative_to(study).parts[0] not in PER_RUN]
        figures = repo / "figures" / study.name
        derived += [f for f in figures.rglob("*") if f.is_file()] if figures.is_dir() else []
        for f in derived:
            rel = f.relative_to(repo).as_posix()
            if rel in changed:
                continue
            now = f.stat().st_mtime
            stamp = max(floor, now + (rel in tracked))
            if stamp > now:
                os.utime(f, (stamp, stamp))


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge mtimes",
        description="Set every tracked file's modification time to its last commit's time, so that Snakemake "
        "treats committed results as up to date in a fresh clone (and extends a committed study without retraining).",
    )
    ap.add_argument("--repo", default=".", help="the checkout (default: the current folder)")
    args = ap.parse_args(argv)
    repo = Path(_git(Path(args.repo), "rev-parse", "--show-toplevel").strip())
    print(f"set the commit time of {restore(repo)} files in {repo}")
    return 0
