"""The hf source streamed from local multi-file datasets (jsonl, parquet): shards byte-identical whether one
process or three prepare them; held-out splits by document hash, disjoint and stable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mohge.data import DataConfig, prepare, read_split
from mohge.data.hf import holdout_split, holdout_u
from mohge.data.tokenizer import EOT_ID

datasets = pytest.importorskip("datasets")

WORDS = "the a of river stone light quickly sees under seven old bright field north we they carry".split()
N_FILES, DOCS_PER_FILE = 6, 40


def doc_text(i: int) -> str:
    rng = np.random.default_rng(i)
    return " ".join(WORDS[k] for k in rng.integers(0, len(WORDS), size=int(rng.integers(5, 60)))) + f". Doc {i}."


def write_corpus(folder: Path, fmt: str) -> str:
    """N_FILES files of DOCS_PER_FILE documents with an `id` column; one blank document; a duplicate text."""
    folder.mkdir(parents=True)
    for f in range(N_FILES):
        rows = [{"id": f"doc-{f}-{k}", "text": doc_text(f * DOCS_PER_FILE + k)} for k in range(DOCS_PER_FILE)]
        if f == 2:
            rows[5]["text"] = "  "  # skipped
            rows[6]["text"] = rows[7]["text"]  # an exact duplicate: both land in the same split
        if fmt == "json":
            (folder / f"part-{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            datasets.Dataset.from_list(rows).to_parquet(str(folder / f"part-{f}.parquet"))
    return str(folder / ("*.jsonl" if fmt == "json" else "*.parquet"))


def config(pattern: str, fmt: str, **kw) -> DataConfig:
    base = {
        "source": "hf",
        "hf_name": fmt,
        "hf_data_files": [pattern],
        "hf_splits": {"train": "train"},
        "val_fraction": 0.15,
        "test_fraction": 0.1,
        "vocab_size": 300,
        "seq_len": 16,
        "num_shards": 3,
    }
    return DataConfig.from_dict({**base, **kw})


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").glob("*.bin"))}


def run_cli_steps(cfg: DataConfig, out: Path) -> None:
    """The workflow's jobs: tokenizer, the shard jobs as separate processes at once, gather."""
    cfg_file = out.parent / f"{out.name}.data.json"
    cfg_file.write_text(json.dumps({"data": cfg.to_dict()}))
    base, args = [sys.executable, "-m", "mohge.data"], ["--config", str(cfg_file), "--out", str(out)]
    subprocess.run([*base, "tokenizer", *args], check=True, capture_output=True)
    cmds = [[*base, "shard", "--index", str(i), *args] for i in range(cfg.num_shards)]
    jobs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    errors = [j.communicate()[1].decode()[-2000:] for j in jobs]
    assert [j.returncode for j in jobs] == [0] * cfg.num_shards, errors
    subprocess.run([*base, "gather", *args], check=True, capture_output=True)


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_one_process_and_three_processes_write_identical_shards(fmt, tmp_path):
    pattern = write_corpus(tmp_path / "corpus", fmt)
    cfg = config(pattern, fmt)
    one = prepare(cfg, tmp_path / "one")  # every job in this process, one after the other
    if fmt == "json":  # the workflow's way: separate commands, the three shard jobs at once
        run_cli_steps(cfg, tmp_path / "three")
    else:  # python -m mohge.data --procs 3: the shard jobs in three worker processes
        prepare(cfg, tmp_path / "three", procs=3)
    three = json.loads((tmp_path / "three" / "meta.json").read_text())
    assert three == one
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "three")
    assert len(shard_bytes(tmp_path / "one")) == 3 * 3
    for s in ("val", "test"):
        assert (tmp_path / "one" / f"{s}_docs.jsonl").read_bytes() == (
            tmp_path / "three" / f"{s}_docs.jsonl"
        ).read_bytes()
    # every job read only its own files: 2 of the 6 each, so its shards hold only their documents
    train_docs = sum(e["docs"] for s in ("train", "val", "test") for e in one["shards"][s])
    assert train_docs == N_FILES * DOCS_PER_FILE - 1  # the blank document is skipped
    per_job = [sum(one["shards"][s][i]["docs"] for s in ("train", "val", "test")) for i in range(3)]
    assert per_job == [2 * DOCS_PER_FILE, 2 * DOCS_PER_FILE - 1, 2 * DOCS_PER_FILE]
    assert one["split"]["method"] == "doc_hash" and one["split"]["carved"] == ["val", "test"]
    assert one["split"]["source_splits"] == {"train": "train"}


def split_texts(out: Path) -> dict[str, list[str]]:
    """Every split's documents, decoded from the shards (EOT-separated) through the tokenizer."""
    from mohge.data.tokenizer import decode, load_tokenizer

    tok = load_tokenizer(out / "tokenizer.json")
    texts = {}
    for s in ("train", "val", "test"):
        ids = read_split(out, s)
        ends = np.flatnonzero(ids == EOT_ID)
        starts = np.concatenate([[0], ends[:-1] + 1])
        texts[s] = [decode(tok, ids[a:b].tolist()) for a, b in zip(starts, ends, strict=True)]
    return texts


def test_hash_split_is_disjoint_stable_and_independent_of_the_shard_count(tmp_path):
    pattern = write_corpus(tmp_path / "corpus", "json")
    runs = {
        "n3": config(pattern, "json"),
        "n3_again": config(pattern, "json"),
        "n1": config(pattern, "json", num_shards=1),
        "n4": config(pattern, "json", num_shards=4),  # 6 files over 4 jobs: 2, 2, 1, 1
    }
    for name, cfg in runs.items():
        prepare(cfg, tmp_path / name)
    texts = {name: split_texts(tmp_path / name) for name in runs}
    assert texts["n3"] == texts["n3_again"]  # a rerun
    for name in ("n1", "n4"):
        for s in ("train", "val", "test"):
            assert sorted(texts[name][s]) == sorted(texts["n3"][s]), (name, s)
    t = texts["n3"]
    assert not set(t["train"]) & set(t["val"]) and not set(t["train"]) & set(t["test"])
    assert not set(t["val"]) & set(t["test"])
    n = sum(len(v) for v in t.values())
    assert 0.05 < len(t["val"]) / n < 0.25 and 0.03 < len(t["test"]) / n < 0.2
    # the split is the documented function of the text (no hf_id_field) ...
    assert all(holdout_split(x, 0, 0.15, 0.1) == s for s in t for x in t[s])
    # ... and of the seed
    prepare(config(pattern, "json", seed=1), tmp_path / "seed1")
    other = split_texts(tmp_path / "seed1")
    assert sorted(other["val"]) != sorted(t["val"])


def test_hash_split_by_id_field_and_held_out_docs_records(tmp_path):
    pattern = write_corpus(tmp_path / "corpus", "json")
    meta = prepare(config(pattern, "json", hf_id_field="id", eval_docs_max=3), tmp_path / "o")
    assert meta["split"]["key"] == "id"
    records = [json.loads(x) for x in (tmp_path / "o" / "val_docs.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(holdout_split(r["id"], 0, 0.15, 0.1) == "val" for r in records)
    assert set(meta["docs"]["val"]) >= {r["id"] for r in records}


def test_holdout_u_is_uniform_enough_and_fixed():
    us = np.array([holdout_u(f"document {i}", 0) for i in range(20000)])
    assert abs(us.mean() - 0.5) < 0.01 and 0.0 <= us.min() and us.max() < 1.0
    assert holdout_u("fineweb", 0) == holdout_u("fineweb", 0) != holdout_u("fineweb", 1)
    # pinned: a change of the hash would silently move documents between train and the held-out splits
    assert holdout_u("fineweb", 0) == pytest.approx(0.43031304220274913, abs=1e-15)
    assert holdout_u("", 0) == pytest.approx(0.8943794394498068, abs=1e-15)


def test_a_source_split_smaller_than_the_job_count_is_read_by_row(tmp_path):
    """One file for three jobs: IterableDataset.shard cannot cut it; every job keeps rows i mod 3."""
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": doc_text(i)}) + "\n" for i in range(30)))
    cfg = config(str(folder / "a.jsonl"), "json", val_fraction=0.0, test_fraction=0.0)
    meta = prepare(cfg, tmp_path / "o")
    assert [e["docs"] for e in meta["shards"]["train"]] == [10, 10, 10]
    assert meta["tokens"]["val"] == 0 and len(meta["shards"]["val"]) == 3


def test_missing_column_and_unmatched_files_are_named(tmp_path):
    from mohge.config import ConfigError

    pattern = write_corpus(tmp_path / "corpus", "json")
    with pytest.raises(ConfigError, match=r"data.hf_text_field='content': split 'train' has columns \['id', 'text'\]"):
        prepare(config(pattern, "json", hf_text_field="content"), tmp_path / "o")
    with pytest.raises(ConfigError, match=r"data.hf_id_field='uid'"):
        prepare(config(pattern, "json", hf_id_field="uid"), tmp_path / "o")
    with pytest.raises(ConfigError, match=r"data.hf_data_files='.*nothing-\*.jsonl': matches no file"):
        prepare(config(str(tmp_path / "nothing-*.jsonl"), "json"), tmp_path / "o")


def test_a_data_job_whose_hf_local_path_is_gone_is_refused_in_one_line(tmp_path):
    """A path that existed at plan time and is gone when the data job runs: the key, not load_from_disk's traceback."""
    from mohge.config import ConfigError

    cfg = DataConfig.from_dict({"source": "hf", "hf_local_path": str(tmp_path / "gone"), "vocab_size": 300})
    with pytest.raises(ConfigError, match=r"^data\.hf_local_path='.*gone': no such folder"):
        prepare(cfg, tmp_path / "o")
