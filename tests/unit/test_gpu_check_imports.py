"""The GPU checks start on a bare GPU box: mohge.kernels and the training check import nothing beyond torch,
triton and numpy (everything else blocked by tests/unit/import_blocker.py in a subprocess, as if not installed),
and the shell scripts parse and run their install-and-log steps (here, with no GPU, up to the CUDA refusal)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).with_name("import_blocker.py")
SCRIPTS = ["gpu_env.sh", "gpu_check.sh", "gpu_train_check.sh", "gpu_all.sh", "gpu_wheels.sh"]


def blocked(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(BLOCKER), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=240)


def test_the_blocker_blocks_what_is_installed_but_not_allowed():
    import yaml  # noqa: F401  (installed here: the blocker must hide it)

    r = blocked("-c", "import yaml")
    assert r.returncode == 1 and "ModuleNotFoundError: No module named 'yaml'" in r.stderr, r.stderr[-2000:]


def test_kernels_import_with_only_torch_triton_numpy(tmp_path):
    code = (
        "import sys, mohge.kernels, mohge.kernels.bench, mohge.kernels.gpu_profile, mohge.kernels.swiglu\n"
        "import mohge.kernels.device_record, mohge.kernels.capture\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('mohge'))))"
    )
    r = blocked("--report", str(tmp_path / "blocked.txt"), "-c", code)
    assert r.returncode == 0, r.stderr[-3000:]
    mods = set(r.stdout.split())
    assert {m for m in mods if not m.startswith("mohge.kernels")} == {"mohge", "mohge.core", "mohge.core.vocab"}, mods
    for name in ("yaml", "tokenizers", "safetensors", "pandas"):  # nothing of ours even tried them
        assert name not in (tmp_path / "blocked.txt").read_text().split()


def test_training_check_runs_on_cpu_with_only_torch_triton_numpy(tmp_path):
    args = ["--device", "cpu", "--out", str(tmp_path), "--steps", "3", "--warmup", "1", "--batch", "2"]
    r = blocked("-m", "mohge.train.distributed.gpu_check", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "train_check.json").is_file() and "parity ok" in r.stdout


def test_gpu_scripts_parse_and_stop_at_the_missing_gpu(tmp_path):
    for name in SCRIPTS:
        subprocess.run(["bash", "-n", str(ROOT / "kernels" / name)], check=True)
    # an interpreter that sees only torch/triton/numpy: the script's checks and env.log pass, the CUDA check stops it
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {BLOCKER} "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(python), "PATH": os.environ["PATH"]}
    r = subprocess.run(
        ["bash", str(ROOT / "kernels" / "gpu_train_check.sh"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "torch " in (out / "env.log").read_text()
    assert "gpu_check: no CUDA device" in (out / "train_check.log").read_text()
    # without pytest (blocked) and no WHEELS, the kernel check names what is missing, in one line
    env_no_wheels = {k: v for k, v in env.items() if k != "WHEELS"}
    r = subprocess.run(
        ["bash", str(ROOT / "kernels" / "gpu_check.sh"), str(out)],
        capture_output=True,
        text=True,
        env=env_no_wheels,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "gpu_check: missing pytest; set WHEELS=DIR" in r.stderr, r.stderr[-2000:]


def test_the_device_record_holds_the_gpus_clocks_driver_and_versions_before_and_after(tmp_path):
    """kernels/device_record.py (stdlib only, run before the install) reads nvidia-smi's query, one mapping per GPU,
    and appends a snapshot per call; without nvidia-smi it says why and records the versions alone."""
    smi = tmp_path / "nvidia-smi"
    row = "NVIDIA H100 80GB HBM3, 00000000:18:00.0, 580.159.04, 81559, 0, 1980, 2619, 1980, 2619, 71.2, 700.00"
    smi.write_text(f"#!/bin/sh\necho '{row}, 33, P0, Default, Enabled'\n")
    smi.chmod(0o755)
    out = tmp_path / "env.json"
    for label in ("start", "end"):
        cmd = [sys.executable, str(ROOT / "kernels" / "device_record.py"), "--out", str(out), "--label", label]
        subprocess.run([*cmd, "--nvidia-smi", str(smi)], check=True, capture_output=True, timeout=60)
    import json

    snaps = json.loads(out.read_text())
    assert [s["label"] for s in snaps] == ["start", "end"] and snaps[0]["nvidia_smi"] == "ok"
    (gpu,) = snaps[0]["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["driver_version"] == "580.159.04"
    assert gpu["clocks.sm"] == "1980" and gpu["clocks.max.mem"] == "2619" and gpu["compute_mode"] == "Default"
    assert snaps[0]["versions"]["torch"] and snaps[0]["versions"]["python"]
    cmd = [sys.executable, str(ROOT / "kernels" / "device_record.py"), "--out", str(tmp_path / "none.json")]
    subprocess.run([*cmd, "--nvidia-smi", str(tmp_path / "absent")], check=True, capture_output=True, timeout=60)
    (none,) = json.loads((tmp_path / "none.json").read_text())
    assert none["gpus"] == [] and "absent" in none["nvidia_smi"]
