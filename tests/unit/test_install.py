"""A regular (non-editable) install works as a checkout does: the wheel holds the task definitions as package data,
and `mohge evaluate` run from outside the repository finds them through importlib.resources."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import tiny_run, train_tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_evaluates_with_its_shipped_tasks(tmp_path):
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    quiet = {"check": True, "capture_output": True, "text": True}
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)], **quiet)
    (wheel,) = wheels.glob("mohge-*.whl")

    # a fresh venv that sees the pinned stack of this one (a .pth line appends its site-packages, so this
    # checkout's editable hook is not run) and holds its own copy of mohge from the wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **quiet)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  **quiet).stdout.strip())  # fmt: skip
    (purelib / "pinned_stack.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n" + site.getsitepackages()[0] + "\n"
    )
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)], **quiet)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOHGE_DEBUG")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([python, "-c", "import mohge.core.resources as r; print(r.TASKS)"], cwd=outside, env=env,
                           **quiet).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(purelib) and (Path(where) / "mohge_ppl.yaml").is_file(), where

    model, data = train_tiny(tmp_path / "run", tiny_run())
    done = subprocess.run(
        [venv / "bin" / "mohge", "evaluate", "--ckpt", str(model), "--data", str(data), "--out", "m.json",
         "--tasks", "mohge_ppl", "mohge_graded_hard", "--limit", "8", "--max-loss-batches", "1", "--device", "cpu"],
        cwd=outside, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((outside / "m.json").read_text())
    assert {"mohge_ppl", "mohge_graded_hard"} <= set(metrics["tasks"]), metrics["tasks"]
