"""The planner: the trainer's FSDP2 units on the meta device, per-GPU memory, and its command line."""

import json

from dist_support import run_dict

from mohge.analysis.plan import main, memory_per_gpu
from mohge.config import RunConfig
from mohge.model import LanguageModel
from mohge.model.params import count_params
from mohge.train.distributed import check_layout
from mohge.train.distributed.parallelize import apply_ep, shard_plan


def test_shard_plan_covers_every_parameter_once_with_experts_apart():
    cfg = RunConfig.from_dict(run_dict(4, ep=2))
    layout = check_layout(cfg, 4)
    model = LanguageModel(cfg.model, cfg.loss).to("meta")
    apply_ep(model, layout, ep_rank=1)
    units = shard_plan(model)
    assert [(u.name, u.mesh) for u in units] == [
        ("blocks.0.ffn.experts", "expert"),
        ("blocks.0", "dense"),
        ("blocks.1.ffn.experts", "expert"),
        ("blocks.1", "dense"),
        ("", "dense"),
    ]
    names = [f"{u.name}.{n}".lstrip(".") for u in units for n, _ in u.params]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    # this EP rank holds its placement's experts: all_size at ep 2 gives each rank one expert of every width
    assert sorted(int(n.split(".")[1]) for n, _ in units[0].params if n.endswith("w1")) == [1, 3, 5, 7]


def test_memory_per_gpu_counts_sharded_parameters():
    cfg = RunConfig.from_dict(run_dict(4, ep=1))
    total = count_params(cfg.model)["total_sum"]
    one = memory_per_gpu(cfg, check_layout(cfg, 1))
    assert one["params"] == 4 * total and one["optimizer"] == 8 * total
    ep = RunConfig.from_dict(run_dict(4, ep=2))
    two = memory_per_gpu(ep, check_layout(ep, 2))  # dense halved (dim 0 padded), experts split by placement
    assert total / 2 <= two["params"] / 4 <= total / 2 + 1000
    assert two["activations"] > 0 and two["total"] == sum(v for k, v in two.items() if k != "total")


def test_cli_table_and_refusal(tmp_path, capsys):
    config = tmp_path / "run.json"
    config.write_text(json.dumps(run_dict(4, ep=2)))
    out = tmp_path / "plan.json"
    assert main([str(config), "--nodes", "1", "2", "--gpus-per-node", "2", "--gpu-mem", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["gpus"], r["ep"], r["fits"]) for r in rows] == [(2, 2, True), (4, 2, True)]
    assert rows[1]["tokens"] == 2 * rows[0]["tokens"]  # batch_size is per process
    assert "| 2 x 2 | 4 x 2 |" in capsys.readouterr().out
    assert main([str(config), "--nodes", "3", "--gpus-per-node", "1"]) == 2  # ep 2 does not divide 3 ranks
