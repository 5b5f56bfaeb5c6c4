"""The README's two commands in a fresh clone, timed as a user meets them, with the host they ran on.

    mohge bench front-door --json results/bench/front_door_avx2.json [--targets test run] [--repo .]
        [--pytest-args '-m "not slow"']

Clones the repository's committed HEAD (``git clone``: what a user gets; uncommitted changes are not measured, and the
command says so) into a temporary folder and runs each of ``--targets`` there in order (``make test``, then ``make
run``: the first sets up ``.venv``), each in its own session with no terminal and stdin from /dev/null, as a
background or CI run starts it. Each target's wall time is the clock around it; its user and system CPU times are
those of the ``make`` process and every process it waited for (``os.wait4``). The record adds:

* the host: the CPU, its vector and matrix units as ATen and /proc/cpuinfo see them (``avx2``, ``avx512_bf16``,
  ``amx_bf16``: the host kinds the project's budgets name), cores, memory, and the load average before each target
  (the budgets are for an otherwise idle machine: a load above 0.5 is recorded, not refused);
* for ``make test``: pytest's own summary line, its counts and the suite's wall time, and what setup took; with
  ``--pytest-args``, ``make test PYTEST_ARGS=...`` times that selection of the suite (the record's ``command``);
* for ``make run``: the Snakemake jobs of each kind this run made (the study's benchmark files written during it:
  ``results/<study>/benchmarks/<rule>/``), with their count and summed seconds;
* with ``--processes``: where the target's CPU time went, Python process by Python process (:func:`processes`). A
  ``sitecustomize`` module on ``PYTHONPATH`` (:data:`HOOK`) appends one line to a log as each Python process that
  inherits the environment exits normally: its command line, its own CPU seconds, the test pytest was running when it
  started (``PYTEST_CURRENT_TEST``) and whether it imported torch. A process that replaces or clears the environment
  or ends by a signal or ``os._exit`` is not in it: ``logged_cpu_s`` against the target's CPU time says how much is.

Each target's output is kept beside the record (``<json stem>.<target>.log``; with ``--processes`` its process log,
``<json stem>.<target>.processes.jsonl``). The record is written whole or not at all; a target that fails is
recorded with its exit status and the command exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from mohge.core.atomic import write_json_atomic

from .step import host

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("test", "run")
# the benchmark folders of a study's rules, as the record names their jobs
JOB_KINDS = {"train": "train", "eval": "evaluate", "inference": "inference"}
# the host kinds the budgets name, fastest first: (unit in the record's matrix_units, its words)
KINDS = (("amx_bf16", "AMX"), ("avx512_bf16", "avx512_bf16"), ("avx512f", "AVX-512"), ("avx2", "AVX2 only"))
# pytest's closing line between its rules of '=', whichever count comes first (``1 failed, 1171 passed, ...``)
SUMMARY = re.compile(r"^=+ (\d+ (?:failed|passed|error)[^\n]*? in ([\d.]+)s[^\n]*?) =+$", re.M)


def machine() -> dict:
    """The host of the record: :func:`.step.host` (CPU, ATen's capability, vector and matrix units, cores, versions)
    and its memory."""
    mem_kib = next(
        (int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")), 0
    )
    return {**host(), "memory_gib": round(mem_kib / 2**20, 1)}


def host_kind(machine: dict) -> str:
    """A record's host in the words of the project's budgets: its CPU's maker and line and the fastest units it has
    for training (``an Intel Xeon with AMX``, ``an AMD EPYC with avx512_bf16``, ``an AMD EPYC with AVX2 only``)."""
    words = re.sub(r"\((R|TM)\)", "", machine.get("cpu", "")).split()
    name = " ".join(w for w in words[:2] if w != "Processor")
    name = f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}" if name else "a CPU"
    units = set(machine.get("matrix_units", []))
    kind = next((k for u, k in KINDS if u in units), "")
    return f"{name} with {kind}" if kind else name


def pytest_summary(text: str) -> dict:
    """pytest's last summary line (``909 passed, 13 skipped, 5 warnings in 554.20s (0:09:14)``) and its counts."""
    found = SUMMARY.findall(text)
    if not found:
        return {"pytest_summary": None}
    line, seconds = found[-1]
    count = {
        k: int(m.group(1)) if (m := re.search(rf"(\d+) {k}", line)) else 0 for k in ("passed", "failed", "skipped")
    }
    return {"pytest_summary": line, "pytest_wall_s": float(seconds), **count}


def benchmark_files(clone: Path) -> dict[Path, int]:
    """Every Snakemake benchmark file of every study under ``clone/results``, with its modification time (ns)."""
    return {tsv: tsv.stat().st_mtime_ns for tsv in sorted((clone / "results").glob("*/benchmarks/*/*.tsv"))}


def job_seconds(clone: Path, before: dict[Path, int]) -> dict:
    """{kind: {jobs, wall_s}} of the Snakemake benchmark files the run wrote: those not in ``before`` (the files and
    times :func:`benchmark_files` found as it started: the commit's) or written again since."""
    out: dict[str, dict] = {}
    for tsv, mtime in benchmark_files(clone).items():
        if before.get(tsv) == mtime:
            continue
        kind = JOB_KINDS.get(tsv.parent.name, tsv.parent.name)
        rows = tsv.read_text().splitlines()
        seconds = float(rows[1].split("\t")[0]) if len(rows) > 1 else 0.0
        entry = out.setdefault(kind, {"jobs": 0, "wall_s": 0.0})
        entry["jobs"] += 1
        entry["wall_s"] = round(entry["wall_s"] + seconds, 2)
    return out


# The sitecustomize of --processes: one JSON line per Python process at its normal exit, appended to the file
# MOHGE_PROCESS_LOG names (one write of one line: lines of processes exiting together do not interleave).
HOOK = """\
import atexit, json, os, sys


def _mohge_process_record():
    try:
        t = os.times()
        line = json.dumps({
            "argv": getattr(sys, "orig_argv", sys.argv)[:8],
            "cpu_s": round(t.user + t.system, 3),
            "test": _MOHGE_TEST,
            "torch": "torch" in sys.modules,
        })
        fd = os.open(os.environ["MOHGE_PROCESS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)
    except Exception:
        pass


_MOHGE_TEST = os.environ.get("PYTEST_CURRENT_TEST", "")
if os.environ.get("MOHGE_PROCESS_LOG"):
    atexit.register(_mohge_process_record)
"""
# How many rows of each breakdown the record keeps (the largest)
TOP = 25


def command_kind(argv: Sequence[str]) -> str:
    """What a logged Python process was, in a few words: ``snakemake`` (its command line), ``snakemake script
    plot_curves`` (a rule's script job), ``python -m mohge.train``, ``python -m mohge bench`` (a module and its
    subcommand), ``pytest worker`` (pytest-xdist), ``python -c``, else the script's file name (``lm_eval``)."""
    args = [str(a) for a in argv]
    text = " ".join(args)
    if m := re.search(r"\.snakemake/scripts/tmp\w+\.(\w+)\.py", text):
        return f"snakemake script {m.group(1)}"
    if "execnet" in text or "import sys;exec(eval(sys.stdin.readline()))" in text:
        return "pytest worker"
    if "-m" in args[1:]:
        i = args.index("-m", 1)
        module = args[i + 1] if i + 1 < len(args) else "?"
        sub = args[i + 2] if i + 2 < len(args) and re.fullmatch(r"[a-z][\w-]*", args[i + 2]) else ""
        return f"python -m {module} {sub}".rstrip()
    if "-c" in args[1:]:
        return "python -c"
    script = next((a for a in args[1:] if not a.startswith("-")), args[0] if args else "?")
    return Path(script).name


def processes(log: Path, top: int = TOP) -> dict:
    """The Python processes of :data:`HOOK`'s ``log``: how many, their CPU seconds, how many imported torch, and the
    largest rows of their CPU time by :func:`command_kind` and by the test file that was running (``(no test)``:
    outside pytest's tests, the set-up included), each {name, processes, cpu_s}."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []

    def breakdown(key) -> list[dict]:
        acc: dict[str, list] = {}
        for r in rows:
            entry = acc.setdefault(key(r), [0, 0.0])
            entry[0] += 1
            entry[1] += r["cpu_s"]
        ranked = sorted(acc.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"name": k, "processes": n, "cpu_s": round(c, 1)} for k, (n, c) in ranked]

    return {
        "logged": len(rows),
        "logged_cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
        "importing_torch": sum(bool(r["torch"]) for r in rows),
        "by_command": breakdown(lambda r: command_kind(r["argv"])),
        "by_test_file": breakdown(lambda r: r["test"].split("::")[0] or "(no test)"),
    }


def run_target(clone: Path, target: str, log: Path, hook: Path | None = None, pytest_args: str = "") -> dict:
    """``make <target>`` in ``clone``, in its own session, no terminal: wall, user and system seconds, exit status;
    with ``hook`` (a folder holding :data:`HOOK` as sitecustomize.py), its Python processes (:func:`processes`);
    ``pytest_args``: the Makefile's ``PYTEST_ARGS`` of ``make test`` (a selection of the suite)."""
    make_vars = [f"PYTEST_ARGS={pytest_args}"] if target == "test" and pytest_args else []
    load = list(os.getloadavg())
    env = dict(os.environ)
    if hook is not None:
        plog = log.with_suffix(".processes.jsonl")
        plog.unlink(missing_ok=True)
        env.update(MOHGE_PROCESS_LOG=str(plog.resolve()))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p)
    before, start = benchmark_files(clone), time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["make", target, *make_vars], cwd=clone, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait again
    rec = {
        "command": shlex.join(["make", target, *make_vars]),
        "exit_status": proc.returncode,
        "loadavg_before": load,
        "wall_s": round(wall, 2),
        "user_s": round(usage.ru_utime, 2),
        "system_s": round(usage.ru_stime, 2),
        "log": log.name,
    }
    text = log.read_text(errors="replace")
    if target == "test":
        rec.update(pytest_summary(text))
        if rec.get("pytest_wall_s") is not None:
            rec["setup_and_startup_s"] = round(wall - rec["pytest_wall_s"], 2)
    if target == "run":
        rec["job_seconds"] = job_seconds(clone, before)
        rec["jobs"] = sum(k["jobs"] for k in rec["job_seconds"].values())
    if hook is not None:
        rec["processes"] = processes(plog)
    return rec


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench front-door", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, type=Path, help="the record to write (target logs go beside it)")
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS, help="make targets, in order")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the repository to clone (its committed HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument(
        "--processes",
        action="store_true",
        help="also record the CPU time of each Python process the targets start, by command and by test file",
    )
    ap.add_argument(
        "--pytest-args",
        default="",
        help="make test's PYTEST_ARGS, a selection of the suite, e.g. '-m \"not slow and not multiprocess\"' (default: "
        "the whole suite)",
    )
    args = ap.parse_args(argv)
    repo = args.repo.resolve()
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True)
    if head.returncode != 0:
        print(f"mohge bench front-door: {repo} is not a git checkout", file=sys.stderr)
        return 2
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    if dirty:
        print(f"mohge bench front-door: {repo} has uncommitted changes; the clone measures HEAD without them")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="front-door-"))
    clone = tmp / repo.name
    record = {
        "what": "the README's commands in a fresh clone (git clone of HEAD), each make target in its own session, "
        "no terminal, stdin /dev/null; CPU times of make and every process it waited for",
        "machine": machine(),
        "commit": head.stdout.strip(),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    failed = False
    hook = None
    if args.processes:
        hook = tmp / "process_hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
    try:
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(clone)], check=True)
        for target in args.targets:
            log = args.json.with_name(f"{args.json.stem}.{target}.log")
            print(f"make {target} in {clone} (output: {log}) ...", flush=True)
            rec = run_target(clone, target, log, hook, args.pytest_args)
            record[f"make_{target}"] = rec
            cpu = (rec["user_s"] + rec["system_s"]) / 60
            print(f"  make {target}: exit {rec['exit_status']}, {rec['wall_s'] / 60:.1f} min wall, {cpu:.1f} min CPU")
            if rec["exit_status"] != 0:
                failed = True
                break
    finally:
        if args.keep:
            print(f"kept the clone: {clone}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    write_json_atomic(args.json, record)
    print(f"wrote {args.json}")
    return 1 if failed else 0
