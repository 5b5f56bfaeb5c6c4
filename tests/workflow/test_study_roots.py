"""The workflow as its users meet it: one results root per study, profiles that ask for what the config says,
reruns limited to what a change touches, the workflow as a Snakemake module, quoting of every shell value, and
the README's commands in a fresh clone of this repository (slow)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_workflow import BIN, ROOT, SMOKE_OUTPUTS, SNAKEMAKE, copy_workflow, smk

CHAIN = ("prepare_data", "train", "evaluate", "trace", "utilization", "collect")


def planned(text: str) -> dict[str, int]:
    """rule -> job count, from the job stats table of a dry run."""
    table = text.split("Job stats:", 1)[1].split("Reasons:", 1)[0] if "Job stats:" in text else ""
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", table, re.M) if m[0] != "total"}


def job_resources(text: str, rule: str) -> list[dict[str, str]]:
    """The resources line of every job of ``rule`` in a dry run's output."""
    blocks = re.findall(rf"^(?:local)?rule {rule}:\n((?:    .*\n)+)", text, re.M)
    out = []
    for block in blocks:
        line = re.search(r"^    resources: (.*)$", block, re.M)
        out.append(dict(kv.split("=", 1) for kv in line[1].split(", ")) if line else {})
    return out


def test_no_default_profile_overrides_an_explicit_one():
    """Snakemake loads profiles/default next to the Snakefile on its own: nothing of the kind may exist."""
    assert not (ROOT / "profiles").exists() and not (ROOT / "default").exists()
    assert not (ROOT / "workflow" / "profiles" / "default").exists()
    slurm = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert "slurm_account" not in str(slurm) and "CHANGE_ME" not in str(slurm)
    # job sizes come from the config's cluster section; the profile sets only when SLURM signals a training job
    assert slurm.get("set-resources", {}) == {"train": {"slurm_extra": "'--signal=TERM@300'"}}


@pytest.fixture(scope="module")
def slurm_dry_run(tmp_path_factory):
    """`snakemake -n --profile workflow/profiles/slurm --configfile CONFIG` in a fresh working copy, once per config
    for the tests of this module that read it."""
    work = copy_workflow(tmp_path_factory.mktemp("slurm_dry"))
    texts: dict[str, str] = {}

    def dry_run(configfile: str) -> str:
        if configfile not in texts:
            out = smk("-n", "--profile", "workflow/profiles/slurm", "--configfile", configfile, cwd=work)
            assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
            texts[configfile] = out.stdout + out.stderr
        return texts[configfile]

    return dry_run


@pytest.mark.parametrize(
    ("configfile", "nodes", "gpus", "max_runtime"),
    [("configs/smoke.yaml", 1, 0, 60), ("configs/config.yaml", 1, 0, 60), ("configs/paper.yaml", 2, 16, 10080)],
)
def test_slurm_profile_asks_for_what_the_config_says(configfile, nodes, gpus, max_runtime, slurm_dry_run):
    text = slurm_dry_run(configfile)
    assert "Using workflow specific profile" not in text
    train = job_resources(text, "train")
    assert train and all(int(r["nodes"]) == nodes for r in train), train[:1]
    assert all(r.get("slurm_extra") == "--signal=TERM@300" for r in train), train[:1]  # SIGTERM 300 s early
    if nodes > 1:  # an MPI-style job (the rule's own srun), GPUs per node as GRES: tests/workflow/test_slurm_plugin.py
        per_node = f"gpu:{gpus // nodes}"
        assert all(r["mpi"] == "srun" and int(r["tasks"]) == nodes and r["gres"] == per_node for r in train), train[:1]
        assert all("gpu" not in r for r in train), train[:1]
    else:
        assert all(int(r["gpu"]) == gpus and "mpi" not in r and "tasks" not in r for r in train), train[:1]
    for rule in ("train", "evaluate", "trace", "utilization", "prepare_data"):
        for res in job_resources(text, rule):
            assert int(res["runtime"]) <= max_runtime, (rule, res)
            assert int(res.get("gpu", 0)) <= (1 if rule != "train" else gpus), (rule, res)
    launch = re.search(r"^.*mohge\.train --config .*$", text, re.M)[0]
    if nodes > 1:
        assert "srun --nodes 2 --ntasks-per-node 1 --kill-on-bad-exit=1 sh -c 'exec torchrun --nnodes 2" in launch
        assert "--nproc-per-node 8 --rdzv-backend c10d" in launch and '--rdzv-id "$SLURM_JOB_ID"' in launch
        assert '"$SLURM_STEP_NODELIST"' in launch  # the jobstep plugin removes SLURM_JOB_NODELIST
    else:
        assert "python -m mohge.train" in launch and "torchrun" not in launch


def test_paper_resources_fit_the_job(slurm_dry_run):
    """The paper config's dry run: training asks for the config's own limits (the same on a retry, which the
    fake-SLURM test checks on a real resubmission); evaluation and tracing for host memory from the model's
    size, fp32 weights and their loaded copy plus the runtime (on a GPU the activations live there); a CPU
    config adds its evaluation batch's activations."""
    from mohge_studies.config.runs import merge_config
    from mohge_studies.config.runs import plan as plan_runs

    from mohge.config.sizes import count_params

    text = slurm_dry_run("configs/paper.yaml")
    paper = merge_config(
        yaml.safe_load((ROOT / "configs/config.yaml").read_text()),
        yaml.safe_load((ROOT / "configs/paper.yaml").read_text()),
    )
    runs = plan_runs(paper)
    for res in job_resources(text, "train"):
        assert int(res["mem_mb"]) == 480 * 1024 and int(res["runtime"]) == 10080, res
    mib = {}
    for rule in ("evaluate", "trace"):
        blocks = re.findall(
            rf"^rule {rule}:\n(?:    .*\n)*?    wildcards: run=(\S+)\n(?:    priority: \d+\n)?    resources: (.*)$",
            text,
            re.M,
        )
        traced = {r for r, c in runs.items() if c.family != "dense"}  # the dense model has no routing to trace
        assert {run for run, _ in blocks} == (set(runs) if rule == "evaluate" else traced), (rule, blocks)
        for run, line in blocks:
            res = dict(kv.split("=", 1) for kv in line.split(", "))
            weights = 2 * 4 * count_params(runs[run].model)["total_sum"] / 2**20  # MiB, SLURM's unit
            assert weights + 2048 <= int(res["mem_mb"]) <= weights + 2049, (rule, run, res["mem_mb"], weights)
            mib[run] = int(res["mem_mb"])
    assert 21_000 < mib["web-mohge-s0"] < 23_000 and mib["web-dense-s0"] < mib["web-mohge-s0"] < mib["web-moe-s0"]
    # a CPU config (smoke, one process): the evaluation batch's fp32 activations come on top of the weights (the
    # rule's own mem_mb, which the profile's default-resources leave as they are)
    smoke = job_resources(slurm_dry_run("configs/smoke.yaml"), "evaluate")
    assert smoke and all(2048 < int(res["mem_mb"]) < 2100 for res in smoke), smoke[:1]


def test_config_mistakes_are_one_line(tmp_path):
    """mohge.runs.plan's refusals (the validator `mohge.runs list` runs; the schema after it) arrive as one line
    naming the key, exit 2, no stack frames."""
    work = copy_workflow(tmp_path)
    smoke = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    cases = {
        "typo": ({**smoke, "stepz": 3}, "stepz: unknown top-level key"),  # mohge.runs.plan's words
        "groups": ({**smoke, "model": {**smoke["model"], "router": {"topk": 2, "group_topk": 9}}}, "group_topk"),
        "study": ({**smoke, "study": "../elsewhere"}, "study='../elsewhere': a name must be"),
        "no_study": ({k: v for k, v in smoke.items() if k != "study"}, "sets no top-level `study:`"),
    }
    for name, (cfg, needle) in cases.items():
        (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        out = smk("-n", "--configfile", f"{name}.yaml", cwd=work)
        errors = [line for line in out.stderr.splitlines() if line.startswith("config error:")]
        assert out.returncode == 2, (name, out.stderr[-2000:])
        assert len(errors) == 1 and needle in errors[0], (name, out.stderr[-2000:])
        assert "Traceback" not in out.stderr and '"$schema"' not in out.stderr and "File " not in out.stderr
    assert not (work / "work").exists()


def test_workflow_is_usable_as_a_module(tmp_path):
    """`use rule * from mohge` in another workflow: paths come from the module's own checkout."""
    (tmp_path / "Snakefile").write_text(
        f'configfile: "{ROOT}/configs/config.yaml"\n'
        f'configfile: "{ROOT}/configs/smoke.yaml"\n\n\n'
        f'module mohge:\n    snakefile:\n        "{ROOT}/Snakefile"\n    config:\n        config\n\n\n'
        "use rule * from mohge\n"
    )
    out = smk("-n", "-p", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    jobs = planned(text)
    assert jobs["train"] == 8 and jobs["params_preset"] == 2, jobs
    assert jobs["fig_kernels"] == 1, jobs  # F6 of the smoke study, from the committed GPU record
    assert "configs/models/mohge-3b.yaml" in text


@pytest.mark.parametrize("name", ["x`touch PWNED`", "../../x"])
def test_hostile_dataset_name_runs_no_command(name, tmp_path):
    """A dataset name reaches the data rule's shell command: quoted, it runs nothing and stays a path.
    (mohge.config may refuse such names outright: then the refusal must name the key, in one line.)"""
    (tmp_path / "a" / "b").mkdir(parents=True)
    work = copy_workflow(tmp_path / "a" / "b")
    smoke = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    cfg = {
        **smoke,
        "datasets": {name: smoke["datasets"]["graded"]},
        "experiments": [{"dataset": name, "families": ["dense"], "seeds": [0]}],
    }
    (work / "hostile.yaml").write_text(yaml.safe_dump(cfg))
    out = smk("--cores", "1", "-p", "--until", "prepare_data", "--configfile", "hostile.yaml", cwd=work)
    text = out.stdout + out.stderr
    found = [p for p in tmp_path.rglob("PWNED")] + [p for p in Path.cwd().glob("PWNED")]
    assert not found, found
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and work not in p.parents]
    assert not outside, outside[:5]
    if out.returncode == 0:
        assert "python -m mohge.data --config" in text, text[-2000:]
        assert len(list((work / "work").rglob("meta.json"))) == 1, text[-2000:]
    else:
        assert "config error:" in out.stderr and "dataset" in out.stderr, text[-3000:]


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


class Clone:
    """A fresh clone of this commit, and the README's commands run in it (jobs import the installed mohge package, as
    they do after `bash setup.sh` in a clone)."""

    def __init__(self, path: Path):
        self.path = path
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(path)], check=True)
        git("checkout", "-q", git("rev-parse", "HEAD", cwd=ROOT).strip(), cwd=path)
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}

    def command(self, *args: str, timeout: int = 1200) -> str:
        out = subprocess.run(list(args), cwd=self.path, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, (args, out.stdout[-3000:] + out.stderr[-3000:])
        return out.stdout + out.stderr

    def snakemake(self, *args: str, timeout: int = 600) -> str:
        return self.command(*SNAKEMAKE, *args, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_clone(tmp_path_factory) -> Clone:
    """One fresh clone and one smoke run for the tests of the `smoke_clone` xdist group (one worker, in file order):
    the smoke and default dry runs of the pristine clone, then the smoke run stopped by Ctrl-C once its first model is
    trained and rerun with the README's --rerun-incomplete, which finishes without retraining that model (about 3 min
    of CPU time, README)."""
    clone = Clone(tmp_path_factory.mktemp("readme") / "mohge")
    assert planned(clone.snakemake("-n", "--configfile", "configs/smoke.yaml"))["train"] == 8
    assert planned(clone.snakemake("-n"))["train"] == 11  # the default study: its models are not committed
    smoke_run_interrupted_then_finished(clone.path, clone.env)
    return clone


@pytest.mark.slow
@pytest.mark.xdist_group("smoke_clone")
def test_reruns_follow_the_section_that_changed(smoke_clone, tmp_path):
    """The smoke study, run: an eval-only change re-evaluates and retraces and trains nothing (its reason a short
    hash), a training change retrains into a fresh scratch folder named by the new hash, a data change prepares the
    data again and retrains."""

    def plan(change: str) -> tuple[dict[str, int], str]:
        (tmp_path / "change.yaml").write_text(change)
        text = smoke_clone.snakemake("-n", "-p", "--configfile", "configs/smoke.yaml", str(tmp_path / "change.yaml"))
        return planned(text), text

    jobs, text = plan("study: smoke\neval: {limit: 5}\n")
    assert jobs.get("evaluate") == 8 and not {"train", "train_config", "prepare_data"} & set(jobs), jobs
    changed = re.findall(r"Params have changed since last execution: .*?before: (.*?) now: (.*?)(?:;|$)", text, re.M)
    assert changed and all(len(b) < 40 and len(n) < 40 for b, n in changed), changed[:3]  # hashes, not JSON
    reasons = re.findall(r"^\s*reason: .*$", text, re.M)
    assert reasons and not [r for r in reasons if '"model"' in r], reasons[:3]  # the config's JSON is in no reason
    jobs, text = plan("study: smoke\ntrain: {lr: 2.0e-3}\n")
    assert jobs.get("train") == 8 and "prepare_data" not in jobs, jobs
    old = {p.name for p in (smoke_clone.path / "work" / "smoke" / "scratch" / "graded-mohge-s0").iterdir()}
    new = re.search(r"--scratch work/smoke/scratch/graded-mohge-s0/(\w+)", text)[1]
    assert new not in old and len(old) == 1
    jobs, _ = plan("study: smoke\ndatasets: {graded: {graded_num_docs: 200}}\n")
    assert jobs.get("prepare_data") == 1 and jobs.get("train") == 8, jobs


@pytest.mark.slow
@pytest.mark.xdist_group("smoke_clone")
def test_a_clone_evaluates_with_the_eval_section_as_edited_not_as_committed(smoke_clone):
    """configs/config.yaml's eval section edited in a clone before its first run: every run of the default study it
    trains has its committed config.json written again first, with the edited section, and evaluated from that file
    (the clone's committed config.json files hold the section as committed)."""
    config = smoke_clone.path / "configs" / "config.yaml"
    text = config.read_text()
    assert "\n  limit: 50\n" in text
    config.write_text(text.replace("\n  limit: 50\n", "\n  limit: 7\n"))
    try:
        plan = smoke_clone.snakemake("-n", "-p")
    finally:
        git("checkout", "-q", "configs/config.yaml", cwd=smoke_clone.path)
    jobs = planned(plan)
    assert jobs["train"] == jobs["run_config"] == jobs["evaluate"] == 11, jobs
    written = re.findall(r"^rule run_config:\n(?:    .*\n)*?    output: (\S+)\n", plan, re.M)
    evaluated = re.findall(r"--eval-config (\S+)", plan)
    assert len(set(written)) == 11 and set(evaluated) == set(written), (written, evaluated)
    texts = {path: json.loads(t) for t, path in re.findall(r"printf '%s' '(\{\n.*?\n\})\n' > (\S+)", plan, re.S)}
    assert {texts[path]["eval"]["limit"] for path in written} == {7}
    committed = json.loads((smoke_clone.path / written[0]).read_text())
    assert committed["eval"]["limit"] == 50


@pytest.mark.slow
@pytest.mark.xdist_group("smoke_clone")
def test_readme_commands_in_a_fresh_clone(smoke_clone, tmp_path):
    """The smoke run of a fresh clone (the shared `smoke_clone`, stopped by Ctrl-C and finished with
    --rerun-incomplete): its tables and figures, nothing left to do; after `mohge mtimes`, nothing to do for the
    figures target, then every job of it rerun (study_analysis: its scipy warnings go to the job's log, not the
    console; the claims study run
    afterwards plans no study_analysis for its params, the merged config compared as data, not in the order the two
    ways of merging give); the README's lm-eval commands (build-tasks into ./mohge_tasks, the export into ./hf/<run>)
    and `snakemake --report report.html`, which holds the figures and the T tables. Afterwards `git status` shows no
    committed file changed or deleted and nothing unignored: every committed table and figure, drawn again, is
    byte-identical."""
    clone, run, command = smoke_clone.path, smoke_clone.snakemake, smoke_clone.command
    for rel in SMOKE_OUTPUTS:
        assert (clone / rel).stat().st_size > 0, rel
    assert "Nothing to be done" in run("-n", "--configfile", "configs/smoke.yaml")
    runs = (clone / "results" / "smoke" / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 8  # header + 2 mohge + 2 moe + hmoe + modse + dense + the mohge variant
    assert any(line.split(",")[2] == "mohge+renorm" for line in runs[1:])

    command("python", "-m", "mohge", "mtimes")  # committed files dated by their commits (a clone dates them all now)
    assert "Nothing to be done" in run("-n", "figures")  # every committed table and figure is up to date
    every = planned(run("-n", "figures", "--forceall"))  # the plan: every committed study's, from its CSVs alone
    assert every["tables"] >= 2 and every["fig_gpu_load"] >= 2 and not set(CHAIN) & set(every), every
    assert every.get("study_analysis") == 1, every
    # every committed table and figure drawn again with today's code, from the committed CSVs: the git status at the
    # end finds each byte as committed (what lets `mohge mtimes` date them after the code that draws them)
    t0 = time.perf_counter()
    text = run("--cores", "2", "figures", "--forceall", timeout=2400)
    seconds = time.perf_counter() - t0
    jobs = planned(text)
    assert jobs == every, (jobs, every)
    print(f"figures target: {seconds:.1f} s for {sum(jobs.values())} jobs")  # its speed is the machine's load
    assert "Warning" not in text, text[-3000:]
    assert (clone / "logs" / "claims" / "study_analysis.log").is_file()
    # the claims study's own config: study_analysis is not rerun for its params (the merged config compared as data)
    dry = run("-n", "--configfile", "studies/claims/config.yaml")
    block = dry[dry.index("rule study_analysis:") :].split("\n\n", 1)[0] if "rule study_analysis:" in dry else ""
    assert "Params have changed" not in block, block

    # the README's lm-eval paths, on a model of the smoke run: the task files and the Hugging Face export land
    # where git ignores them
    model, data = clone / "work" / "smoke" / "runs" / "graded-mohge-s0", clone / "work" / "smoke" / "data" / "graded"
    command(
        "python",
        "-m",
        "mohge.evaluate",
        "build-tasks",
        "--data",
        str(data),
        "--ckpt",
        str(model),
        "--out",
        "mohge_tasks",
    )
    command("python", "-m", "mohge", "export", "--ckpt", str(model), "--out", "hf/graded-mohge-s0")
    assert (clone / "mohge_tasks" / "tasks.json").is_file()
    assert (clone / "hf" / "graded-mohge-s0" / "model.safetensors").is_file()
    run("--report", "report.html", timeout=1200)
    report = (clone / "report.html").read_text(errors="replace")
    for name in ("F4_gpu_load.png", "T1_main.html", "T2_params.html", "T3_balance.html"):  # tables shown inline
        assert name in report, name
    status = git("status", "--porcelain", "--untracked-files=all", cwd=clone)
    assert status == "", status  # nothing committed changed, and every output above is ignored


TRAIN_JOB = r"rule train:\n(?:    .*\n)*?    jobid: (\d+)\n(?:    .*\n)*?    wildcards: run=([\w-]+)"
HEARD = "Terminating processes on user request"  # what Snakemake logs when a SIGINT stops its scheduler


def trained_models(clone: Path, log: str) -> list[Path]:
    """The model of every train job that a Snakemake log reports finished (outputs complete), in that order."""
    runs_of = dict(re.findall(TRAIN_JOB, log))
    done = [runs_of[j] for j in re.findall(r"Finished jobid: (\d+) \(Rule: train\)", log) if j in runs_of]
    return [clone / "work" / "smoke" / "runs" / run / "model.safetensors" for run in done]


def press_ctrl_c(proc: subprocess.Popen, log: Path, presses: int = 5, patience: float = 10.0) -> int:
    """SIGINT to Snakemake's process group, as Ctrl-C sends it, and again while Snakemake goes on as if it had heard
    nothing: it can swallow a SIGINT that lands while it releases a finished job (`Exception ignored in: ...
    KeyboardInterrupt`) and carry on. Gone on means: neither exited nor logged that it heard within ``patience``
    seconds, or started or finished a job since. Returns how many were sent (0: it had exited already)."""
    sent = 0
    while proc.poll() is None and sent < presses:
        mark = len(log.read_text())
        os.killpg(proc.pid, signal.SIGINT)
        sent += 1
        deadline = time.monotonic() + patience
        while proc.poll() is None and time.monotonic() < deadline:
            after = log.read_text()[mark:]
            if HEARD in after:
                return sent
            if re.search(r"^(?:Finished jobid: |Execute \d+ jobs)", after, re.M):
                break
            time.sleep(0.2)
    return sent


def smoke_run_interrupted_then_finished(clone: Path, env: dict) -> None:
    """`snakemake --cores 2 --configfile configs/smoke.yaml`, stopped with Ctrl-C once the first train job is reported
    finished, then rerun as README reruns a stopped run, `make run` (here on the smoke config, from a shell whose PATH
    does not hold the environment: the jobs' `python -m mohge` must find it through make): it finishes without
    retraining a model that had finished. Where every SIGINT landed where Snakemake swallows it and the run completed,
    the rerun is the same promise on a complete DAG: nothing to do."""
    cmd = [*SNAKEMAKE, "--cores", "2", "--configfile", "configs/smoke.yaml"]
    log = clone.parent / "first_attempt.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            cwd=clone,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as from a terminal: a suite started in the background (`cmd &` in a script) inherits SIGINT ignored,
            # and Snakemake would run on through the Ctrl-C
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 1200  # a guard against a hang, not a timing: a model trains in about a minute
        while time.monotonic() < deadline and proc.poll() is None and not trained_models(clone, log.read_text()):
            time.sleep(0.5)
        assert trained_models(clone, log.read_text()), "no model trained\n" + log.read_text()[-3000:]
        presses = press_ctrl_c(proc, log)
        # the running jobs finish their step and checkpoint before Snakemake exits: seconds on an idle machine, over a
        # minute when other work shares the cores
        proc.wait(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    print(f"Ctrl-C pressed {presses} time(s); Snakemake exited {proc.returncode}")
    finished = {path: path.stat().st_mtime_ns for path in trained_models(clone, text)}
    if proc.returncode == 0:  # it completed the DAG before a SIGINT stopped it
        assert "steps (100%) done" in text, text[-3000:]
    else:  # stopped by the Ctrl-C, not by a failure of its own
        assert presses > 0, text[-3000:]
    # a job caught mid-flight by the interrupt leaves its output marked incomplete; `make run` passes
    # --rerun-incomplete (Snakemake otherwise refuses and names the file)
    make_run = ["make", "run", f"VENV={BIN.parent}", "STAMP=", "SNAKEMAKE_ARGS=" + " ".join(cmd[1:])]
    bare = {**env, "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != BIN)}
    out = subprocess.run(make_run, cwd=clone, env=bare, capture_output=True, text=True, timeout=2400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    retrained = [str(path) for path, stamp in finished.items() if path.stat().st_mtime_ns != stamp]
    assert not retrained, f"finished models retrained: {retrained}"
    if proc.returncode == 0:
        assert "Nothing to be done" in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]


CHEAP = {"study_analysis", "tables", "study_tables_tex", "all"}  # plus fig_*: tables and figures from the CSVs


def committed_part(study_yaml: Path, results: Path) -> tuple[dict, list[str], list[str]]:
    """studies/claims/config.yaml without the runs declared but not yet run (no committed summary), the committed runs
    and the declared runs. An experiment whose runs are partly in (a study growing over sittings) is kept as one
    experiment per committed run (its variant and seed)."""
    from mohge_studies.config.runs import merge_config, plan

    from mohge.config import load_yaml_or_json

    base = load_yaml_or_json(ROOT / "configs" / "config.yaml")
    study = yaml.safe_load(study_yaml.read_text())

    def names_of(exp: dict) -> list[str]:
        return list(plan(merge_config(base, {**study, "experiments": [exp]}), preflight=False))

    ran, done, declared = [], [], []
    for exp in study["experiments"]:
        names = names_of(exp)
        have = [n for n in names if (results / "runs" / n / "summary.json").is_file()]
        declared.extend(n for n in names if n not in have)
        done.extend(have)
        if len(have) == len(names):
            ran.append(exp)
            continue
        for variant, spec in (exp.get("variants") or {"": {}}).items():
            for seed in exp["seeds"]:
                one = {**exp, "seeds": [seed], **({"variants": {variant: spec}} if variant else {})}
                if all(n in have for n in names_of(one)):
                    ran.append(one)
    return {**study, "experiments": ran}, done, declared


def test_a_committed_study_is_up_to_date_in_a_fresh_clone_after_mtimes(tmp_path):
    """A clone of the claims study plans only what is not committed: the arms declared in studies/claims/config.yaml and
    not yet run (and their data), never a committed run, whose per-run results are sources
    (mohge_studies.workflow.plan.WorkflowPlan.committed), before and after `mohge mtimes`; with every arm run, tables
    and figures at most. MOHGE_RERUN_COMMITTED=1 plans every run again."""
    clone = tmp_path / "mohge"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    git("checkout", "-q", git("rev-parse", "HEAD", cwd=ROOT).strip(), cwd=clone)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MOHGE_RERUN_COMMITTED", None)
    committed, done, declared = committed_part(
        clone / "studies" / "claims" / "config.yaml", clone / "results" / "claims"
    )
    # the 48 runs of the study as first run, and the arms declared after the results (62 runs) as they finish
    assert len(done) >= 48 and len(done) + len(declared) == 110, (len(done), len(declared))
    (tmp_path / "committed.yaml").write_text(yaml.safe_dump(committed))

    def plan(configfile: str, *targets: str, **extra: str) -> tuple[dict[str, int], str]:
        out = subprocess.run(
            [*SNAKEMAKE, "-n", *targets, "--configfile", configfile],
            cwd=clone,
            env={**env, **extra},
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return planned(out.stdout + out.stderr), out.stdout + out.stderr

    def runs_of_jobs(text: str) -> set[str]:
        return set(re.findall(r"^    wildcards: run=([\w.-]+)", text, re.M))

    jobs, text = plan("studies/claims/config.yaml")  # a bare clone: the committed runs are sources all the same
    assert jobs.get("train", 0) == len(declared) and not runs_of_jobs(text) & set(done), jobs
    assert f"{len(done)} of {len(done) + len(declared)} runs are committed" in text
    done_mtimes = subprocess.run(
        ["python", "-m", "mohge", "mtimes"], cwd=clone, env=env, capture_output=True, text=True
    )
    assert done_mtimes.returncode == 0 and "set the commit time of" in done_mtimes.stdout, done_mtimes.stderr
    jobs, text = plan("studies/claims/config.yaml")
    assert runs_of_jobs(text) == set(declared), sorted(runs_of_jobs(text) ^ set(declared))[:5]
    assert jobs.get("train", 0) == len(declared), jobs
    if not declared:
        assert set(jobs) <= CHEAP | {j for j in jobs if j.startswith("fig_")}, jobs
    # a reproduction: every run made again
    # (with --forcerun train: after mtimes every committed result is up to date, so only a forced rule remakes it)
    reproduce = plan("studies/claims/config.yaml", "--forcerun", "train", MOHGE_RERUN_COMMITTED="1")[0]
    assert reproduce["train"] == len(done) + len(declared), reproduce
    # the committed experiments alone are another config of the committed study: refused before any job;
    # with every declared arm committed they are the study itself, so a study without its last experiment stands in
    if not declared:
        cut = yaml.safe_load((clone / "studies" / "claims" / "config.yaml").read_text())
        cut["experiments"] = cut["experiments"][:-1]
        (tmp_path / "committed.yaml").write_text(yaml.safe_dump(cut))
    other = subprocess.run(
        [*SNAKEMAKE, "-n", "--configfile", str(tmp_path / "committed.yaml")],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and "name another study" in other.stderr, other.stderr[-2000:]
    # the declared arms, asked for by name: exactly their trainings (and their data), no committed run
    if declared:
        targets = [f"results/claims/runs/{run}/summary.json" for run in declared]
        assert plan("studies/claims/config.yaml", *targets)[0].get("train") == len(declared)
    assert git("status", "--porcelain", cwd=clone).strip() == ""


def test_the_capacity_study_in_a_fresh_clone_plans_only_its_runs_not_committed(tmp_path):
    """The capacity study grows over sittings. In a clone, after `mohge mtimes`, the plan
    trains exactly the runs whose results are not committed; once every run is, tables and figures at most."""
    clone = tmp_path / "mohge"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    git("checkout", "-q", git("rev-parse", "HEAD", cwd=ROOT).strip(), cwd=clone)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MOHGE_RERUN_COMMITTED", None)
    subprocess.run(["python", "-m", "mohge", "mtimes"], cwd=clone, env=env, check=True, capture_output=True)
    runs = plan_runs(clone / "studies" / "capacity" / "config.yaml")
    tracked = set(git("ls-files", "results/capacity/runs", cwd=clone).split())
    pending = {r for r in runs if f"results/capacity/runs/{r}/summary.json" not in tracked}
    out = subprocess.run(
        [*SNAKEMAKE, "-n", "--configfile", "studies/capacity/config.yaml"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    jobs = planned(text)
    blocks = re.findall(r"^(?:local)?rule train:\n((?:    .*\n)+)", text, re.M)
    assert {re.search(r"wildcards: run=(\S+)", b)[1] for b in blocks} == pending
    if not pending:
        # collect too: a restamp (mohge provenance restamp) commits run summaries after the CSVs collected
        # from them, whose bytes it does not change; collect then rewrites them as they are, in seconds
        assert set(jobs) <= CHEAP | {"capacity_analysis", "collect"} | {j for j in jobs if j.startswith("fig_")}, jobs
    assert git("status", "--porcelain", cwd=clone).strip() == ""


def test_committed_runs_are_sources_until_their_config_changes(tmp_path, monkeypatch):
    """In a study with an `analysis` section, a run whose per-run results git tracks, with today's resolved config,
    is not made again: a key added to the config since (at its default) keeps it; any other change of its config,
    a missing committed file or MOHGE_RERUN_COMMITTED=1 plans it again. A study without `analysis` is untouched."""
    monkeypatch.delenv("MOHGE_RERUN_COMMITTED", raising=False)
    work = copy_workflow(tmp_path)
    git("init", "-q", cwd=work)
    cap = ("--configfile", "studies/capacity/config.yaml")
    kept = ["facts-moe-s0", "facts-mohge-s0"]
    made = smk(*(f"results/capacity/runs/{r}/config.json" for r in kept), "--cores", "1", *cap, cwd=work)
    assert made.returncode == 0, made.stderr[-2000:]
    for run in kept:
        for rel in (
            *(f"runs/{run}/{n}" for n in ("summary.json", "train_log.jsonl", "metrics.json", "params.json")),
            f"runs/{run}/trace.json",
            f"utilization/{run}/summary.csv",
            f"utilization/{run}/analytic.csv",
        ):
            (work / "results" / "capacity" / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / "results" / "capacity" / rel).write_text("{}\n")

    def commit() -> None:
        git("add", "-A", cwd=work)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "runs", cwd=work)

    def trained() -> set[str]:
        out = smk("-n", *cap, cwd=work)
        assert out.returncode == 0, out.stderr[-2000:]
        text = out.stdout + out.stderr
        blocks = re.findall(r"^(?:local)?rule train:\n((?:    .*\n)+)", text, re.M)
        return {re.search(r"wildcards: run=(\S+)", b)[1] for b in blocks}

    commit()
    everything = set(plan_runs(work / "studies" / "capacity" / "config.yaml"))
    assert trained() == everything - set(kept)
    # a key the code added since the run was recorded, at its default: still the same run
    path = work / "results" / "capacity" / "runs" / "facts-mohge-s0" / "config.json"
    recorded = json.loads(path.read_text())
    from mohge.config.sections import TrainConfig

    assert recorded["train"]["device"] == TrainConfig().device  # "auto", the default
    del recorded["train"]["device"]
    path.write_text(json.dumps(recorded, sort_keys=True, indent=2) + "\n")
    commit()
    assert trained() == everything - set(kept)
    # its config changed: made again
    recorded["train"]["lr"] *= 2
    path.write_text(json.dumps(recorded, sort_keys=True, indent=2) + "\n")
    commit()
    assert trained() == everything - {"facts-moe-s0"}
    monkeypatch.setenv("MOHGE_RERUN_COMMITTED", "1")  # a reproduction
    assert trained() == everything
    monkeypatch.delenv("MOHGE_RERUN_COMMITTED")
    # a committed file gone: made again
    git("rm", "-q", "results/capacity/runs/facts-moe-s0/trace.json", cwd=work)
    commit()
    assert trained() == everything


def plan_runs(configfile: Path) -> list[str]:
    from mohge_studies.config.runs import merge_config, plan

    from mohge.config import load_yaml_or_json

    base = load_yaml_or_json(ROOT / "configs" / "config.yaml")
    return list(plan(merge_config(base, load_yaml_or_json(configfile)), preflight=False))
