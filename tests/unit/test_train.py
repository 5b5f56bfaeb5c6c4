"""Trainer: LR schedule, bit-identical resume after SIGKILL, NaN guard, logs and outputs, DDP on CPU."""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_run
from safetensors.torch import load_file

from mohge.config import ConfigError, RunConfig, TrainConfig, load_run_config
from mohge.data import DataConfig, prepare
from mohge.train import trainer as train_mod
from mohge.train.checkpoint import find_latest_valid, list_checkpoints
from mohge.train.step import build_optimizer
from mohge.train.trainer import NonFiniteLossError, lr_at, train

DATA = {"source": "graded", "vocab_size": 300, "seq_len": 32, "graded_num_docs": 200}


def run_config(**train) -> dict:
    return tiny_run(
        model={"ffn": {"shared_expert_width": 16}},
        loss={"group_aux_coeff": 1e-2},
        train={
            "steps": 16,
            "batch_size": 8,
            "grad_accum": 2,
            "warmup_steps": 3,
            "keep_checkpoints": 2,
            "eval_batches": 2,
            **train,
        },
        data=DATA,
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    prepare(DataConfig.from_dict(DATA), out)
    return out


def write_config(path: Path, **train) -> Path:
    path.write_text(json.dumps(run_config(**train)))
    return path


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ: {different}"


def test_lr_schedule_warmup_peak_end():
    tc = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, tc) == pytest.approx(1e-4)
    assert lr_at(4, tc) == pytest.approx(5e-4)
    assert lr_at(9, tc) == pytest.approx(1e-3)  # last warmup step reaches the peak
    assert lr_at(10, tc) == pytest.approx(1e-3)  # cosine starts at the peak
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), tc) == pytest.approx(1e-4 + 0.45e-3 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))
    assert lr_at(99, tc) == pytest.approx(1e-4)  # min_lr at the last step
    lrs = [lr_at(s, tc) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lr_at(0, TrainConfig(steps=10, warmup_steps=0, lr=2e-3, min_lr=0.0)) == pytest.approx(2e-3)


def test_outputs_log_and_summary(tmp_path, data_dir):
    cfg = load_run_config(write_config(tmp_path / "run.json"))
    summary = train(cfg, tmp_path / "out", data=str(data_dir))
    out = tmp_path / "out"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "train_log.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    resolved = load_run_config(out / "config.json")  # the resolved copy loads back to the same config
    assert (resolved.model, resolved.loss, resolved.train) == (cfg.model, cfg.loss, cfg.train)
    assert resolved.data_config.to_dict() == cfg.data_config.to_dict()
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 16, 2))
    row = rows[-1]
    assert set(row["aux"]) == {"group_aux", "expert_aux"} and len(row["aux_layers"]["expert_aux"]) == 2
    assert row["group_aux_active"] and not rows[0]["group_aux_active"]  # on once step > 16 // 2
    for usage, width in zip(row["group_usage"], row["mean_expert_width"], strict=True):
        assert len(usage) == 4 and sum(usage) == pytest.approx(1.0)
        assert 16 <= width <= 64
    assert row["activated_expert_width"][0] == pytest.approx(2 * row["mean_expert_width"][0])
    # the load a user watches, per MoE layer: max/mean slots, unused experts, per-rank FLOP max/mean at EP rank_flops_ep
    assert len(row["expert_load"]) == len(row["unused_experts"]) == len(row["rank_flops"]) == 2
    assert all(x >= 1.0 for x in row["expert_load"] + row["rank_flops"]) and row["rank_flops_ep"] in (2, 4)
    assert summary["steps"] == 16 and math.isfinite(summary["val_loss"]) and summary["tokens_per_s"] > 0
    assert summary["params_total"] > summary["params_activated"] > 0
    assert summary["precision"] == "fp32" and isinstance(summary["cpu_bf16"]["bf16_units"], bool)  # detected, measured
    assert summary["cpu_bf16"]["gemm_fp32_over_bf16_time"] > 0
    assert summary["precision_reason"].startswith("auto: ")  # the test config leaves precision at auto
    assert [s for s, _ in list_checkpoints(out / ".scratch")] == [16, 12]  # keep_checkpoints = 2


def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path, data_dir):
    straight = tmp_path / "straight"
    train(load_run_config(write_config(tmp_path / "run.json")), straight, data=str(data_dir))
    # The same run in a subprocess, killed with SIGKILL right after its first checkpoint appears.
    killed = tmp_path / "killed"
    config = write_config(tmp_path / "run_long.json", steps=16)
    cmd = [sys.executable, "-m", "mohge.train", "--config", str(config), "--out", str(killed)]
    cmd += ["--data", str(data_dir), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    first = killed / ".scratch" / "step_00000004"
    deadline = time.monotonic() + 60
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model.safetensors").exists(), "the run finished before it could be killed"
    resumed_at = find_latest_valid(killed / ".scratch")[0]
    assert resumed_at is not None
    summary = train(load_run_config(config), killed, data=str(data_dir), require_resume=True)
    assert summary["resumed_from_step"] == int(resumed_at.name.split("_")[1]) < 16
    assert_same_weights(weights(straight), weights(killed))
    losses = [
        [r["loss"] for r in map(json.loads, (d / "train_log.jsonl").read_text().splitlines())]
        for d in (straight, killed)
    ]
    assert losses[0] == losses[1]


def test_a_training_process_imports_no_compiler_and_its_adamw_updates_as_torchs(tmp_path, data_dir, monkeypatch):
    """A run of the CLI, and its resume from the checkpoint before the last (the optimizer's state_dict,
    load_state_dict, zero_grad and step), never import torch._dynamo; and the resumed run's weights and losses equal
    those of the same run trained straight with torch.optim.AdamW itself in place of mohge's."""
    config = write_config(tmp_path / "run.json", ckpt_every=4)
    out, scratch = tmp_path / "cli", tmp_path / "scratch"
    args = ["--config", str(config), "--out", str(out), "--scratch", str(scratch), "--data", str(data_dir)]
    code = (
        "import sys; from mohge.train.trainer import main; "
        "rc = main(sys.argv[1:]); print(rc, 'torch._dynamo' in sys.modules)"
    )
    for resume in ([], ["--require-resume"]):
        run = subprocess.run([sys.executable, "-c", code, *args, *resume], capture_output=True, text=True, timeout=300)
        assert run.stdout.split() == ["0", "False"], run.stdout + run.stderr[-2000:]
        if not resume:  # back to the checkpoint before the last: the second process loads the optimizer's state
            shutil.rmtree(list_checkpoints(scratch)[0][1])
            (out / "model.safetensors").unlink()
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == 12
    monkeypatch.setattr(train_mod, "build_optimizer", torch_adamw_optimizer)
    train(load_run_config(config), tmp_path / "torch", data=str(data_dir))
    assert_same_weights(weights(out), weights(tmp_path / "torch"))
    logs = [(d / "train_log.jsonl").read_text().splitlines() for d in (out, tmp_path / "torch")]
    assert [json.loads(r)["loss"] for r in logs[0]] == [json.loads(r)["loss"] for r in logs[1]]


def test_adamw_fused_is_what_a_cpu_run_updates_with_and_it_resumes_bit_for_bit(tmp_path, data_dir, monkeypatch):
    """``train.adamw: fused`` trains a CPU run with torch's fused AdamW (``auto``: foreach), whose weights are not the
    foreach run's bit for bit; the fused run resumed from its checkpoint before the last ends with the weights and
    losses of the same run trained straight."""
    built = []

    def recorded(model, tc, fused=False):
        opt = build_optimizer(model, tc, fused)
        built.append((tc.adamw, opt.defaults["fused"], opt.defaults["foreach"]))
        return opt

    monkeypatch.setattr(train_mod, "build_optimizer", recorded)
    fused, resumed = tmp_path / "fused", tmp_path / "resumed"
    config = write_config(tmp_path / "run.json", adamw="fused", ckpt_every=4)
    train(load_run_config(config), fused, data=str(data_dir))
    train(load_run_config(config), resumed, data=str(data_dir))
    shutil.rmtree(list_checkpoints(resumed / ".scratch")[0][1])  # back to the checkpoint before the last
    (resumed / "model.safetensors").unlink()
    assert train(load_run_config(config), resumed, data=str(data_dir), require_resume=True)["resumed_from_step"] == 12
    assert_same_weights(weights(fused), weights(resumed))
    logs = [(d / "train_log.jsonl").read_text().splitlines() for d in (fused, resumed)]
    assert [json.loads(r)["loss"] for r in logs[0]] == [json.loads(r)["loss"] for r in logs[1]]
    train(load_run_config(write_config(tmp_path / "auto.json")), tmp_path / "auto", data=str(data_dir))
    assert built == [("fused", True, None)] * 3 + [("auto", None, True)]
    auto, mine = weights(tmp_path / "auto"), weights(fused)
    assert any(not torch.equal(auto[k], mine[k]) for k in auto)
    for k in auto:  # the same training, rounded differently
        torch.testing.assert_close(mine[k], auto[k], rtol=0.05, atol=2e-3)


def torch_adamw_optimizer(model, tc, fused=False):
    """torch.optim.AdamW itself over mohge's parameter groups, each with every hyperparameter mohge's sets."""
    return torch.optim.AdamW([dict(g) for g in build_optimizer(model, tc, fused).param_groups])


def test_nan_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(tmp_path, data_dir, monkeypatch, caplog):
    real = train_mod.compute_loss

    def poisoned(model, x, y, cfg, step):
        total, lm, aux, layers = real(model, x, y, cfg, step)
        return (total * math.nan if step == 6 else total), lm, aux, layers

    monkeypatch.setattr(train_mod, "compute_loss", poisoned)
    config = write_config(tmp_path / "run.json")
    out = tmp_path / "out"
    with pytest.raises(NonFiniteLossError, match=r"step 6\b.*last good checkpoint: .*step_00000004"):
        train(load_run_config(config), out, data=str(data_dir))
    assert [s for s, _ in list_checkpoints(out / ".scratch")] == [4]
    assert find_latest_valid(out / ".scratch")[0].name == "step_00000004"
    assert not (out / "model.safetensors").exists()
    # the command line exits non-zero (3) and logs the step
    code = train_mod.main(["--config", str(config), "--out", str(out), "--data", str(data_dir)])
    assert code == 3
    assert "non-finite loss at step 6" in caplog.text


def test_require_resume_without_checkpoint_fails(tmp_path, data_dir):
    code = train_mod.main(
        [
            "--config",
            str(write_config(tmp_path / "run.json")),
            "--out",
            str(tmp_path / "o"),
            "--data",
            str(data_dir),
            "--require-resume",
        ]
    )
    assert code == 2


def test_resume_refuses_another_config(tmp_path, data_dir):
    out = tmp_path / "out"
    train(load_run_config(write_config(tmp_path / "a.json", steps=8)), out, data=str(data_dir))
    cfg = RunConfig.from_dict({**run_config(steps=8), "loss": {"group_aux_coeff": 0.5}})
    with pytest.raises(ValueError, match="loss.group_aux_coeff"):
        train(cfg, out, data=str(data_dir))


@pytest.mark.multiprocess
def test_ddp_two_cpu_processes(tmp_path, data_dir):
    config = write_config(tmp_path / "run.json", steps=4, ckpt_every=2, log_every=2)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "mohge.train",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "o"),
        "--data",
        str(data_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens_trained"] == 4 * 8 * 32 * 2


def test_unwritable_output_is_refused_before_any_step(tmp_path, data_dir, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cfg = load_run_config(write_config(tmp_path / "run.json"))
    monkeypatch.setattr(train_mod, "setup_runtime", lambda *a: pytest.fail("got past the output checks"))
    with pytest.raises(ConfigError, match=r"--out .*a_file/out is not writable"):
        train(cfg, blocker / "out", tmp_path / "scratch", data=str(data_dir))
    with pytest.raises(ConfigError, match=r"--scratch .*a_file/scratch is not writable"):
        train(cfg, tmp_path / "out", blocker / "scratch", data=str(data_dir))
    assert train_mod.main(["--config", str(tmp_path / "run.json"), "--out", str(blocker / "o")]) == 2


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, data_dir, caplog):
    config = write_config(tmp_path / "run.json", steps=4)
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out.mkdir()
        lock = {"pid": holder.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00"}
        (out / ".mohge.lock").write_text(json.dumps(lock))
        code = train_mod.main(["--config", str(config), "--out", str(out), "--data", str(data_dir)])
        assert code == 5
        assert f"is being written by pid {holder.pid} on {socket.gethostname()}" in caplog.text
        assert not (out / ".scratch" / "step_00000004").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and taken over
    assert train_mod.main(["--config", str(config), "--out", str(out), "--data", str(data_dir)]) == 0
    assert "taking over the stale lock" in caplog.text and not (out / ".mohge.lock").exists()


class Stop(Exception):
    pass


def test_log_rebuilt_exactly_on_resume_with_whole_windows(tmp_path, data_dir, monkeypatch):
    # checkpoints every 3 steps, rows every 4: the resume point (step 6) falls inside the window 4..7
    straight = tmp_path / "straight"
    config = load_run_config(write_config(tmp_path / "run.json", steps=12, ckpt_every=3, log_every=4))
    train(config, straight, data=str(data_dir))
    real = train_mod.compute_loss

    def stop_at_7(model, x, y, cfg, step):
        if step == 7:
            raise Stop
        return real(model, x, y, cfg, step)

    resumed = tmp_path / "resumed"
    monkeypatch.setattr(train_mod, "compute_loss", stop_at_7)
    with pytest.raises(Stop):
        train(config, resumed, data=str(data_dir))
    monkeypatch.setattr(train_mod, "compute_loss", real)
    with open(resumed / ".scratch" / "train_log.jsonl", "a") as fh:  # a row of a step past the checkpoint
        fh.write(json.dumps({"step": 7, "loss": 0.0}) + "\n")
    assert train(config, resumed, data=str(data_dir), require_resume=True)["resumed_from_step"] == 6

    def rows(folder):
        timing = ("tokens_per_s",)
        return [{k: v for k, v in json.loads(r).items() if k not in timing} for r in open(folder / "train_log.jsonl")]

    assert [r["step"] for r in rows(resumed)] == [3, 7, 11]
    assert rows(resumed) == rows(straight)


def test_disk_full_mid_checkpoint_exits_4_and_keeps_the_previous_checkpoint(tmp_path, data_dir, monkeypatch, caplog):
    import errno

    from mohge.train import checkpoint as ckpt

    real = ckpt.write_bytes_atomic

    def full_disk(path, data):
        if Path(path).name == "state.pt" and ".tmp-step_00000008" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(ckpt, "write_bytes_atomic", full_disk)
    config = write_config(tmp_path / "run.json")
    out = tmp_path / "out"
    assert train_mod.main(["--config", str(config), "--out", str(out), "--data", str(data_dir)]) == 4
    assert "No space left on device (ENOSPC): " in caplog.text and "state.pt" in caplog.text
    scratch = out / ".scratch"
    assert [s for s, _ in list_checkpoints(scratch)] == [4]
    assert not list(scratch.glob(".tmp-*")), "the half-written checkpoint folder was left behind"
    assert ckpt.load_checkpoint(scratch / "step_00000004")["step"] == 4
    monkeypatch.setenv("MOHGE_DEBUG", "1")
    with pytest.raises(OSError, match="No space left"):
        train_mod.main(["--config", str(config), "--out", str(tmp_path / "o2"), "--data", str(data_dir)])


def test_the_selection_bias_trains_and_resumes_with_the_weights(tmp_path, data_dir):
    """docs/method.md §5.6: the bias moves during training, is part of the saved model, and a run resumed from a
    checkpoint continues it (H0 'the bias is lost on resume' fails when the weights of both runs agree)."""
    run = run_config(steps=8, ckpt_every=4, keep_checkpoints=3)
    run["model"]["router"] = {**run["model"]["router"], "expert_bias_rate": 1e-2}
    cfg = RunConfig.from_dict(run)
    straight = tmp_path / "straight"
    train(cfg, straight, data=str(data_dir))
    final = weights(straight)
    bias = [k for k in final if k.endswith("router.expert_bias_E")]
    assert len(bias) == 2 and all(final[k].abs().sum() > 0 for k in bias)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight / ".scratch" / "step_00000004", resumed / ".scratch" / "step_00000004")
    train(cfg, resumed, data=str(data_dir), require_resume=True)
    assert_same_weights(final, weights(resumed))


def test_the_group_bias_trains_and_is_saved_with_the_weights(tmp_path, data_dir):
    """docs/method.md §5.7: H0 'the group bias never moves in training' fails when the saved bias is non-zero."""
    run = run_config(steps=4)
    run["model"]["router"] = {**run["model"]["router"], "group_bias_rate": 1e-2}
    train(RunConfig.from_dict(run), tmp_path / "o", data=str(data_dir))
    final = weights(tmp_path / "o")
    bias = [k for k in final if k.endswith("router.group_bias_G")]
    assert len(bias) == 2 and all(final[k].abs().sum() > 0 for k in bias)
    assert not any(k.endswith("router.expert_bias_E") for k in final)


def test_progress_off_a_terminal_is_whole_lines(monkeypatch):
    """A SLURM log (stderr not a terminal) gets the progress as newline-separated lines, not one line of
    carriage-return redraws; a terminal keeps tqdm's redrawn line."""
    import io
    from types import SimpleNamespace

    log = io.StringIO()  # isatty() is False
    monkeypatch.setattr(sys, "stderr", log)
    cfg = RunConfig.from_dict(tiny_run(train={"steps": 4, "warmup_steps": 1}))
    with train_mod._progress_bar(cfg, SimpleNamespace(main=True), 0) as bar:
        for _ in range(4):
            bar.update(1)
        bar.set_postfix({"loss": 1.5}, refresh=False)  # as the trainer sets a log row's
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n"), repr(text)
    lines = text.splitlines()  # the start and the end: the steps between fall inside one 30 s interval
    assert len(lines) == 2 and lines[0].startswith(f"{cfg.name}:") and "0/4" in lines[0]
    assert "4/4" in lines[1] and "loss=1.5" in lines[1]
