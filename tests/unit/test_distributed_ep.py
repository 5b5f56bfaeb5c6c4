"""Expert parallelism 2 x FSDP 2 on 4 gloo processes against one process, then a resume on 2 processes.

One 4-process launch (about 25 s on 2 cores) computes the step-0 gradients and trains 4 steps, saving
sharded checkpoints at steps 2 and 4; one 2-process launch resumes the step-2 checkpoint.
"""

import json
import shutil

import pytest
import torch
from dist_support import DATA, WORKER, log_rows, reference, rel, run_dict, torchrun, train_args, write
from safetensors.torch import load_file

from mohge.config import RunConfig
from mohge.data import DataConfig, prepare
from mohge.train.checkpoint import load_trained, verify_checkpoint
from mohge.train.distributed.dcp import REQUIRED

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes

STEPS = 4
LOSS_RTOL = 1e-5  # fp32; what differs is only the order of sums (experts combined per rank, FSDP reductions)
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7
# weights after a few AdamW steps at lr 1e-2: Adam divides by sqrt(v), so an element whose gradient is near 0
# turns a rounding difference of its gradient into up to ~5e-6 of weight (weights are ~0.05)
WEIGHT_ATOL = 2e-5


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ep")
    prepare(DataConfig.from_dict(DATA), root / "data")
    # 4 ranks: dp_shard 4 = (dp_shard_mod_ep 2) x (ep 2); blocks recomputed in the backward (the same math)
    run = run_dict(STEPS, ep=2, activation_checkpointing="block")
    config = write(root / "run.json", run)
    grads = root / "grads.pt"
    torchrun(4, [str(WORKER), str(grads), str(config), str(root / "out"), str(root / "data")], cwd=root)
    return {"root": root, "run": run, "config": config, "grads": torch.load(grads, weights_only=True)}


def test_ep2_dp2_losses_and_gradients_match_one_process(ep_run):
    root, cfg = ep_run["root"], RunConfig.from_dict(ep_run["run"])
    ref = reference(cfg, root / "data", [4] * STEPS)
    rows = log_rows(root / "out")
    assert [r["step"] for r in rows] == list(range(STEPS))
    for r, want, gn in zip(rows, ref["loss"], ref["grad_norm"], strict=True):
        assert rel(r["loss"], want) < LOSS_RTOL, (r["step"], r["loss"], want)
        assert rel(r["grad_norm"], gn) < 1e-4, (r["step"], r["grad_norm"], gn)
    grads = ep_run["grads"]
    # gradient accumulation (2 micro-batches): no rank reduce-scattered a gradient before the last one
    assert json.loads((root / "grads.sync.json").read_text()) == {"reduced_before_last_micro": 0}
    assert grads.keys() == ref["grads0"].keys()
    for name, want in ref["grads0"].items():
        torch.testing.assert_close(grads[name], want, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
    # the consolidated export loads as a single-process model with the reference's weights
    _, model = load_trained(root / "out")
    for name, want in ref["state"].items():
        torch.testing.assert_close(model.state_dict()[name], want, rtol=1e-4, atol=WEIGHT_ATOL, msg=name)
    # throughput columns: every rank's expert FLOPs; the expert FLOPs of all ranks add up to the routed FLOPs
    assert len(rows[0]["expert_flops_per_rank"]) == 4 and all(f > 0 for f in rows[0]["expert_flops_per_rank"])
    assert rows[0]["model_flops_per_token"] > 0
    # measured beside the analytic: every rank's seconds of local expert compute, and both spreads over ranks
    assert len(rows[0]["expert_seconds_per_rank"]) == 4 and all(s > 0 for s in rows[0]["expert_seconds_per_rank"])
    assert rows[0]["expert_seconds_max_mean"] >= 1 and rows[0]["expert_flops_max_mean"] >= 1


def test_dcp_checkpoint_is_atomic_checksummed_and_resumes_on_two_ranks(ep_run, tmp_path):
    root = ep_run["root"]
    dcp_dir = root / "out" / ".scratch" / "dcp"
    assert sorted(p.name for p in dcp_dir.iterdir()) == ["step_00000002", "step_00000004"]
    manifest = verify_checkpoint(dcp_dir / "step_00000002", REQUIRED)
    assert {f"rng_{r:05d}.pt" for r in range(4)} <= set(manifest["files"])
    # resume the step-2 checkpoint of 4 ranks on 2 ranks
    scratch = tmp_path / "scratch"
    shutil.copytree(dcp_dir / "step_00000002", scratch / "dcp" / "step_00000002")
    out = tmp_path / "out2"
    torchrun(2, train_args(ep_run["config"], out, root / "data", "--scratch", str(scratch), "--require-resume"))
    rows = log_rows(out)
    assert [r["step"] for r in rows] == [2, 3]
    # the reference: steps 0-1 as 4 data-parallel ranks, steps 2-3 as 2 (the data split follows the world)
    ref = reference(RunConfig.from_dict(ep_run["run"]), root / "data", [4, 4, 2, 2])
    for r, want in zip(rows, ref["loss"][2:], strict=True):
        assert rel(r["loss"], want) < LOSS_RTOL, (r["step"], r["loss"], want)
    final = load_file(out / "model.safetensors")
    for name, want in ref["state"].items():
        torch.testing.assert_close(final[name], want, rtol=1e-4, atol=WEIGHT_ATOL, msg=name)
