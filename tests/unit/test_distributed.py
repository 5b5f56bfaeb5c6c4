"""FSDP2 on 2 gloo processes against one process; the layout checks that refuse a bad ``train.parallel``
before anything starts. One 2-process launch of ``python -m mohge.train`` (about 20 s on 2 cores).
"""

import pytest
import torch
from dist_support import DATA, log_rows, reference, rel, run_dict, torchrun, train_args, write
from safetensors.torch import load_file

from mohge.config import ConfigError, RunConfig
from mohge.data import DataConfig, prepare
from mohge.train.distributed import check_layout

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes

STEPS = 5


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    prepare(DataConfig.from_dict(DATA), root / "data")
    run = run_dict(STEPS, dp_shard=-1, ep=1)
    config = write(root / "run.json", run)
    torchrun(2, train_args(config, root / "out", root / "data"))
    return {"root": root, "run": run, "config": config}


def test_fsdp_two_ranks_same_losses_as_one_process(fsdp_run):
    root = fsdp_run["root"]
    ref = reference(RunConfig.from_dict(fsdp_run["run"]), root / "data", [2] * STEPS)
    rows = log_rows(root / "out")
    assert [r["step"] for r in rows] == list(range(STEPS))
    worst = max(rel(r["loss"], want) for r, want in zip(rows, ref["loss"], strict=True))
    assert worst < 1e-5, worst
    final = load_file(root / "out" / "model.safetensors")
    assert final.keys() == ref["state"].keys()
    for name, want in ref["state"].items():
        torch.testing.assert_close(final[name], want, rtol=1e-4, atol=2e-5, msg=name)


def layout_error(world: int, **over) -> str:
    with pytest.raises(ConfigError) as err:
        check_layout(RunConfig.from_dict(over.pop("run", None) or run_dict(4, **over)), world)
    return str(err.value)


def test_bad_layouts_are_refused_naming_the_key():
    assert check_layout(RunConfig.from_dict(run_dict(4, ep=2)), 4).rank_of_expert == (0, 1) * 4
    hsdp = check_layout(RunConfig.from_dict(run_dict(4, dp_shard=2, ep=2)), 8)
    assert (hsdp.dp_replicate, hsdp.dp_shard, hsdp.dp_shard_mod_ep, hsdp.coords(7)) == (4, 2, 1, (3, 0, 1))
    assert layout_error(6, dp_shard=4).startswith("train.parallel.dp_shard=4: must divide the world size 6")
    assert layout_error(3, ep=2).startswith("train.parallel.ep=2: must divide train.parallel.dp_shard=3")
    assert layout_error(16, ep=16).startswith("train.parallel.ep=16: must divide the number of experts 2 x 4")
    assert "all_size needs E/ep (=1)" in layout_error(8, ep=8)
    odd = run_dict(4, ep=2)
    odd["model"]["ffn"].update(expert_widths=[16, 32, 48], num_experts=6, placement="contiguous")
    assert check_layout(RunConfig.from_dict(odd), 2).rank_of_expert == (0, 0, 0, 1, 1, 1)
    odd["model"]["ffn"]["placement"] = "modse_pairs"
    with pytest.raises(ConfigError, match=r"^model\.ffn\.expert_widths=.*needs an even G"):
        RunConfig.from_dict(odd)  # the model section itself refuses it
    dense = run_dict(4, ep=2)
    dense["model"]["ffn"]["kind"] = "dense"
    assert "expert parallelism needs MoE layers" in layout_error(2, run=dense)
    with pytest.raises(ConfigError, match=r"^train\.parallel\.compile: unknown key"):
        RunConfig.from_dict(run_dict(4, compile=True))  # no such knob: torch.compile is not part of the layout
    with pytest.raises(ConfigError, match=r"^train\.parallel\.activation_checkpointing='all'"):
        RunConfig.from_dict(run_dict(4, activation_checkpointing="all"))
