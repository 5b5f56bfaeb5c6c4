"""`mohge bench front-door`: the README's make targets in a fresh clone, timed, with the host they ran on.

The repository here is a small one of this test's making whose make targets print what pytest prints and write what a
study's rules write, so that what the record reads of a real run (pytest's summary, the benchmark files of the jobs,
the CPU time of every process make waits for) is checked in seconds; the real targets are what a user runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MAKEFILE = """\
test:
\t@{py} -c "sum(range(3 * 10**7))"
\t@printf 'arg[%s] ' $(PYTEST_ARGS) && echo
\t@echo "========== 3 passed, 1 skipped, 2 warnings in 0.42s =========="
run:
\t@mkdir -p results/toy/benchmarks/train results/toy/benchmarks/eval
\t@printf 's\\th:m:s\\n1.5\\t0:00:01\\n' > results/toy/benchmarks/train/a.tsv
\t@printf 's\\th:m:s\\n2.5\\t0:00:02\\n' > results/toy/benchmarks/train/b.tsv
\t@printf 's\\th:m:s\\n9\\t0:00:09\\n' > results/toy/benchmarks/eval/a.tsv
broken:
\t@exit 3
"""


def _repo(tmp_path: Path, makefile: str) -> Path:
    repo = tmp_path / "toy"
    (repo / "results" / "toy" / "benchmarks" / "inference").mkdir(parents=True)
    (repo / "Makefile").write_text(makefile.format(py=sys.executable))
    # a benchmark file the commit holds: older than the run, not one of its jobs
    (repo / "results" / "toy" / "benchmarks" / "inference" / "old.tsv").write_text("s\th:m:s\n7\t0:00:07\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "toy"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def _front_door(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mohge", "bench", "front-door", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_the_record_holds_both_targets_the_host_the_suite_summary_and_the_jobs_this_run_made(tmp_path):
    repo = _repo(tmp_path, MAKEFILE)
    out = tmp_path / "rec" / "front_door.json"
    r = _front_door("--json", str(out), "--repo", str(repo))
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads(out.read_text())
    host = rec["machine"]
    assert host["cores"] >= 1 and host["memory_gib"] > 0 and host["cpu_capability"] and "matrix_units" in host
    test, run = rec["make_test"], rec["make_run"]
    assert test["exit_status"] == 0 and test["passed"] == 3 and test["skipped"] == 1 and test["failed"] == 0
    assert test["pytest_summary"] == "3 passed, 1 skipped, 2 warnings in 0.42s" and test["pytest_wall_s"] == 0.42
    assert test["user_s"] > 0.1, test  # the Python make ran is counted: CPU time of every process make waited for
    assert run["job_seconds"] == {"train": {"jobs": 2, "wall_s": 4.0}, "evaluate": {"jobs": 1, "wall_s": 9.0}}
    assert run["jobs"] == 3  # the committed inference file is older than the run
    assert rec["commit"] and (out.parent / "front_door.test.log").is_file()


def test_a_selection_of_the_suite_reaches_make_test_as_its_pytest_args_and_the_record_names_it(tmp_path):
    repo = _repo(tmp_path, MAKEFILE)
    out = tmp_path / "rec" / "front_door.json"
    r = _front_door("--json", str(out), "--repo", str(repo), "--targets", "test", "--pytest-args", '-m "not slow"')
    assert r.returncode == 0, r.stderr[-2000:]
    test = json.loads(out.read_text())["make_test"]
    assert test["command"] == """make test 'PYTEST_ARGS=-m "not slow"'""" and test["passed"] == 3
    assert "arg[-m] arg[not slow]" in (out.parent / "front_door.test.log").read_text()  # the arguments pytest gets


def test_a_failing_target_is_recorded_with_its_status_and_the_command_fails(tmp_path):
    repo = _repo(tmp_path, MAKEFILE.replace("test:\n", "test: broken\n"))
    out = tmp_path / "front_door.json"
    r = _front_door("--json", str(out), "--repo", str(repo))
    rec = json.loads(out.read_text())
    assert r.returncode == 1 and rec["make_test"]["exit_status"] == 2 and "make_run" not in rec


def test_a_folder_that_is_no_checkout_is_refused_in_one_line(tmp_path):
    r = _front_door("--json", str(tmp_path / "x.json"), "--repo", str(tmp_path))
    assert r.returncode == 2 and "is not a git checkout" in r.stderr and not (tmp_path / "x.json").exists()


def test_each_host_kind_of_the_budgets_is_named_by_its_fastest_units():
    """The words README and docs/speed.md give a record's host: maker and line, then AMX, avx512_bf16, AVX-512 or
    AVX2 only, whichever of them the host has first."""
    from mohge_studies.bench.front_door import host_kind

    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "matrix_units": ["amx_bf16", "avx2", "avx512_bf16", "avx512f"]}
    assert host_kind(xeon) == "an Intel Xeon with AMX"
    epyc = {"cpu": "AMD EPYC 9B14 96-Core Processor", "matrix_units": ["avx2", "avx512_bf16", "avx512f"]}
    assert host_kind(epyc) == "an AMD EPYC with avx512_bf16"
    assert host_kind({**epyc, "matrix_units": ["avx2"]}) == "an AMD EPYC with AVX2 only"
    assert host_kind({"cpu": "", "matrix_units": ["avx2", "avx512f"]}) == "a CPU with AVX-512"


def test_a_suite_with_failures_is_counted_from_its_whole_summary_line():
    """pytest puts failures first on its closing line; the record counts them, and the passes after them."""
    from mohge_studies.bench.front_door import pytest_summary

    line = "1 failed, 1171 passed, 20 skipped, 34 warnings in 1088.82s (0:18:08)"
    rec = pytest_summary(f"...\nFAILED tests/x.py::test_y\n===== {line} =====\nmake: *** [Makefile:26: test] Error 1\n")
    assert (rec["failed"], rec["passed"], rec["skipped"], rec["pytest_wall_s"]) == (1, 1171, 20, 1088.82)
    assert rec["pytest_summary"] == line
    assert pytest_summary("== 2 errors in 3.10s ==")["pytest_wall_s"] == 3.1
    assert pytest_summary("no summary")["pytest_summary"] is None


def test_with_processes_each_python_process_of_a_target_is_logged_with_its_cpu_time_and_test(tmp_path):
    """--processes: the Python processes a target starts are counted by command and by the test that started them
    (PYTEST_CURRENT_TEST in their environment), with their own CPU time; one that replaces the environment or is
    killed by a signal is not, and the record shows that as the gap between the logged and the target's CPU time."""
    makefile = MAKEFILE.replace(
        '\t@{py} -c "sum(range(3 * 10**7))"\n',
        '\t@PYTEST_CURRENT_TEST= {py} -c "sum(range(3 * 10**7))"\n'
        '\t@PYTEST_CURRENT_TEST="tests/unit/test_x.py::test_y (call)" {py} -m json.tool --help > /dev/null\n'
        '\t@env -i {py} -c "pass"\n'
        '\t@{py} -c "import os, signal; os.kill(os.getpid(), signal.SIGKILL)" || true\n',
    )
    repo = _repo(tmp_path, makefile)
    out = tmp_path / "rec" / "front_door.json"
    r = _front_door("--json", str(out), "--repo", str(repo), "--targets", "test", "--processes")
    assert r.returncode == 0, r.stderr[-2000:]
    test = json.loads(out.read_text())["make_test"]
    procs = test["processes"]
    assert procs["logged"] == 2 and procs["importing_torch"] == 0, procs  # not the `env -i` one, not the killed one
    commands = {row["name"]: row for row in procs["by_command"]}
    assert set(commands) == {"python -c", "python -m json.tool"}, commands
    assert commands["python -c"]["processes"] == 1 and commands["python -c"]["cpu_s"] > 0.1  # the busy loop
    files = {row["name"]: row["processes"] for row in procs["by_test_file"]}
    assert files == {"tests/unit/test_x.py": 1, "(no test)": 1}, files
    assert 0 < procs["logged_cpu_s"] <= test["user_s"] + test["system_s"]
    assert (out.parent / "front_door.test.processes.jsonl").is_file()


def test_a_process_is_named_by_its_module_its_rule_script_or_its_file():
    from mohge_studies.bench.front_door import command_kind

    venv = "/c/.venv/bin"
    assert command_kind([f"{venv}/python", "-m", "mohge.train", "--config", "a.json"]) == "python -m mohge.train"
    assert command_kind(["python", "-m", "mohge", "bench", "step"]) == "python -m mohge bench"
    assert command_kind([f"{venv}/python", f"{venv}/snakemake", "-n"]) == "snakemake"
    script = "/c/.snakemake/scripts/tmpa1b2c3.plot_curves.py"
    assert command_kind([f"{venv}/python", script]) == "snakemake script plot_curves"
    worker = "import sys;exec(eval(sys.stdin.readline()))"  # how pytest-xdist starts a worker
    assert command_kind([f"{venv}/python", "-u", "-c", worker]) == "pytest worker"
    assert command_kind([f"{venv}/python", "-c", "print(1)"]) == "python -c"
    assert command_kind([f"{venv}/python", f"{venv}/lm_eval", "--model", "hf"]) == "lm_eval"
