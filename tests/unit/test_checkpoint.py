"""Checkpoints: atomic layout, manifests, checksum errors naming the file, fallback, pruning, RNG round trip."""

import json
import logging
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_run
from safetensors.torch import load_file

from mohge.config import RunConfig
from mohge.data import DataConfig, prepare
from mohge.train import checkpoint as ckpt
from mohge.train.trainer import train

RUN = tiny_run(
    model={"max_seq_len": 16, "ffn": {"dense_layers": 1}},
    train={"steps": 8, "warmup_steps": 2, "keep_checkpoints": 3, "log_every": 4},
)
DATA = RUN["data"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    prepare(DataConfig.from_dict(DATA), out)
    return out


def save_dummy(scratch: Path, step: int, keep: int = 5) -> Path:
    state = {"w": torch.arange(6, dtype=torch.float32).view(2, 3) + step}
    return ckpt.save_checkpoint(scratch, step, state, {"optimizer": {}, "rng": [ckpt.capture_rng()]}, {"a": 1}, keep)


def test_layout_manifest_and_round_trip(tmp_path):
    path = save_dummy(tmp_path, 7)
    assert path.name == "step_00000007"
    assert sorted(p.name for p in path.iterdir()) == sorted([*ckpt.FILES, ckpt.MANIFEST])
    manifest = ckpt.verify_checkpoint(path)
    assert manifest["step"] == 7 and set(manifest["files"]) == set(ckpt.FILES)
    assert not list(tmp_path.glob(".tmp-*"))
    loaded = ckpt.load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["config"] == {"a": 1}
    assert torch.equal(loaded["model"]["w"], torch.arange(6, dtype=torch.float32).view(2, 3) + 7)


def test_checksum_mismatch_names_file_and_both_hashes(tmp_path):
    path = save_dummy(tmp_path, 3)
    target = path / "state.pt"
    expected = json.loads((path / ckpt.MANIFEST).read_text())["files"]["state.pt"]["sha256"]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.verify_checkpoint(path)
    msg = str(err.value)
    assert str(target) in msg and expected in msg and ckpt.sha256_file(target) in msg
    with pytest.raises(ckpt.CheckpointError, match="state.pt"):
        ckpt.load_checkpoint(path)


def test_truncated_or_unfinished_saves_fall_back_to_previous_valid(tmp_path, caplog):
    good = save_dummy(tmp_path, 4)
    truncated = save_dummy(tmp_path, 8)
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:10])
    no_manifest = save_dummy(tmp_path, 12)
    (no_manifest / ckpt.MANIFEST).unlink()  # a folder whose manifest never got written
    (tmp_path / ".tmp-step_00000016-999").mkdir()  # a save killed before its rename
    with caplog.at_level(logging.WARNING):
        found, problems = ckpt.find_latest_valid(tmp_path)
    assert found == good
    assert "step_00000012/manifest.json is missing" in problems[0]
    assert "step_00000008/model.safetensors is corrupted" in problems[1] and "(10 bytes)" in problems[1]
    assert "falling back to the previous valid checkpoint" in caplog.text
    ckpt.remove_stale_temps(tmp_path)
    assert not list(tmp_path.glob(".tmp-*"))


def test_prune_keeps_newest(tmp_path):
    for step in (2, 4, 6, 8):
        save_dummy(tmp_path, step, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [8, 6]


def test_rng_round_trip():
    state = ckpt.capture_rng()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    ckpt.restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


def test_corrupted_newest_checkpoint_resumes_from_previous_bit_identically(tmp_path, data_dir, caplog):
    out = tmp_path / "out"
    cfg = RunConfig.from_dict(RUN)
    train(cfg, out, data=str(data_dir))
    reference = load_file(out / "model.safetensors")
    newest = out / ".scratch" / "step_00000008"
    blob = bytearray((newest / "model.safetensors").read_bytes())
    blob[-1] ^= 0x01
    (newest / "model.safetensors").write_bytes(bytes(blob))
    (out / "model.safetensors").unlink()
    with caplog.at_level(logging.WARNING):
        summary = train(cfg, out, data=str(data_dir), require_resume=True)
    assert "step_00000008/model.safetensors is corrupted" in caplog.text
    assert summary["resumed_from_step"] == 4
    resumed = load_file(out / "model.safetensors")
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    ckpt.verify_checkpoint(newest)  # the re-saved step 8 is valid again


def test_no_valid_checkpoint_starts_over_with_warning(tmp_path, data_dir, caplog):
    out = tmp_path / "out"
    cfg = RunConfig.from_dict(RUN)
    save_dummy(out / ".scratch", 4)
    (out / ".scratch" / "step_00000004" / "state.pt").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        summary = train(cfg, out, data=str(data_dir))
    assert summary["resumed_from_step"] == 0
    assert "step_00000004/state.pt is corrupted" in caplog.text
    assert "starting from scratch" in caplog.text
    shutil.rmtree(out / ".scratch")
    with pytest.raises(ckpt.CheckpointError, match="--require-resume"):
        train(cfg, out, data=str(data_dir), require_resume=True)


def test_load_trained_from_output_and_checkpoint(tmp_path, data_dir):
    out = tmp_path / "out"
    train(RunConfig.from_dict({**RUN, "train": {**RUN["train"], "steps": 4}}), out, data=str(data_dir))
    for folder in (out, out / ".scratch" / "step_00000004"):
        cfg, model = ckpt.load_trained(folder)
        assert cfg.name == "tiny" and not model.training
        logits = model(torch.zeros(1, 5, dtype=torch.long)).logits
        assert logits.shape == (1, 5, 300)


# ------------------------------------------------------------------------------------------------
# The final model folder is sealed by a manifest; tokenizer and token files are verified before training
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> Path:
    out = tmp_path_factory.mktemp("trained") / "model"
    train(RunConfig.from_dict(RUN), out, data=str(data_dir))
    return out


def test_final_folder_has_a_manifest_that_load_trained_checks(trained, tmp_path):
    from mohge.train.run_files import FINAL_FILES

    manifest = json.loads((trained / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(FINAL_FILES)
    assert manifest["files"]["model.safetensors"] == ckpt.sha256_file(trained / "model.safetensors")
    ckpt.verify_manifest(trained)
    ckpt.load_trained(trained)
    flipped = tmp_path / "flipped"
    shutil.copytree(trained, flipped)
    raw = bytearray((flipped / "model.safetensors").read_bytes())
    raw[-3] ^= 0x40  # an exponent bit of the last weight
    (flipped / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_trained(flipped)
    assert "model.safetensors is corrupted" in str(err.value) and "\n" not in str(err.value)
    (flipped / "manifest.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="manifest.json is missing"):
        ckpt.load_trained(flipped)


def test_evaluate_and_traces_refuse_a_tampered_model(trained, data_dir, tmp_path, caplog):
    from mohge.evaluate import suite as evaluate
    from mohge.evaluate import traces

    flipped = tmp_path / "flipped"
    shutil.copytree(trained, flipped)
    with open(flipped / "tokenizer.json", "a") as fh:
        fh.write(" ")
    args = ["--ckpt", str(flipped), "--data", str(data_dir), "--out", str(tmp_path / "m.json")]
    assert evaluate.main(args) == 2
    assert traces.main([*args[:4], "--out", str(tmp_path / "t")]) == 2
    assert caplog.text.count("tokenizer.json is corrupted") == 2


def test_broken_tokenizer_is_refused_before_training(data_dir, tmp_path):
    from mohge.config import ConfigError

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    text = (data / "tokenizer.json").read_text()
    (data / "tokenizer.json").write_text(text[: len(text) // 2])
    # meta.json seals tokenizer.json (size, sha256): the cut file is refused by its seal before it is parsed
    with pytest.raises(ConfigError, match=r"tokenizer\.json was changed or truncated: \d+ bytes, meta.json expects"):
        train(RunConfig.from_dict(RUN), tmp_path / "out", data=str(data))
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    assert not list((tmp_path / "out" / ".scratch").glob("step_*"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_changed_token_file_is_named_once_per_run(data_dir, tmp_path, damage):
    from mohge.config import ConfigError
    from mohge.data.loader import split_shards, verify_folder

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    verify_folder(data, tmp_path / "verified.json")
    # the first train shard: train.bin in format 1, shards/train-00000.bin in format 2
    shard = data / split_shards(data, json.loads((data / "meta.json").read_text()), "train")[0].file
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[100] ^= 0x01
    else:
        raw = raw[: len(raw) - 3]
    shard.write_bytes(bytes(raw))
    # the record in the scratch is keyed by each file's size, mtime and ctime: a changed file is hashed again
    with pytest.raises(ConfigError, match=re.escape(f"{shard.name} was changed or truncated")):
        verify_folder(data, tmp_path / "verified.json")
    with pytest.raises(ConfigError, match=re.escape(f"{shard.name} was changed or truncated")):
        train(RunConfig.from_dict(RUN), tmp_path / "out", data=str(data))
