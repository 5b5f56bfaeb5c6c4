"""What the fake SLURM commands share: the call log, the job table and SLURM's host lists.

Every fake appends one JSON line to ``$FAKE_SLURM_DIR/calls.jsonl``: the command, its argv, its working folder
and the SLURM_* variables of its environment, so a test can assert what the executor plugin, the jobstep plugin
and the rule's own command handed to SLURM. ``$FAKE_SLURM_DIR/jobs/<id>.json`` holds a job as ``sbatch`` made it
(its nodes, its state), read by ``srun`` (which attaches to the allocation of ``$SLURM_JOB_ID``, as SLURM's
does), ``scontrol`` and ``sacct``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

STATE = Path(os.environ["FAKE_SLURM_DIR"])
JOBS = STATE / "jobs"


def log(name: str, **extra) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SRUN_", "SBATCH_"))}
    entry = {"cmd": name, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": env, **extra}
    with open(STATE / "calls.jsonl", "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def next_id(name: str, start: int) -> int:
    """A counter in the state folder (one fake runs at a time in these tests)."""
    path = STATE / f"{name}.next"
    value = int(path.read_text()) if path.exists() else start
    path.write_text(str(value + 1))
    return value


def job(jobid: str) -> dict:
    return json.loads((JOBS / f"{jobid}.json").read_text())


def save_job(jobid: str, record: dict) -> None:
    JOBS.mkdir(exist_ok=True)
    (JOBS / f"{jobid}.json").write_text(json.dumps(record))


def hostlist(hosts: list[str]) -> str:
    """SLURM's compact form: node[001-002]."""
    if len(hosts) == 1:
        return hosts[0]
    nums = [h.removeprefix("node") for h in hosts]
    return f"node[{nums[0]}-{nums[-1]}]"


def expand(spec: str) -> list[str]:
    """scontrol show hostnames: node[001-003] -> node001 node002 node003."""
    m = re.fullmatch(r"(\w+?)\[(\d+)-(\d+)\]", spec)
    if not m:
        return [h for h in spec.split(",") if h]
    prefix, lo, hi = m[1], m[2], m[3]
    return [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
