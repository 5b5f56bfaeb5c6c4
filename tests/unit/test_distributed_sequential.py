"""Sequential data order under FSDP2 on gloo: 4 ranks read disjoint parts of every global batch, the global window
position goes into the sharded checkpoint, and a resume of the step-2 checkpoint on 2 ranks reads on from the
next window. Windows are compared through the losses of a single-process reference that reads exactly the
windows the position says (one 4-process and one 2-process launch, about 40 s on 2 cores).
"""

import json
import shutil

import pytest
from dist_support import DATA, log_rows, reference, rel, run_dict, torchrun, train_args, write
from shard_support import reshard

from mohge.config import RunConfig
from mohge.data import DataConfig, TokenStream, prepare

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes

STEPS, B = 4, 4
LOSS_RTOL = 1e-5  # fp32; only the order of sums differs (FSDP reductions)


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequential")
    prepare(DataConfig.from_dict(DATA), root / "v1")
    reshard(root / "v1", root / "data", 4)
    run = run_dict(STEPS, dp_shard=-1, ep=1)
    run["train"]["data_order"] = "sequential"
    config = write(root / "run.json", run)
    torchrun(4, train_args(config, root / "out", root / "data"))
    return {"root": root, "run": run, "config": config}


def test_four_ranks_read_the_global_batches_in_order(seq_run):
    root, cfg = seq_run["root"], RunConfig.from_dict(seq_run["run"])
    rows = [r for r in log_rows(root / "out") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert [r["data"]["window"] for r in rows] == [(s + 1) * B * 4 for s in range(STEPS)]
    ref = reference(cfg, root / "data", [4] * STEPS)
    for r, want in zip(rows, ref["loss"], strict=True):
        assert rel(r["loss"], want) < LOSS_RTOL, (r["step"], r["loss"], want)
    data = json.loads((root / "out" / ".scratch" / "dcp" / "step_00000002" / "data.json").read_text())
    order = TokenStream.open(root / "data", "train").window_order(cfg.data_config.seq_len, cfg.train.seed)
    assert data == {"order": "sequential", **order.position(2 * B * 4), "windows_per_epoch": order.per_epoch,
                    "step": 2, "world_size": 4}  # fmt: skip


def test_resume_of_four_ranks_on_two_reads_on_from_the_next_window(seq_run, tmp_path):
    root = seq_run["root"]
    scratch = tmp_path / "scratch"
    shutil.copytree(root / "out" / ".scratch" / "dcp" / "step_00000002", scratch / "dcp" / "step_00000002")
    out = tmp_path / "out2"
    torchrun(2, train_args(seq_run["config"], out, root / "data", "--scratch", str(scratch), "--require-resume"))
    rows = [r for r in log_rows(out) if "loss" in r]
    assert [r["step"] for r in rows] == [2, 3]
    # 2 steps of 4 ranks read windows [0, 32); then 2 ranks read [32, 40) and [40, 48): none skipped, none twice
    assert [r["data"]["window"] for r in rows] == [2 * B * 4 + B * 2, 2 * B * 4 + 2 * B * 2]
    ref = reference(RunConfig.from_dict(seq_run["run"]), root / "data", [4, 4, 2, 2])
    for r, want in zip(rows, ref["loss"][2:], strict=True):
        assert rel(r["loss"], want) < LOSS_RTOL, (r["step"], r["loss"], want)
