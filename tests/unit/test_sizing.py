"""The sizing: the trainer's FSDP2 units on the meta device, per-GPU memory, and its command line."""

import json
import math
import subprocess
import sys
from pathlib import Path

import yaml
from dist_support import run_dict
from mohge_studies.analysis.sizing import (
    fmt_count,
    fmt_days,
    fmt_gib,
    load_run,
    main,
    memory_per_gpu,
    time_limit_warning,
)
from mohge_studies.config.runs import ClusterConfig, train_resources

from mohge.config import RunConfig
from mohge.config.sizes import count_params
from mohge.model import LanguageModel
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
    out = tmp_path / "sizing.json"
    assert main([str(config), "--nodes", "1", "2", "--gpus-per-node", "2", "--gpu-mem", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["gpus"], r["ep"], r["fits"]) for r in rows] == [(2, 2, True), (4, 2, True)]
    assert rows[1]["tokens"] == 2 * rows[0]["tokens"]  # batch_size is per process
    assert "| 2 x 2 | 4 x 2 |" in capsys.readouterr().out
    assert main([str(config), "--nodes", "3", "--gpus-per-node", "1"]) == 2  # ep 2 does not divide 3 ranks


PAPER = ROOT / "configs" / "paper.yaml"


def test_paper_config_plans_its_own_fsdp_ep4_layout(tmp_path, capsys):
    """configs/paper.yaml carries the release's layout (train.parallel: FSDP2 over every rank, EP 4 by the
    all-size placement), and the sizing plans that section, as the trainer will run it."""
    out = tmp_path / "sizing.json"
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
    """No train.parallel: torchrun trains a whole fp32 replica per GPU (DDP); the sizing plans that, and it does
    not fit 80 GB: refused in one line naming train.parallel, exit 2, after the table."""
    config, rows = without_parallel(tmp_path), tmp_path / "sizing.json"
    argv = [sys.executable, "-m", "mohge", "sizing", config, "--nodes", "2", "--gpus-per-node", "8"]
    argv += ["--json", str(rows)]
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


SMOKE = ROOT / "configs" / "smoke.yaml"


def test_paper_config_alone_plans_its_job_and_warns_that_it_outlives_the_time_limit(tmp_path, capsys):
    """`mohge sizing configs/paper.yaml` plans the job the workflow submits (cluster: 2 x 8), says which batch
    it holds, and warns that the days exceed the runtime the train rule asks SLURM for, with the retry path."""
    out = tmp_path / "sizing.json"
    assert main([str(PAPER), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    (row,) = json.loads(out.read_text())
    assert (row["nodes"], row["gpus"], row["global_batch"]) == (2, 16, 512)
    cluster = ClusterConfig.from_dict(yaml.safe_load(PAPER.read_text())["cluster"])
    assert row["job_runtime_min"] == train_resources(cluster)["runtime"] == cluster.runtime_min
    assert row["days"] * 1440 > row["job_runtime_min"] and row["attempts"] == math.ceil(row["days"] * 1440 / 10080)
    assert "batch: the per-GPU batch is held at train.batch_size = 32 sequences per GPU" in text
    assert "warning: the plan exceeds the training job's time limit, cluster.runtime_min = 10080 min" in text
    flat = " ".join(text.split())
    for step in ("SIGTERM 300 s before the limit", "exits 143", "Snakemake resubmits the job (retries: 2 in "):
        assert step in flat, step
    assert f"{row['attempts']} attempts" in flat and f"cluster.runtime_min >= {math.ceil(row['days'] * 1440)}" in flat


def test_the_held_batch_is_stated_and_decides_the_tokens(tmp_path, capsys):
    """Without --global-batch the per-GPU batch is held (tokens grow with the GPUs, the note says so); with it the
    global batch is held (every layout trains the same tokens)."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps(run_dict(4, ep=1)))
    out = tmp_path / "sizing.json"
    base = [str(config), "--nodes", "1", "2", "--gpus-per-node", "2", "--json", str(out)]
    assert main(base) == 0
    rows = json.loads(out.read_text())
    assert [r["global_batch"] for r in rows] == [8, 16] and rows[1]["tokens"] == 2 * rows[0]["tokens"]
    assert "batch: the per-GPU batch is held at train.batch_size = 4" in capsys.readouterr().out
    assert main([*base, "--global-batch", "8"]) == 0
    rows = json.loads(out.read_text())
    assert [(r["global_batch"], r["batch_per_gpu"]) for r in rows] == [(8, 4), (8, 2)]
    assert rows[0]["tokens"] == rows[1]["tokens"]
    text = capsys.readouterr().out
    assert "batch: the global batch is held at 8 sequences per step" in text
    assert "job:" not in text and "warning" not in text  # a resolved run config has no cluster section


def test_a_cpu_config_is_refused_naming_the_key_not_planned_as_zeros(tmp_path, capsys, caplog):
    """configs/smoke.yaml trains on CPUs (cluster.gpus_per_node: 0): refused in one line naming the key; planned on
    GPUs when asked, its tiny sizes are shown in units that keep them (no row of zeros)."""
    assert main([str(SMOKE)]) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith("ConfigError: cluster.gpus_per_node=0:")
    assert "--gpus-per-node" in record.getMessage()
    capsys.readouterr()
    assert main([str(SMOKE), "--gpus-per-node", "1"]) == 0
    text = capsys.readouterr().out
    (row_line,) = [line for line in text.splitlines() if line.startswith("| 1 x 1 |")]
    assert "0.0 GiB" not in row_line and " MiB" in row_line and "0.00 T" not in row_line and " k |" in row_line
    assert "0.00 GFLOPs" not in text and "without GPUs (cluster.gpus_per_node = 0" in text


def test_a_resolved_run_config_needs_both_sizes(tmp_path, caplog):
    config = tmp_path / "run.json"
    config.write_text(json.dumps(run_dict(4, ep=1)))
    assert main([str(config), "--nodes", "1"]) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "--nodes, --gpus-per-node:" in record.getMessage() and "no cluster section" in record.getMessage()


def row(nodes: int, days: float, limit: int) -> dict:
    return {"nodes": nodes, "gpus": 8 * nodes, "days": days, "attempts": max(1, math.ceil(days * 1440 / limit))}


def test_the_time_limit_warning_follows_the_profiles_retry_path(tmp_path):
    """No warning while every layout fits one job; past the limit, the attempts each layout needs and what the retry
    path does; past the profile's retries, that the run stops unfinished; without a profile, no invented numbers."""
    cluster = ClusterConfig(nodes=2, gpus_per_node=8, runtime_min=1440)
    assert time_limit_warning([row(2, 0.9, 1440)], cluster) == []
    profile = tmp_path / "slurm" / "config.yaml"
    profile.parent.mkdir()
    profile.write_text("retries: 1\nset-resources:\n  train:\n    slurm_extra: \"'--signal=TERM@120'\"\n")
    flat = " ".join(" ".join(time_limit_warning([row(1, 4.2, 1440), row(2, 2.1, 1440)], cluster, profile)).split())
    assert "cluster.runtime_min = 1440 min (1.0 days per attempt)" in flat
    assert "1 x 8: 4.2 days, 5 attempts; 2 x 8: 2.1 days, 3 attempts" in flat
    assert "SIGTERM 120 s before the limit" in flat and "retries: 1 in " in flat
    assert "a run that needs 5 stops unfinished" in flat
    assert "One job of 2 x 8 would need cluster.runtime_min >= 3024" in flat  # the config's own layout
    bare = " ".join(time_limit_warning([row(2, 2.1, 1440)], cluster, tmp_path / "none.yaml"))
    assert "SIGTERM at the limit" in bare and "the SLURM profile's retries" in bare and "unfinished" not in bare


def test_train_resources_carry_the_configs_limits_on_one_and_several_nodes():
    one = train_resources(ClusterConfig(nodes=1, gpus_per_node=8, mem_gb=100, runtime_min=600))
    assert one == {"nodes": 1, "mem_mb": 102400, "runtime": 600, "gpu": 8}
    two = train_resources(ClusterConfig(nodes=2, gpus_per_node=8, runtime_min=600))
    assert two["runtime"] == 600 and (two["mpi"], two["tasks"], two["tasks_per_gpu"], two["gres"]) == (
        "srun",
        2,
        0,
        "gpu:8",
    )


def test_sizes_are_printed_in_units_that_keep_them():
    assert [fmt_gib(47.14), fmt_gib(0.0021), fmt_gib(2e-7), fmt_gib(0)] == ["47.1 GiB", "2.2 MiB", "0.2 KiB", "0"]
    assert [fmt_count(1.07e12), fmt_count(5.33e11), fmt_count(3072), fmt_count(12)] == [
        "1.07 T",
        "0.533 T",
        "3.07 k",
        "12",
    ]
    assert [fmt_days(9.63), fmt_days(0.25), fmt_days(0.003), fmt_days(1e-6)] == [
        "9.6 days",
        "6.0 h",
        "4 min",
        "under a minute",
    ]
