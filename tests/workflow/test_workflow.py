"""The Snakemake workflow: lint, format, dry runs of every config, refusal of bad configs (the smoke config end to
end with an interruption runs in test_study_roots.test_readme_commands_in_a_fresh_clone)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SNAKEMAKE = [str(BIN / "snakemake")]


def smk(*args: str, cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    """Snakemake with this environment's python first on PATH, as its jobs need."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def copy_workflow(dst: Path) -> Path:
    """A fresh working copy: Snakefile, workflow, configs, the studies' folders (their configs, rules, scripts and
    captions) and the committed benchmark CSV, no results."""
    for name in ("Snakefile", "workflow", "configs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    shutil.copytree(ROOT / "studies", dst / "studies", ignore=shutil.ignore_patterns("__pycache__", "tests"))
    (dst / "results" / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "results" / "bench" / "kernels.csv", dst / "results" / "bench" / "kernels.csv")
    return dst


def test_schema_file_is_generated_from_the_dataclasses():
    import json

    from mohge_studies.config.runs import workflow_schema

    committed = json.loads((ROOT / "workflow" / "schemas" / "config.schema.json").read_text())
    assert committed == workflow_schema(), "regenerate: mohge runs schema > workflow/schemas/config.schema.json"


def test_snakefmt_clean():
    out = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules", *map(str, ROOT.glob("studies/*/rules.smk"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_lint_clean():
    out = smk("--lint")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    "configfile", ["configs/config.yaml", "configs/smoke.yaml", "configs/paper.yaml", "studies/capacity/config.yaml"]
)
def test_dry_run(configfile, tmp_path):
    work = copy_workflow(tmp_path)
    out = smk("-n", "--cores", "4", "--configfile", configfile, cwd=work)  # cores: threads shown uncapped
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    for rule in ("prepare_data", "train", "evaluate", "trace", "utilization", "collect", "tables", "fig_gpu_load"):
        assert rule in text
    # the default's inference section is inherited; the capacity study and paper.yaml opt out
    asks = (yaml.safe_load((ROOT / configfile).read_text()).get("inference") or {}).get("enabled", True)
    assert ("rule inference:" in text and "rule fig_inference:" in text) == asks, configfile
    runs = yaml.safe_load((ROOT / configfile).read_text())["experiments"]
    assert runs
    if configfile == "studies/capacity/config.yaml":  # the declared capacity analysis, not the claims study's tables
        assert "capacity_analysis" in text and "study_analysis" not in text
    # the utilization job asks for the ranks it measures (utilization.measure_nproc, MoHGE runs only), else one
    # thread, so an analytic placement runs beside a training; evaluate and trace run before the next training
    cfg = yaml.safe_load((ROOT / configfile).read_text())
    nproc = int((cfg.get("utilization") or {}).get("measure_nproc", 0))
    blocks = re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", text, re.M)
    util = {re.search(r"wildcards: run=(\S+)", b)[1]: b for r, b in blocks if r == "utilization"}
    assert util
    for run, block in util.items():
        threads = int(m[1]) if (m := re.search(r"^    threads: (\d+)", block, re.M)) else 1
        assert threads == (min(nproc, 4) if nproc and "-mohge-" in run else 1), (run, block)
    for rule, block in blocks:
        assert ("priority: 1" in block) == (rule in ("evaluate", "trace", "utilization")), (rule, block)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"train": {"stepz": 3}}, "stepz"),
        ({"model": {"ffn": {"num_experts": 30}}}, "num_experts"),
        ({"model": {"router": {"group_topk": 9}}}, "group_topk"),
    ],
)
def test_bad_config_refused_before_any_job(change, needle, tmp_path):
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    for section, values in change.items():
        target = cfg.setdefault(section, {})
        for k, v in values.items():
            if isinstance(v, dict):
                target.setdefault(k, {}).update(v)
            else:
                target[k] = v
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    out = smk("--cores", "1", "--configfile", "bad.yaml", cwd=work)
    assert out.returncode != 0
    assert needle in out.stdout + out.stderr
    assert not (work / "work").exists() and not (work / "results" / "smoke").exists()


# What the smoke run makes (checked by test_study_roots.test_readme_commands_in_a_fresh_clone, which runs it once,
# interrupted and resumed). F6 only where results/bench/kernels.csv holds a GPU measurement (one is committed).
SMOKE_OUTPUTS = [
    *(
        f"results/smoke/tables/{t}.{e}"
        for t in ("T1_main", "T2_params", "T3_balance")
        for e in ("csv", "md", "tex", "html")
    ),
    *(
        f"figures/smoke/{f}.{e}"
        for f in (
            "F1_curves",
            "F2_quality_params",
            "F3_groups_by_level",
            "F4_gpu_load",
            "F5_width",
            "F6_kernels",
            "F14_load",
            "F15_idle",
        )
        for e in ("png", "pdf")
    ),
    *(f"results/smoke/tables/T4_inference.{e}" for e in ("csv", "md")),
    *(f"figures/smoke/F13_inference.{e}" for e in ("png", "pdf")),
]


def test_each_config_writes_under_its_own_study(tmp_path):
    """The ablations plan lands in results/ablations/ and work/ablations/, never in another study's folders."""
    out = smk("-n", "-p", "--configfile", "studies/ablations/config.yaml", cwd=copy_workflow(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "shakespeare-mohge-renorm-s1" in text and "params_preset" in text
    paths = set(re.findall(r"(?<![\w/.-])(?:results|figures|work|logs)/[\w./-]+", text)) - {"results/bench/kernels.csv"}
    assert paths and all(p.split("/")[1] == "ablations" for p in paths), sorted(paths)[:10]
