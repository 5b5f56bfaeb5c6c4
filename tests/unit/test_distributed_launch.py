"""Two torchrun launchers as two "nodes" on localhost (c10d rendezvous) train 3 steps together, with expert
parallelism across the nodes, activation checkpointing, a validation loss and MFU (about 25 s on 2 cores)."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from dist_support import DATA, log_rows, run_dict, train_args, write

from mohge.data import DataConfig, prepare

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_c10d_rendezvous_train_three_steps(tmp_path):
    prepare(DataConfig.from_dict(DATA), tmp_path / "data")
    run = run_dict(3, ep=2, activation_checkpointing="block", peak_tflops=1.0)
    run["train"].update(ckpt_every=3, eval_every=3)
    config = write(tmp_path / "run.json", run)
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    launcher += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=mohge-two-nodes"]
    args = train_args(config, tmp_path / "out", tmp_path / "data")
    # both "nodes" are 127.0.0.1, so each could take itself for the rendezvous host: say which one is
    procs = [
        subprocess.Popen(
            [*launcher, f"--rdzv-conf=is_host={int(node == 0)}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for node in range(2)
    ]
    try:
        logs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["layout"] == {"dp_replicate": 1, "dp_shard": 2, "ep": 2}
    assert summary["tokens_trained"] == 3 * 4 * 16 * 2
    rows = log_rows(tmp_path / "out")
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [0, 1, 2] and all(r["loss"] > 0 for r in train_rows)
    assert all(len(r["expert_flops_per_rank"]) == 2 and 0 < r["mfu"] < 1 for r in train_rows)
    assert [r["step"] for r in rows if "val_loss" in r] == [2]  # eval_every on the sharded model
    assert summary["mfu"] > 0 and summary["model_flops_per_token"] == train_rows[0]["model_flops_per_token"]
