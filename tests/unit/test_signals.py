"""SIGTERM (SLURM before a time limit or on preemption) and SIGINT (Ctrl-C) stop training after
the current step with a checkpoint of that step, the locks released, exit 128 + signum and one line; the resume
is bit-identical to the uninterrupted run. One process, and FSDP2 on 2 gloo ranks (every rank checkpoints)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_run
from dist_support import DATA as DIST_DATA
from dist_support import log_rows, run_dict, torchrun, train_args, write
from safetensors.torch import load_file

from mohge.config import RunConfig
from mohge.data import DataConfig, prepare
from mohge.train.checkpoint import list_checkpoints
from mohge.train.trainer import train

DATA = {"source": "graded", "vocab_size": 300, "seq_len": 32, "graded_num_docs": 200}
RUN = tiny_run(
    data=DATA,
    model={"max_seq_len": 32},
    train={"steps": 24, "batch_size": 8, "ckpt_every": 8, "log_every": 1, "keep_checkpoints": 3},
)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("signals")
    prepare(DataConfig.from_dict(DATA), root / "data")
    (root / "run.json").write_text(json.dumps(RUN))
    n = torch.get_num_threads()
    train(RunConfig.from_dict(RUN), root / "straight", data=str(root / "data"))
    torch.set_num_threads(n)
    return {"root": root, "data": root / "data", "config": root / "run.json", "out": root / "straight"}


def wait_for_rows(log: Path, proc: subprocess.Popen, rows: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if log.is_file() and len(log.read_text().splitlines()) >= rows:
            return
        time.sleep(0.005)
    raise AssertionError(f"{log} did not reach {rows} rows (exit {proc.poll()})")


def no_leftovers(*folders: Path) -> None:
    for folder in folders:
        left = [p.name for p in folder.iterdir() if p.name.startswith((".mohge.lock", ".tmp-"))]
        assert not left, (folder, left)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_with_a_checkpoint_then_resumes_exactly(straight, tmp_path, sig):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mohge.train", "--config", str(straight["config"]), "--out", str(out)]
    cmd += ["--data", str(straight["data"]), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out / ".scratch" / "train_log.jsonl", proc, 2)  # inside the first window of 8 steps
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(lines) == 1 and f"{sig.name} received: stopped after step" in lines[0], stderr[-2000:]
    step = int(lines[0].split("stopped after step ")[1].split()[0])
    assert [s for s, _ in list_checkpoints(out / ".scratch")][0] == step  # that very step, off the cadence
    assert not (out / "model.safetensors").exists()
    no_leftovers(out, out / ".scratch")
    summary = train(RunConfig.from_dict(RUN), out, data=str(straight["data"]), require_resume=True)
    assert summary["resumed_from_step"] == step
    a, b = load_file(straight["out"] / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["loss"] for r in map(json.loads, (d / "train_log.jsonl").read_text().splitlines())]
        for d in (straight["out"], out)
    ]
    assert losses[0] == losses[1]


def test_sigterm_outside_the_step_loop_is_one_line(straight, tmp_path, monkeypatch):
    """Before the first step (here: while the data is being checked) a signal stops at once, in one line."""
    out = tmp_path / "out"
    code = (
        "import os, signal, sys\n"
        "import mohge.data.loader as loader\n"
        "real = loader.verify_folder\n"
        "def slow(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(*a, **k)\n"
        "loader.verify_folder = slow\n"
        "import mohge.train.run_files as run_files\n"
        "import mohge.train.trainer as t\n"
        "run_files.verify_folder = slow\n"
        "sys.exit(t.main(sys.argv[1:]))\n"
    )
    args = ["--config", str(straight["config"]), "--out", str(out), "--data", str(straight["data"])]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].endswith("SIGTERM received: stopped"), done.stderr[-2000:]
    no_leftovers(out)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_signal")
    prepare(DataConfig.from_dict(DIST_DATA), root / "data")
    run = run_dict(8, dp_shard=-1, ep=1)
    run["train"]["ckpt_every"] = 4
    config = write(root / "run.json", run)
    torchrun(2, train_args(config, root / "out", root / "data"))
    return {"root": root, "config": config}


@pytest.mark.multiprocess
def test_sigterm_on_two_gloo_ranks_checkpoints_one_step_on_every_rank_and_resumes_exactly(fsdp, tmp_path):
    root = fsdp["root"]
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += train_args(fsdp["config"], out, root / "data")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        wait_for_rows(out / ".scratch" / "train_log.jsonl", proc, 1)
        os.killpg(proc.pid, signal.SIGTERM)  # as SLURM does: every process of the job, launcher and ranks
        _, stderr = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stops = [line for line in stderr.splitlines() if "SIGTERM received: stopped after step" in line]
    assert len(stops) == 2 and {"mohge.train[0]" in s or "mohge.train[1]" in s for s in stops} == {True}, stderr[-3000:]
    steps = {int(s.split("stopped after step ")[1].split()[0]) for s in stops}
    assert len(steps) == 1, stops  # every rank stopped after the same step
    step = steps.pop()
    assert step < 8 and not (out / "model.safetensors").exists()
    saved = out / ".scratch" / "dcp" / f"step_{step:08d}"
    assert saved.is_dir() and len(list(saved.glob("rng_*.pt"))) == 2, sorted(p.name for p in saved.iterdir())
    no_leftovers(out, out / ".scratch")
    torchrun(2, train_args(fsdp["config"], out, root / "data", "--require-resume"))
    a, b = load_file(root / "out" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("loss", "lm_loss", "aux_loss", "grad_norm")
    assert [[r[k] for k in keys] for r in log_rows(root / "out")] == [[r[k] for k in keys] for r in log_rows(out)]
