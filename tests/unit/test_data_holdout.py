"""Held-out splits by token count (data.val_tokens / test_tokens, mohge.data.holdout) on a local multi-file
dataset read in streaming mode: the targets met exactly as defined, shards and meta identical whatever the number
of processes, carved shards identical whatever the shard count, splits disjoint, a too-small bound refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from test_data_hf import config, run_cli_steps, shard_bytes, write_corpus

from mohge.config import ConfigError, DataConfig
from mohge.data import main, prepare, read_split
from mohge.data.hf import holdout_u
from mohge.data.tokenizer import decode, load_tokenizer

pytest.importorskip("datasets")
TARGETS = {"val_tokens": 500, "test_tokens": 300, "holdout_candidate_fraction": 0.3}


def split_docs(out: Path) -> dict[str, list[tuple[str, int]]]:
    """(text, tokens with its EOT) of every document of every split, in stream order, decoded from the shards."""
    meta = json.loads((out / "meta.json").read_text())
    tok = load_tokenizer(out / "tokenizer.json")
    docs = {}
    for s in ("train", "val", "test"):
        ids = read_split(out, s)
        ends = np.flatnonzero(ids == meta["eot_id"])
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(int)
        docs[s] = [(decode(tok, ids[a:b].tolist()), int(b - a + 1)) for a, b in zip(starts, ends, strict=True)]
    return docs


def in_u_order(docs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The documented order: u, then sha256 of the text."""
    return sorted(docs, key=lambda d: (holdout_u(d[0], 0), hashlib.sha256(d[0].encode()).digest()[:8]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_corpus(tmp_path_factory.mktemp("holdout") / "corpus", "json")


@pytest.fixture(scope="module")
def carved3(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("carved3") / "o"
    prepare(config(corpus, "json", **TARGETS), out)
    return out


def test_val_is_the_shortest_u_prefix_reaching_val_tokens_and_test_the_next(carved3):
    docs = split_docs(carved3)
    meta = json.loads((carved3 / "meta.json").read_text())
    everything = in_u_order([d for s in docs for d in docs[s]])
    # val, then test, are consecutive runs of the corpus in u order, each in that order in its shard
    n_val, n_test = len(docs["val"]), len(docs["test"])
    assert docs["val"] == everything[:n_val]
    assert docs["test"] == everything[n_val : n_val + n_test]
    val_tokens = sum(t for _, t in docs["val"])
    test_tokens = sum(t for _, t in docs["test"])
    assert meta["tokens"]["val"] == val_tokens >= 500 and meta["tokens"]["test"] == test_tokens >= 300
    # shortest: without its last document the prefix would not reach the target (no u ties at these ends)
    assert val_tokens - docs["val"][-1][1] < 500 and test_tokens - docs["test"][-1][1] < 300
    rec = meta["split"]
    assert rec["method"] == "doc_hash_tokens" and rec["val_tokens"] == 500 and rec["test_tokens"] == 300
    assert rec["tokens_obtained"] == {"val": val_tokens, "test": test_tokens}
    u = {s: [holdout_u(x, 0) for x, _ in docs[s]] for s in docs}
    t_val, t_test = rec["u_thresholds"]["val"], rec["u_thresholds"]["test"]
    assert max(u["val"]) < t_val <= min(u["test"]) and max(u["test"]) < t_test <= min(u["train"])
    # every candidate not held out went back to train, as one more shard listed like any other
    train = meta["shards"]["train"]
    assert [e["file"] for e in train] == [f"shards/train-{i:05d}.bin" for i in range(4)]
    assert train[3]["tokens"] == rec["returned_to_train"]["tokens"] > 0
    assert rec["candidate_tokens"] == val_tokens + test_tokens + train[3]["tokens"]
    assert sum(1 for s in docs for _ in docs[s]) == 6 * 40 - 1  # no document lost or doubled
    # the held-out text for lm-eval is the carved documents, in u order
    lines = [json.loads(x) for x in (carved3 / "val_docs.jsonl").read_text().splitlines()]
    assert [r["text"] for r in lines] == [x for x, _ in docs["val"]]


def test_splits_are_disjoint_and_duplicates_stay_together(carved3):
    texts = {s: [x for x, _ in d] for s, d in split_docs(carved3).items()}
    assert not set(texts["train"]) & set(texts["val"]) and not set(texts["train"]) & set(texts["test"])
    assert not set(texts["val"]) & set(texts["test"])
    dup = [x for s in texts for x in texts[s] if sum(y == x for t in texts.values() for y in t) > 1]
    assert dup and len({s for s in texts for x in texts[s] if x == dup[0]}) == 1  # the corpus's duplicate


def test_one_and_three_processes_write_identical_shards_and_meta(corpus, carved3, tmp_path):
    run_cli_steps(config(corpus, "json", **TARGETS), tmp_path / "three")  # three shard processes at once
    assert json.loads((tmp_path / "three" / "meta.json").read_text()) == json.loads((carved3 / "meta.json").read_text())
    assert shard_bytes(tmp_path / "three") == shard_bytes(carved3)
    for s in ("val", "test"):
        assert (tmp_path / "three" / f"{s}_docs.jsonl").read_bytes() == (carved3 / f"{s}_docs.jsonl").read_bytes()


def test_carved_shards_do_not_depend_on_the_shard_count_nor_the_rerun(corpus, carved3, tmp_path):
    three = json.loads((carved3 / "meta.json").read_text())
    for n in (1, 4):  # 4 jobs over 6 files: 2, 2, 1, 1
        out = tmp_path / f"n{n}"
        meta = prepare(config(corpus, "json", **{**TARGETS, "num_shards": n}), out)
        for s in ("val", "test"):
            assert (out / f"shards/{s}-00000.bin").read_bytes() == (carved3 / f"shards/{s}-00000.bin").read_bytes()
            assert meta["shards"][s] == three["shards"][s]
        keep = ("u_thresholds", "tokens_obtained", "candidate_tokens", "candidate_docs", "returned_to_train")
        assert {k: meta["split"][k] for k in keep} == {k: three["split"][k] for k in keep}
        assert meta["tokens"] == three["tokens"]
        assert len(meta["shards"]["train"]) == n + 1
    again = prepare(config(corpus, "json", **TARGETS), tmp_path / "again")
    assert again == three and shard_bytes(tmp_path / "again") == shard_bytes(carved3)


def test_a_candidate_bound_too_small_is_refused_naming_the_key(corpus, tmp_path, caplog):
    cfg = config(corpus, "json", val_tokens=5000, test_tokens=3000, holdout_candidate_fraction=0.02)
    with pytest.raises(ConfigError, match=r"^data.holdout_candidate_fraction=0.02: its candidates \(u < 0.02\) hold"):
        prepare(cfg, tmp_path / "o")
    assert not (tmp_path / "o" / "meta.json").exists()
    # the gather step on the command line: one line, exit 2
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"data": cfg.to_dict()}))
    assert main(["gather", "--config", str(cfg_file), "--out", str(tmp_path / "o")]) == 2
    assert "data.holdout_candidate_fraction=0.02" in caplog.text and "val_tokens + test_tokens = 8000" in caplog.text
    with pytest.raises(ConfigError, match=r"data.val_tokens=50000: plus test_tokens=0 = 50000 exceeds the corpus"):
        prepare(config(corpus, "json", val_tokens=50000, holdout_candidate_fraction=0.99), tmp_path / "o")


def test_token_targets_are_refused_where_they_would_not_apply(corpus):
    with pytest.raises(ConfigError, match=r"data.val_tokens=10: holds out by token count only for source 'hf'"):
        DataConfig.from_dict({"source": "graded", "val_tokens": 10})
    with pytest.raises(ConfigError, match=r"data.holdout_candidate_fraction=0"):
        config(corpus, "json", val_tokens=10, holdout_candidate_fraction=0)


def test_a_split_the_dataset_gives_keeps_its_shards_and_refuses_a_target(tmp_path):
    import datasets

    rows = [{"text": f"document number {i} " * (1 + i % 7)} for i in range(60)]
    path = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:50]), "test": datasets.Dataset.from_list(rows[50:])}
    ).save_to_disk(str(path))
    base = {"source": "hf", "hf_local_path": str(path), "hf_splits": {"train": "train", "test": "test"}}
    base |= {"vocab_size": 300, "seq_len": 8, "num_shards": 2, "holdout_candidate_fraction": 0.5}
    meta = prepare(DataConfig.from_dict({**base, "val_tokens": 100}), tmp_path / "o")
    assert meta["split"]["carved"] == ["val"] and 100 <= meta["tokens"]["val"]
    assert [e["file"] for e in meta["shards"]["test"]] == ["shards/test-00000.bin", "shards/test-00001.bin"]
    assert meta["num_docs"]["test"] == 10
    with pytest.raises(ConfigError, match=r"data.test_tokens=50: the dataset gives its own test split"):
        prepare(DataConfig.from_dict({**base, "test_tokens": 50}), tmp_path / "p")


def test_jobs_without_candidates_are_merged_right(corpus, tmp_path):
    """Six jobs, one file each; jobs 0, 4, 5 hold no candidate (u < 0.0065), job 3 two: val, test and the
    returned train shard are the four documents of smallest u, read from the right offsets of the right files."""
    out = tmp_path / "o"
    cfg = config(corpus, "json", val_tokens=1, test_tokens=1, holdout_candidate_fraction=0.0065, num_shards=6)
    meta = prepare(cfg, out)
    parts = [json.loads((out / f"shards/part-{i:05d}.json").read_text()) for i in range(6)]
    assert [p["candidates"]["docs"] for p in parts] == [0, 1, 1, 2, 0, 0]
    docs = split_docs(out)  # (another tokenizer than carved3's: its sample lacks other candidates)
    everything = [x for x, _ in in_u_order([d for s in docs for d in docs[s]])]
    assert [x for x, _ in docs["val"]] == everything[:1] and [x for x, _ in docs["test"]] == everything[1:2]
    assert [x for x, _ in docs["train"][-2:]] == everything[2:4]  # the returned candidates, in u order
    assert meta["shards"]["train"][-1]["file"] == "shards/train-00006.bin"
    assert meta["split"]["returned_to_train"] == {"tokens": sum(t for _, t in docs["train"][-2:]), "docs": 2}
