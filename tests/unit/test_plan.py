"""The planner: the trainer's FSDP2 units on the meta device, per-GPU memory, and its command line."""

import json
import subprocess
import sys
from pathlib import Path

import yaml
from dist_support import run_dict

from mohge.analysis.plan import load_run, main, memory_per_gpu
from mohge.config import RunConfig
from mohge.model import LanguageModel
from mohge.model.params import count_params
from mohge.train.distributed import check_layout
from mohge.train.distributed.parallelize import apply_ep, shard_plan

ROOT = Path(__file__).resolve().parents[2]


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


PAPER = ROOT / "configs" / "paper.yaml"


def test_paper_config_plans_its_own_fsdp_ep4_layout(tmp_path, capsys):
    """configs/paper.yaml carries the release's layout (train.parallel: FSDP2 over every rank, EP 4 by the
    all-size placement), and the planner plans that section, as the trainer will run it."""
    out = tmp_path / "plan.json"
    argv = [str(PAPER), "--nodes", "1", "2", "4", "--gpus-per-node", "8", "--gpu-mem", "80", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["layout"], r["dp_shard"], r["ep"], r["dp_replicate"], r["fits"]) for r in rows] == [
        ("fsdp", 8, 4, 1, True),
        ("fsdp", 16, 4, 1, True),
        ("fsdp", 32, 4, 1, True),
    ]
    assert "| 2 x 8 | 16 x 4 |" in capsys.readouterr().out
    cfg = load_run([str(PAPER)], None)
    assert cfg.family == "mohge" and cfg.model.ffn.placement == "all_size" and cfg.train.parallel is not None
    # every run of the config (the matched baselines too) passes the trainer's layout check on 16 ranks
    for run in ("web-moe-s0", "web-moe_equal-s0", "web-hmoe-s0", "web-modse-s0", "web-dense-s0"):
        layout = check_layout(load_run([str(PAPER)], run), 16)
        assert (layout.dp_shard, layout.ep) == (16, 1 if run == "web-dense-s0" else 4), run


def without_parallel(tmp_path) -> str:
    cfg = yaml.safe_load(PAPER.read_text())
    del cfg["train"]["parallel"]
    path = tmp_path / "paper-ddp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_without_a_parallel_section_the_ddp_replica_is_planned_and_refused(tmp_path):
    """No train.parallel: torchrun trains a whole fp32 replica per GPU (DDP); the planner plans that, and it does
    not fit 80 GB: refused in one line naming train.parallel, exit 2, after the table."""
    config, rows = without_parallel(tmp_path), tmp_path / "plan.json"
    argv = [sys.executable, "-m", "mohge", "plan", config, "--nodes", "2", "--gpus-per-node", "8", "--json", str(rows)]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert "| 2 x 8 | DDP, 16 replicas |" in out.stdout and "NO (80 GiB)" in out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("ConfigError: train.parallel: unset") and "DDP replica" in line and "Traceback" not in line
    # the replica's states: 4 + 4 + 8 bytes per parameter, plus DDP's gradient buckets (4)
    (row,) = json.loads(rows.read_text())
    total = count_params(load_run([config], None).model)["total_sum"] / 2**30
    assert (row["layout"], row["dp_shard"], row["ep"], row["dp_replicate"]) == ("ddp", 1, 1, 16)
    for key, per_param in (("params", 4), ("grads", 4), ("optimizer", 8), ("fsdp_buffers", 4)):
        assert abs(row[f"{key}_gib"] - per_param * total) < 1e-6, key


def test_a_layout_that_does_not_fit_is_refused_naming_the_key(tmp_path, caplog):
    """The paper layout fits 80 GiB but not 24: refused, naming train.parallel and the sizes that fail."""
    assert main([str(PAPER), "--nodes", "1", "2", "--gpus-per-node", "8", "--gpu-mem", "24"]) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    message = record.getMessage()
    assert message.startswith("ConfigError: train.parallel: dp_shard=-1, ep=4") and "1 x 8, 2 x 8 GPUs" in message
    assert "\n" not in message
