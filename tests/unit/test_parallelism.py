"""The training loop is one for every layout: a sharded (FSDP2, 2 gloo ranks) checkpoint holds each rank's
log-window meter, so a run resumed inside a log window writes the rows of the uninterrupted run, and the log rows
of one process and of the sharded layout have the same keys, less the sharded layout's throughput columns.
Two 2-process launches (about 15 s each on 2 cores) and one single-process run.
"""

import copy
import shutil

import pytest
import torch
from dist_support import DATA, log_rows, run_dict, torchrun, train_args, write

from mohge.config import RunConfig
from mohge.data import DataConfig, prepare
from mohge.train.distributed.trainer import LOG_COLUMNS
from mohge.train.trainer import train

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes

STEPS, LOG_EVERY, CKPT_EVERY = 8, 4, 3  # the step-3 checkpoint falls inside the first log window (steps 0-3)
TIMING = ("tokens_per_s", "mfu")


def sharded_run() -> dict:
    run = run_dict(STEPS, dp_shard=-1, ep=1)
    run["train"].update(log_every=LOG_EVERY, ckpt_every=CKPT_EVERY, eval_every=LOG_EVERY, eval_batches=2)
    return run


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    prepare(DataConfig.from_dict(DATA), root / "data")
    config = write(root / "run.json", sharded_run())
    torchrun(2, train_args(config, root / "out", root / "data"))
    return {"root": root, "config": config}


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_a_sharded_checkpoint_inside_a_log_window_holds_every_ranks_meter(straight):
    saved = straight["root"] / "out" / ".scratch" / "dcp" / f"step_{CKPT_EVERY:08d}"
    for rank in range(2):
        meter = torch.load(saved / f"meter_{rank:05d}.pt", weights_only=True)
        assert meter["steps"] == CKPT_EVERY and meter["micro"] == CKPT_EVERY * 2, meter
        assert meter["counts_LE"].sum() > 0 and meter["expert_flops"] > 0


def test_a_sharded_resume_inside_a_log_window_logs_the_rows_of_the_uninterrupted_run(straight, tmp_path):
    root = straight["root"]
    scratch = tmp_path / "scratch"
    name = f"step_{CKPT_EVERY:08d}"
    shutil.copytree(root / "out" / ".scratch" / "dcp" / name, scratch / "dcp" / name)
    out = tmp_path / "out"
    torchrun(2, train_args(straight["config"], out, root / "data", "--scratch", str(scratch), "--require-resume"))
    rows = log_rows(out)
    assert [r["step"] for r in rows if "loss" in r] == [LOG_EVERY - 1, STEPS - 1]
    assert without_timing(rows) == without_timing(log_rows(root / "out"))


def test_log_rows_of_one_process_and_of_the_sharded_layout_have_the_same_keys(straight, tmp_path):
    one = copy.deepcopy(sharded_run())
    del one["train"]["parallel"]
    threads = torch.get_num_threads()
    train(RunConfig.from_dict(one), tmp_path / "one", data=str(straight["root"] / "data"))
    torch.set_num_threads(threads)
    sharded = [sorted(set(r) - set(LOG_COLUMNS)) for r in log_rows(straight["root"] / "out")]
    assert sharded == [sorted(r) for r in log_rows(tmp_path / "one")]
    assert all("expert_flops_per_rank" in r for r in log_rows(straight["root"] / "out") if "loss" in r)
