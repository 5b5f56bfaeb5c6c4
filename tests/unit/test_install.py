"""A regular (non-editable) install: the bare library needs torch alone (the layer builds and trains beside torch and
what torch requires, nothing else), and the wheel with the artifact's stack works as a checkout does (it holds the
task definitions as package data, and `mohge evaluate` run from outside the repository finds them through
importlib.resources)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import tiny_run, train_tiny
from packaging.requirements import Requirement
from test_api import API_DOC, TRAINING, python_blocks

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]
QUIET = {"check": True, "capture_output": True, "text": True}
# what the extras bring: none of it may be importable beside the bare library
NOT_CORE = ("numpy", "triton", "yaml", "tqdm", "tokenizers", "safetensors", "pandas", "scipy", "matplotlib",
            "jsonschema", "snakemake", "lm_eval", "transformers", "datasets", "accelerate")  # fmt: skip


def build_wheel(tmp_path: Path) -> Path:
    """This checkout's wheel, built offline by this venv's setuptools from a copy of what the wheel holds (so the
    build leaves nothing in the checkout); the build backend warns of nothing (a directory of modules left out of
    pyproject's packages, as mohge/tasks once was, is a BuildBackendWarning)."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("src", "kernels", "studies"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(wheels),
                            str(source)], **QUIET)  # fmt: skip
    assert "BuildBackendWarning" not in built.stdout + built.stderr, built.stderr[-3000:]
    (wheel,) = wheels.glob("mohge-*.whl")
    return wheel


def fresh_venv(path: Path, *site_dirs: Path) -> tuple[Path, Path]:
    """A venv without pip whose site-packages also reads ``site_dirs`` (a .pth line each); (python, purelib)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], **QUIET)
    python = path / "bin" / "python"
    get_purelib = [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    purelib = Path(subprocess.run(get_purelib, **QUIET).stdout.strip())
    (purelib / "beside.pth").write_text("".join(f"{d}\n" for d in site_dirs))
    return python, purelib


def distributions_of(name: str) -> list[md.Distribution]:
    """The installed distribution ``name`` and every one it requires, transitively (extras left out)."""
    found: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in found:
            continue
        found[key] = dist = md.distribution(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def torch_alone(folder: Path) -> Path:
    """A folder holding links to torch and the distributions it requires, and nothing else of this venv."""
    folder.mkdir()
    for dist in distributions_of("torch"):
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if not (folder / top).exists():
                (folder / top).symlink_to(dist.locate_file(top))
    return folder


BARE_SCRIPT = """
import importlib.metadata as md, importlib.util, json, sys
import torch
import mohge
from mohge import MoHGELayer

missing = [name for name in sys.argv[2].split(",") if importlib.util.find_spec(name) is None]
layer = MoHGELayer(32)
x, target = torch.randn(4, 8, 32), torch.randn(4, 8, 32)
opt = torch.optim.AdamW(layer.parameters(), lr=1e-2)
fits, auxes = [], []
for _ in range(10):
    y, aux = layer(x)
    fit = (y - target).pow(2).mean()
    opt.zero_grad()
    (fit + aux).backward()
    opt.step()
    fits.append(fit.item())
    auxes.append(aux.item())
router = layer.router
grads = [router.group_router.weight.grad is not None, router.expert_router.weight.grad is not None]
ns = {}
exec(compile(open(sys.argv[1]).read(), "docs/api.md", "exec"), ns)
imported = sorted({m.partition(".")[0] for m in sys.modules} & set(sys.argv[2].split(",")))
print(json.dumps({"mohge": mohge.__file__, "missing": missing, "imported": imported, "fits": fits, "auxes": auxes,
                  "grads": grads, "doc_losses": ns["losses"], "requires": md.requires("mohge")}))
"""


def test_the_bare_library_installs_beside_torch_alone_and_its_layer_trains(tmp_path):
    """A wheel of mohge installed into a fresh venv that sees only torch and what torch requires (pip check finds
    the requirements met): pandas, scipy, matplotlib, numpy, the workflow and evaluation stacks cannot be imported
    there; MoHGELayer builds and trains with its aux loss, and docs/api.md's training loop runs as written. The
    installed metadata asks for torch with a lower bound and pins nothing (the exact stack is constraints.txt's)."""
    wheel = build_wheel(tmp_path)
    python, purelib = fresh_venv(tmp_path / "venv", torch_alone(tmp_path / "torch_alone"))
    subprocess.run([*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)], **QUIET)
    check = subprocess.run([*PIP, "--python", str(python), "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # torch>=2.11 (and torch's own needs) met by that alone

    (tmp_path / "script.py").write_text(BARE_SCRIPT)
    (tmp_path / "doc_loop.py").write_text(python_blocks(API_DOC)[TRAINING])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOHGE_DEBUG")}
    done = subprocess.run([python, "script.py", "doc_loop.py", ",".join(NOT_CORE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert Path(out["mohge"]).is_relative_to(purelib), out["mohge"]  # the wheel's copy, not this checkout
    assert out["missing"] == list(NOT_CORE) and out["imported"] == []
    assert out["fits"][-1] < out["fits"][0] and all(a > 0 for a in out["auxes"]) and all(out["grads"]), out
    assert out["doc_losses"][-1] < out["doc_losses"][0] / 10, out["doc_losses"]
    # a study command needs the extras: one line that says which, status 2 (not a traceback)
    study = subprocess.run([python, "-m", "mohge", "collect", "--help"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert study.returncode == 2 and len(study.stderr.splitlines()) == 1, study.stderr[-2000:]
    assert "which is not installed here" in study.stderr and "mohge[all]" in study.stderr

    requires = [Requirement(line) for line in out["requires"]]
    assert not [str(r) for r in requires if any(s.operator in ("==", "===") for s in r.specifier)]
    core = [r for r in requires if r.marker is None]
    assert [r.name for r in core] == ["torch"], core
    assert {s.operator for s in core[0].specifier} == {">="} and "2.11" in core[0].specifier, core[0]


@pytest.mark.slow
def test_a_wheel_installed_outside_the_checkout_evaluates_with_its_shipped_tasks(tmp_path):
    wheel = build_wheel(tmp_path)

    # a fresh venv that sees the pinned stack of this one (a .pth line appends its site-packages, so this
    # checkout's editable hook is not run) and holds its own copy of mohge from the wheel
    venv = tmp_path / "venv"
    python, purelib = fresh_venv(venv, Path(sysconfig.get_paths()["purelib"]), Path(site.getsitepackages()[0]))
    subprocess.run([*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)], **QUIET)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOHGE_DEBUG")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([python, "-c", "import mohge.core.resources as r; print(r.TASKS)"], cwd=outside, env=env,
                           **QUIET).stdout.strip()  # fmt: skip
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
