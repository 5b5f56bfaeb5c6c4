"""A SIGKILL mid-run of FSDP2 on 2 gloo processes, resumed from its sharded checkpoint at the same world size:
bit-identical to the uninterrupted run. Three 2-process launches (about 15 s each on 2 cores).
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from dist_support import DATA, log_rows, run_dict, torchrun, train_args, write
from safetensors.torch import load_file

from mohge.data import DataConfig, prepare

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("straight")
    prepare(DataConfig.from_dict(DATA), root / "data")
    config = write(root / "run.json", run_dict(5, dp_shard=-1, ep=1))
    torchrun(2, train_args(config, root / "out", root / "data"))
    return {"root": root, "config": config}


def test_sigkill_then_resume_same_world_is_bit_identical(fsdp_run, tmp_path):
    root = fsdp_run["root"]
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += train_args(fsdp_run["config"], killed, root / "data")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = killed / ".scratch" / "dcp" / "step_00000002"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks
    proc.wait()
    gone = time.monotonic() + 60  # the ranks die a moment after the launcher: their lock on OUT goes with them
    while time.monotonic() < gone:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert first.exists() and not (killed / "model.safetensors").exists(), "not killed between steps 2 and 5"
    torchrun(2, train_args(fsdp_run["config"], killed, root / "data", "--require-resume"))
    straight, resumed = load_file(root / "out" / "model.safetensors"), load_file(killed / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    keys = ("loss", "lm_loss", "aux_loss", "grad_norm")
    assert [[r[k] for k in keys] for r in log_rows(root / "out")] == [[r[k] for k in keys] for r in log_rows(killed)]
