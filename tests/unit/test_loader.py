"""The loader over many shards (mohge.data.loader, TokenStream.open, TrainBatches): format versions 1 and 2 read
the same token stream; sequential order gives disjoint rank streams that cover every epoch once; the position is
checkpointed and resume is exact mid-shard; a tampered shard is refused with its name."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_run
from safetensors.torch import load_file
from shard_support import reshard, write_shards

from mohge.config import ConfigError, RunConfig
from mohge.data import DataConfig, TokenStream, prepare
from mohge.data.loader import ShardedArray, WindowOrder, verify_folder
from mohge.data.stream import TrainBatches
from mohge.model import LanguageModel
from mohge.train import trainer as train_mod
from mohge.train.checkpoint import load_checkpoint
from mohge.train.distributed.trainer import rank_stream
from mohge.train.heldout import heldout_loss
from mohge.train.trainer import train

DATA = {"source": "graded", "vocab_size": 300, "seq_len": 32, "graded_num_docs": 200}
S = DATA["seq_len"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loader")
    prepare(DataConfig.from_dict(DATA), root / "one")
    reshard(root / "one", root / "twelve", 12)  # about 2,450 train tokens, 76 windows of 32, per shard
    return {"one": root / "one", "twelve": root / "twelve"}


def copy_of(folder: Path, tmp_path: Path) -> Path:
    shutil.copytree(folder, tmp_path / "data")
    return tmp_path / "data"


# ------------------------------------------------------------------------------------------------
# Reading: format versions 1 and 2, the sharded array
# ------------------------------------------------------------------------------------------------


def test_one_and_twelve_shards_read_the_same_stream_and_the_same_random_batches(folders):
    meta = json.loads((folders["twelve"] / "meta.json").read_text())
    assert meta["format_version"] == 2 and len(meta["shards"]["train"]) == 12
    for split in ("train", "val", "test"):
        a, b = TokenStream.open(folders["one"], split), TokenStream.open(folders["twelve"], split, verify=True)
        assert isinstance(a.tokens, np.memmap) and isinstance(b.tokens, ShardedArray)
        assert len(a) == len(b) == meta["tokens"][split]
        assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        assert np.array_equal(np.asarray(a.levels), np.asarray(b.levels))
        for (xa, ya, la), (xb, yb, lb) in zip(
            a.iter_eval_batches(4, S, with_levels=True), b.iter_eval_batches(4, S, with_levels=True), strict=True
        ):
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(la, lb)
    # random order is today's draws over the split's whole token stream, whatever its sharding
    a, b = TokenStream.open(folders["one"], "train"), TokenStream.open(folders["twelve"], "train")
    for step in (0, 7, 123):
        for xa, xb in zip(a.get_batch(step, 8, S, 1001), b.get_batch(step, 8, S, 1001), strict=True):
            assert torch.equal(xa, xb)
    # and so are the distributed trainer's per-rank parts of it (random order)
    for r in range(3):
        ra, rb = rank_stream(a, r, 3, S), rank_stream(b, r, 3, S)
        for xa, xb in zip(ra.get_batch(5, 8, S, 1000 + r), rb.get_batch(5, 8, S, 1000 + r), strict=True):
            assert torch.equal(xa, xb)


def test_sharded_array_indexing_across_parts():
    parts = [np.arange(0, 5), np.arange(5, 5), np.arange(5, 12), np.arange(12, 13)]
    arr = ShardedArray(parts)
    assert len(arr) == 13 and arr[6] == 6 and arr[-1] == 12
    idx = np.array([[0, 4, 5, 11], [12, 3, 6, 7]])
    assert np.array_equal(arr[idx], idx)
    assert np.array_equal(np.asarray(arr[3:9]), np.arange(3, 9)) and isinstance(arr[3:9], ShardedArray)
    assert isinstance(arr[6:9], np.ndarray) and np.array_equal(arr[6:9], [6, 7, 8])
    with pytest.raises(IndexError):
        arr[np.array([13])]


# ------------------------------------------------------------------------------------------------
# Sequential order
# ------------------------------------------------------------------------------------------------


def all_windows(shard_tokens: list[int], seq_len: int) -> set[int]:
    """Every window start of an epoch, computed directly: offsets 0, S, 2S, ... with S + 1 tokens in the shard."""
    bases = np.cumsum([0, *shard_tokens])
    return {int(bases[i]) + k * seq_len for i, n in enumerate(shard_tokens) for k in range(max(0, (n - 1) // seq_len))}


@pytest.mark.parametrize(("world", "batch"), [(1, 5), (3, 2), (4, 3)])
def test_rank_streams_are_disjoint_and_cover_every_epoch_once(tmp_path, world, batch):
    shard_tokens = [101, 0, 40, 7, 250, 64]  # an empty shard and one too short for a window
    seq = 8
    tokens = np.arange(sum(shard_tokens), dtype=np.uint16)  # a token is its own position: x[0] is the start
    bounds = np.cumsum([0, *shard_tokens])
    write_shards(tmp_path, {"train": [tokens[bounds[i] : bounds[i + 1]] for i in range(len(shard_tokens))]})
    stream = TokenStream.open(tmp_path, "train")
    want = all_windows(shard_tokens, seq)
    per_epoch = stream.window_order(seq, 3).per_epoch
    assert per_epoch == len(want) == 12 + 4 + 31 + 7
    readers = [TrainBatches(stream, "sequential", batch, seq, 3, r, world) for r in range(world)]
    seen: dict[int, list[int]] = {}  # global window index -> start, over every rank
    steps = -(-3 * per_epoch // (batch * world))  # three epochs
    for s in range(steps):
        for r, reader in enumerate(readers):
            x, y = reader.batch(s)
            assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(x[:, 1:], x[:, :-1] + 1)  # one shard each
            first = reader.window_at(s) + r * batch
            for j in range(batch):
                assert first + j not in seen
                seen[first + j] = int(x[j, 0])
    assert sorted(seen) == list(range(steps * batch * world))  # no index skipped, none read twice
    orders = []
    for epoch in range(3):
        starts = [seen[g] for g in range(epoch * per_epoch, (epoch + 1) * per_epoch)]
        assert len(set(starts)) == per_epoch and set(starts) == want
        orders.append(starts)
    assert orders[0] != orders[1] or orders[1] != orders[2]  # shards permuted per epoch by the seed
    pos = readers[0].position(steps)
    assert pos["order"] == "sequential" and pos["window"] == steps * batch * world
    assert pos["epoch"] == pos["window"] // per_epoch and pos["shard"].startswith("shards/train-")


def test_window_order_is_a_pure_function_and_refuses_a_split_without_a_window():
    a, b = WindowOrder([50, 70, 90], 8, seed=1), WindowOrder([50, 70, 90], 8, seed=1)
    assert [b.locate(g) for g in reversed(range(60))][::-1] == [a.locate(g) for g in range(60)]
    assert a.position(0)["offset"] == 0 and a.position(1)["offset"] == 8
    with pytest.raises(ConfigError, match="data.seq_len=64"):
        WindowOrder([10, 64], 64, seed=0)


# ------------------------------------------------------------------------------------------------
# Training: position in the checkpoint, exact resume mid-shard
# ------------------------------------------------------------------------------------------------


def run_config(**train) -> dict:
    return tiny_run(
        train={"steps": 12, "batch_size": 8, "grad_accum": 2, "warmup_steps": 2, "log_every": 2, **train}, data=DATA
    )


def test_sequential_resume_mid_shard_is_bit_identical(folders, tmp_path):
    run = run_config(data_order="sequential", ckpt_every=4, keep_checkpoints=3)
    straight = tmp_path / "straight"
    train(RunConfig.from_dict(run), straight, data=str(folders["twelve"]))
    scratch = straight / ".scratch"
    data4 = load_checkpoint(scratch / "step_00000004")["data"]
    order = TokenStream.open(folders["twelve"], "train").window_order(S, 0)
    per_epoch = order.per_epoch
    assert data4["order"] == "sequential" and data4["window"] == 4 * 8 and data4["windows_per_epoch"] == per_epoch
    assert data4["offset"] == 32 * S and data4["shard"].startswith("shards/train-")  # mid-shard
    rows = [json.loads(line) for line in (straight / "train_log.jsonl").read_text().splitlines()]
    assert [r["data"]["window"] for r in rows if "loss" in r] == [16 * k for k in range(1, 7)]
    assert len({r["data"]["shard"] for r in rows if "loss" in r}) == 2  # the run crosses a shard boundary
    # a run resumed from the step-4 checkpoint reads the windows the uninterrupted one read
    resumed = tmp_path / "resumed"
    shutil.copytree(scratch / "step_00000004", resumed / ".scratch" / "step_00000004")
    summary = train(RunConfig.from_dict(run), resumed, data=str(folders["twelve"]), require_resume=True)
    assert summary["resumed_from_step"] == 4
    assert summary["data_position"] == {"order": "sequential", **order.position(12 * 8), "windows_per_epoch": per_epoch}
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    tail = [json.loads(line) for line in (resumed / "train_log.jsonl").read_text().splitlines()]
    assert [(r["loss"], r["data"]) for r in tail] == [(r["loss"], r["data"]) for r in rows if r["step"] >= 4]
    # and another order of batches is another trajectory: the windows do matter
    other = tmp_path / "random"
    train(RunConfig.from_dict(run_config(ckpt_every=4)), other, data=str(folders["twelve"]))
    assert not torch.equal(load_file(other / "model.safetensors")["embed.weight"], a["embed.weight"])


def test_random_order_checkpoint_keeps_the_step_and_old_checkpoints_resume(folders, tmp_path):
    run = run_config(steps=4, ckpt_every=2)
    out = tmp_path / "out"
    train(RunConfig.from_dict(run), out, data=str(folders["one"]))
    state = load_checkpoint(out / ".scratch" / "step_00000004")
    assert state["data"] == {"order": "random", "step": 4}
    # a checkpoint written before train.data_order existed resumes as random order
    saved = json.loads((out / ".scratch" / "step_00000004" / "config.json").read_text())
    del saved["train"]["data_order"]
    from mohge.train.checkpoint import check_same_run, resolved_config

    check_same_run(saved, resolved_config(RunConfig.from_dict(run)), out)
    with pytest.raises(ConfigError, match="train.data_order"):
        check_same_run(saved, resolved_config(RunConfig.from_dict(run_config(data_order="sequential"))), out)


# ------------------------------------------------------------------------------------------------
# Refusals: a tampered shard is named
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_tampered_shard_is_refused_naming_it(folders, tmp_path, damage, caplog):
    data = copy_of(folders["twelve"], tmp_path)
    shard = data / "shards" / "train-00005.bin"
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
    else:
        raw = raw[:-2]  # one whole token less
    shard.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"shards/train-00005\.bin was changed or truncated"):
        verify_folder(data, tmp_path / "verified.json")
    if damage == "truncate":  # the size is checked on every open, hashed or not
        with pytest.raises(ConfigError, match=r"train-00005\.bin was changed or truncated: \d+ bytes, meta.json"):
            TokenStream.open(data, "train")
    config = tmp_path / "run.json"
    config.write_text(json.dumps(run_config(steps=3, data_order="sequential")))
    argv = ["--config", str(config), "--out", str(tmp_path / "out"), "--data", str(data)]
    assert train_mod.main(argv) == 2  # one line, exit 2
    assert "shards/train-00005.bin was changed or truncated" in caplog.text
    assert not list((tmp_path / "out" / ".scratch").glob("step_*"))


def test_evaluation_refuses_a_changed_val_shard(folders, tmp_path):
    data = copy_of(folders["twelve"], tmp_path)
    cfg = RunConfig.from_dict(run_config())
    model = LanguageModel(cfg.model, cfg.loss)
    assert heldout_loss(model, data, "val", 4, S, 2)["tokens"] > 0
    shard = data / "shards" / "val-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0x02
    shard.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"shards/val-00001\.bin was changed or truncated: sha256"):
        heldout_loss(model, data, "val", 4, S, 2)


def test_meta_that_does_not_add_up_is_refused(folders, tmp_path):
    data = copy_of(folders["twelve"], tmp_path)
    meta = json.loads((data / "meta.json").read_text())
    meta["tokens"]["test"] += 1
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="the shards of 'test' hold"):
        TokenStream.open(data, "test")
    meta["format_version"] = 3
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="format_version=3"):
        TokenStream.open(data, "train")


def test_traces_read_every_test_shard(folders):
    from mohge.evaluate.traces import collect_trace

    cfg = RunConfig.from_dict(run_config())
    torch.manual_seed(0)
    model = LanguageModel(cfg.model, cfg.loss).eval()
    one, _ = collect_trace(model, cfg, folders["one"], "test", batch_size=4)
    many, _ = collect_trace(model, cfg, folders["twelve"], "test", batch_size=4)
    assert len(json.loads((folders["twelve"] / "meta.json").read_text())["shards"]["test"]) > 1
    assert one == many  # the same tokens and levels, so the same routing counts
