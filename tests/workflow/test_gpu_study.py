"""The GPU half, prepared on a CPU: the one-GPU study (studies/gpu/config.yaml) and the GPU capacity ladder
(studies/gpu_capacity/config.yaml) plan what a GPU runs, and run end to end made tiny and CPU-only by an overlay
(tests/workflow/gpu_tiny.yaml, gpu_capacity_tiny.yaml: every other key is the GPU config's); the prepared command
kernels/gpu_all.sh finds, in its dry run, every file, module, wheel and target its steps name."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mohge_studies.config.runs import merge_config
from test_study_roots import job_resources, planned
from test_workflow import BIN, ROOT, copy_workflow, smk

HERE = Path(__file__).resolve().parent
GPU = ("--configfile", "studies/gpu/config.yaml")
LADDER = ("--configfile", "studies/gpu_capacity/config.yaml")


def with_overlay(work: Path, name: str) -> Path:
    shutil.copy(HERE / name, work / name)
    return work


def test_the_gpu_study_plans_three_families_on_one_gpu_with_the_load_measured_there(tmp_path):
    out = smk("-n", "-p", "--cores", "16", "--resources", "gpu=3", *GPU, cwd=copy_workflow(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    jobs = planned(text)
    assert jobs["train"] == jobs["evaluate"] == 6 and jobs["utilization"] == 3 and "inference" not in jobs
    assert {r["gpu"] for r in job_resources(text, "train")} == {"1"}  # --gpus 1: CUDA is checked at start
    assert {r["gpu"] for r in job_resources(text, "evaluate")} == {"1"}
    assert "mohge.train --config work/gpu/configs/graded-moe_equal-s1.train.json" in text and "--gpus 1" in text
    utilization = re.findall(r"mohge utilization --trace work/gpu/runs/(\S+)/trace.json.*", text)
    assert sorted(utilization) == ["graded-moe-s0", "graded-moe_equal-s0", "graded-mohge-s0"]
    measured = [line for line in text.splitlines() if "mohge utilization" in line and "--measure" in line]
    assert len(measured) == 1 and "graded-mohge-s0" in measured[0] and "--nproc 4 --one-device" in measured[0]


def test_the_gpu_capacity_ladder_plans_twelve_runs_and_its_declared_analysis(tmp_path):
    args = ("-n", "--cores", "16", "--resources", "gpu=2", "--set-threads", "data_shard=1", *LADDER)
    out = smk(*args, cwd=copy_workflow(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = planned(out.stdout + out.stderr)
    assert jobs["train"] == jobs["evaluate"] == jobs["trace"] == 12 and jobs["data_shard"] == 16
    assert jobs["capacity_analysis"] == 1 and "study_analysis" not in jobs


@pytest.mark.slow
def test_the_gpu_study_runs_end_to_end_made_tiny_on_a_cpu(tmp_path):
    work = with_overlay(copy_workflow(tmp_path), "gpu_tiny.yaml")
    out = smk("--cores", "2", *GPU, "gpu_tiny.yaml", cwd=work, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = pd.read_csv(work / "results" / "gpu_tiny" / "runs.csv")
    assert sorted(runs["family"]) == ["moe", "moe", "moe_equal", "moe_equal", "mohge", "mohge"]
    for table in ("T1_main", "T2_params", "T3_balance"):
        assert (work / "results" / "gpu_tiny" / "tables" / f"{table}.md").is_file()
    for fig in ("F1_curves", "F2_quality_params", "F3_groups_by_level", "F4_gpu_load", "F5_width", "F6_kernels"):
        assert (work / "figures" / "gpu_tiny" / f"{fig}.png").is_file()
    summary = pd.read_csv(work / "results" / "gpu_tiny" / "utilization_summary.csv")
    assert set(summary["kind"]) == {"analytic", "measured"}  # the measured load beside the analytic one


@pytest.mark.slow
def test_the_gpu_capacity_ladder_runs_end_to_end_made_tiny_and_is_gated_by_g1_alone(tmp_path):
    work = with_overlay(copy_workflow(tmp_path), "gpu_capacity_tiny.yaml")
    out = smk("--cores", "2", *LADDER, "gpu_capacity_tiny.yaml", cwd=work, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = work / "results" / "gpu_capacity_tiny" / "study"
    tests = pd.read_csv(study / "C2_tests.csv").set_index("test")
    assert tests.loc["G1 reference > equal", "a"] == "moe" and tests.loc["G1 reference > equal", "b"] == "moe_equal"
    for gate in ("G2 sweep slope", "G3 saturation (quarter set)"):
        assert tests.loc[gate, "verdict"] == "not declared for this study"
    assert tests.loc["Claim 1 non-inferiority", "a"] == "mohge" and tests.loc["Claim 1 non-inferiority", "b"] == "moe"
    models = pd.read_csv(study / "C1_models.csv")
    assert set(models["dataset"]) == {"facts_d128"} and set(models["n"]) == {2}
    # the complete ladder's analysis needs no GPU: its committed runs are sources, never made again
    merged = merge_config(*(yaml.safe_load(f.read_text()) for f in (work / LADDER[1], work / "gpu_capacity_tiny.yaml")))
    (work / "configs" / "gpu_capacity_tiny.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "configs", "results"], ["commit", "-qm", "the ladder's runs"]):
        subprocess.run([*git, *cmd], cwd=work, check=True, capture_output=True)
    shutil.rmtree(work / "work")
    shutil.rmtree(study)
    out = smk("-n", "--cores", "1", "--configfile", "configs/gpu_capacity_tiny.yaml", cwd=work)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = planned(out.stdout + out.stderr)
    assert jobs["capacity_analysis"] == 1 and not {"train", "evaluate", "trace", "data_shard"} & set(jobs), jobs


# ------------------------------------------------------------------------------------- kernels/gpu_all.sh --dry-run


def fake_wheels(folder: Path, drop: str = "") -> Path:
    """Empty files named as the wheels of kernels/gpu_wheels.txt (what the dry run looks for), without ``drop``."""
    folder.mkdir()
    for line in (ROOT / "kernels" / "gpu_wheels.txt").read_text().splitlines():
        pin = line.split("#")[0].strip()
        if pin and not pin.startswith(drop or "\0"):
            name, version = pin.split("==")
            (folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").touch()
    return folder


def dry_run(tmp_path: Path, wheels: Path) -> subprocess.CompletedProcess:
    """kernels/gpu_all.sh --dry-run in a copy of the checkout (its dry run plans both studies with snakemake -n)."""
    (tmp_path / "work").mkdir()
    work = copy_workflow(tmp_path / "work")
    shutil.copytree(ROOT / "kernels", work / "kernels")
    for f in ("tests/kernels/test_triton_gpu.py", "src/mohge/train/distributed/gpu_check.py"):
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, work / f)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable}
    env.update(WHEELS=str(wheels), CORES="4")
    cmd = ["bash", str(work / "kernels" / "gpu_all.sh"), "--dry-run", str(tmp_path / "out")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_the_prepared_gpu_command_dry_run_prints_every_step_and_finds_what_they_name(tmp_path):
    r = dry_run(tmp_path, fake_wheels(tmp_path / "whl"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for step in ("install", "env", "kernels", "bench", "profile", "train_check", "study", "ladder"):
        assert re.search(rf"^\[dry-run\] {step} +\(cap +\d+ s\): \S", r.stdout, re.M), step
    assert "-m snakemake --cores 4" in r.stdout and "--configfile studies/gpu/config.yaml" in r.stdout
    assert "ladder: next runs facts_d128-moe-s10 facts_d128-moe_equal-s10" in r.stdout
    assert "every file, module, wheel and target is here" in r.stdout
    assert not (tmp_path / "work" / "results" / "gpu").exists()  # a dry run makes nothing


def test_the_dry_run_names_a_missing_wheel_and_fails(tmp_path):
    r = dry_run(tmp_path, fake_wheels(tmp_path / "whl", drop="lm-eval"))
    assert r.returncode == 1
    assert "[dry-run] missing: wheel lm-eval==0.4.13" in r.stdout and "kernels/gpu_wheels.sh" in r.stdout
