"""A rank lost mid-run on 2 gloo processes (launched by hand, without torchrun, so each rank's own exit shows):
SIGKILL (its process is gone) and SIGSTOP (it stalls). The other rank stops within train.parallel.timeout_s, with
one line and exit 6 (EXIT_PEER, docs/errors.md). About 15 s per case on 2 cores."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from dist_support import DATA, run_dict, train_args, write

from mohge.core.cli import EXIT_PEER
from mohge.data import DataConfig, prepare

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes

TIMEOUT_S = 4.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("peer")
    prepare(DataConfig.from_dict(DATA), root / "data")
    run = run_dict(100000, dp_shard=-1, ep=1, timeout_s=TIMEOUT_S)
    run["train"].update(ckpt_every=100000, grad_accum=1)
    return root, write(root / "run.json", run)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stalled"])
def test_a_lost_rank_stops_the_other_within_the_timeout_with_exit_6(prepared, sig, tmp_path):
    root, config = prepared
    out = tmp_path / "out"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    env.update(LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    cmd = [sys.executable, *train_args(config, out, root / "data")]
    ranks = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for r in range(2)
    ]
    try:
        log = out / ".scratch" / "train_log.jsonl"
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 3) and time.monotonic() < deadline:
            assert ranks[0].poll() is None and ranks[1].poll() is None, ranks[0].stderr.read()[-3000:]
            time.sleep(0.05)
        assert log.exists(), "training did not start"
        os.kill(ranks[1].pid, sig)
        t0 = time.monotonic()
        _, stderr = ranks[0].communicate(timeout=TIMEOUT_S + 30)
        waited = time.monotonic() - t0
    finally:
        for p in ranks:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert ranks[0].returncode == EXIT_PEER, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "PeerLostError" not in errors[0], stderr[-3000:]
    assert "rank 0 of 2: a collective failed" in errors[0] and "timeout_s=4" in errors[0], errors
    assert "Traceback" not in stderr
    if sig == signal.SIGSTOP:  # a stalled rank is given up on after the timeout, not before
        assert TIMEOUT_S - 0.5 <= waited <= TIMEOUT_S + 15, waited
    else:  # a dead rank's connection is reset: at once
        assert waited <= TIMEOUT_S + 10, waited
