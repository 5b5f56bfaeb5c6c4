"""Under --sdm conda, every env a rule names gets the mohge package by installing this checkout (post-deploy)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "workflow" / "envs"


def rule_envs() -> set[str]:
    names = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        names |= set(re.findall(r'conda:\s*\n\s*"\.\./envs/([\w-]+)\.yaml"', smk.read_text()))
    return names


def test_every_rule_env_has_a_post_deploy_script_and_no_rule_sets_pythonpath():
    names = rule_envs()
    assert names == {"train", "plot"}, names
    for name in names:
        script = ENVS / f"{name}.post-deploy.sh"
        assert script.is_file() and os.access(script, os.X_OK), script
        assert "MOHGE_CHECKOUT" in script.read_text()
    for path in [*(ROOT / "workflow" / "rules").glob("*.smk"), ROOT / "Snakefile"]:
        assert "PYTHONPATH" not in path.read_text(), path


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_post_deploy_installs_this_checkout(tmp_path):
    """Run as Snakemake runs it (the env's python first on PATH), the script makes `import mohge` find this checkout."""
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)  # a bare interpreter: no mohge, no torch
    bin_dir = env_dir / "bin"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MOHGE_CHECKOUT": str(ROOT)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(ENVS / "plot.post-deploy.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import mohge; print(mohge.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve() == ROOT / "src" / "mohge" / "__init__.py"
    missing = subprocess.run(
        ["bash", str(ENVS / "plot.post-deploy.sh")], env={**env, "MOHGE_CHECKOUT": ""}, capture_output=True, text=True
    )
    assert missing.returncode != 0 and "MOHGE_CHECKOUT" in missing.stderr
