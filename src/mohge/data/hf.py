"""The Hugging Face source, streamed: one shard job reads only its slice, held-out splits by document hash.

Three ways in, all read without loading a split into memory (docs/method.md §12):
  hub          `datasets.load_dataset(hf_name, hf_config, split=..., streaming=True)`
  data files   `datasets.load_dataset(hf_name, data_files=hf_data_files, streaming=True)`, hf_name a builder
               (json, parquet, csv, text); local files, no hub
  saved        `datasets.load_from_disk(hf_local_path)`: memory-mapped Arrow, sliced by row ranges

Slicing (job `index` of `num_shards`): a streamed split is cut with `IterableDataset.shard`, which hands every
job a contiguous block of the split's files (so a job never reads another job's files). A split with fewer
files than jobs cannot be cut by file; then every job reads it and keeps rows `row % num_shards == index`
(small splits only: a corpus big enough to need many jobs has many files). A saved dataset is cut into
contiguous row ranges (`Dataset.shard(contiguous=True)`).

Held-out splits (a corpus that publishes only `train`, as fineweb-edu): our split of a document is a pure
function of the document: `u = sha256(f"{seed}\\0{key}")[:8] / 2**64`, key its text (or `hf_id_field`),
and `u < val_fraction` -> val, `u < val_fraction + test_fraction` -> test, else train. So val/test never
overlap train (exact duplicates land together), and the split does not depend on the order of the rows, on
the shard count or on the run.

By token count (data.val_tokens / test_tokens > 0; mohge.data.holdout): a document with
`u < holdout_candidate_fraction` is a candidate (split CANDIDATE): its job sets it aside, and the gather step
picks val and test among all jobs' candidates in u order. Candidates never reach the tokenizer's sample.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mohge.config import SPLITS, ConfigError, DataConfig
from mohge.config.preflight import check_hf_local_path, check_hub, resolve_text_files

from .document import CANDIDATE, Doc

log = logging.getLogger("mohge.data")


def holdout_u(key: str, seed: int) -> float:
    """The document's position in [0, 1): the first 8 bytes of sha256(seed NUL key), as a fraction."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def holdout_split(key: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """train, val or test for a document of a single-split corpus (see the module docstring)."""
    u = holdout_u(key, seed)
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def carved_splits(cfg: DataConfig) -> list[str]:
    """Our held-out splits that the dataset does not give (hf_splits lacks them): carved from train by hash.
    A single saved Dataset (not a DatasetDict) is the whole pool: both are carved from it."""
    if cfg.hf_local_path is not None and not _is_dataset_dict(cfg.hf_local_path):
        return ["val", "test"]
    return [s for s in ("val", "test") if s not in cfg.hf_split_map]


def _is_dataset_dict(path: str) -> bool:
    """A save_to_disk folder of a DatasetDict holds dataset_dict.json (a single Dataset holds state.json)."""
    return (Path(path) / "dataset_dict.json").is_file()


def by_tokens(cfg: DataConfig) -> bool:
    """Held out by token count (val_tokens/test_tokens), not by fraction. A target for a split that the
    dataset gives itself is refused: it would be silently ignored."""
    if cfg.source != "hf" or not (cfg.val_tokens or cfg.test_tokens):
        return False
    carved = carved_splits(cfg)
    for split in ("val", "test"):
        target = getattr(cfg, f"{split}_tokens")
        if target and split not in carved:
            raise ConfigError(
                f"data.{split}_tokens={target}: the dataset gives its own {split} split "
                f"(hf_splits={cfg.hf_split_map}); token targets apply to carved splits only"
            )
    return True


def holdout_key(cfg: DataConfig, doc: Doc) -> str:
    """What a document's u hashes: its hf_id_field (which iter_hf_docs makes its name) or its text."""
    return doc.name if cfg.hf_id_field else doc.text


def split_record(cfg: DataConfig) -> dict[str, Any]:
    """meta["split"] of the hf source (by token count: the gather step adds what it obtained)."""
    carved = carved_splits(cfg)
    if not carved:
        return {"method": "source", "source_splits": cfg.hf_split_map}
    record: dict[str, Any] = {
        "method": "doc_hash_tokens" if by_tokens(cfg) else "doc_hash",
        "hash": "sha256(f'{seed}\\0{key}')[:8] / 2**64",
        "key": cfg.hf_id_field or cfg.hf_text_field,
        "seed": cfg.seed,
    }
    if by_tokens(cfg):
        record["val_tokens"] = cfg.val_tokens if "val" in carved else None
        record["test_tokens"] = cfg.test_tokens if "test" in carved else None
        record["candidate_fraction"] = cfg.holdout_candidate_fraction
    else:
        record["val_fraction"] = cfg.val_fraction if "val" in carved else None
        record["test_fraction"] = cfg.test_fraction if "test" in carved else None
    return {**record, "carved": carved, "source_splits": cfg.hf_split_map}


def _open_split(cfg: DataConfig, theirs: str, ours: str) -> Any:
    """The dataset's split `theirs`: an IterableDataset (hub, data files) or a memory-mapped Dataset (saved)."""
    import datasets  # slow to import; only this source needs it

    if cfg.hf_local_path is not None:
        check_hf_local_path(cfg)  # gone since the plan: one line, not load_from_disk's traceback
        local = datasets.load_from_disk(cfg.hf_local_path)
        if isinstance(local, datasets.DatasetDict):
            if theirs not in local:
                raise ConfigError(f"data.hf_splits={ {ours: theirs}!r}: {cfg.hf_local_path} has splits {sorted(local)}")
            return local[theirs]
        return local  # a single saved Dataset serves as train (see carved_splits)
    if cfg.hf_data_files:
        files = [str(p) for p in resolve_text_files(cfg.hf_data_files, key="data.hf_data_files")]
        return datasets.load_dataset(cfg.hf_name, data_files={theirs: files}, split=theirs, streaming=True)
    check_hub(cfg)  # offline: one line now instead of ~40 s of retries and a ConnectionError
    return datasets.load_dataset(cfg.hf_name, cfg.hf_config, split=theirs, streaming=True)


def _rows(ds: Any, index: int, num_shards: int) -> Iterator[tuple[int, dict]]:
    """(row number within this job's slice, row) of job `index` of `num_shards` (module docstring)."""
    import datasets

    if isinstance(ds, datasets.Dataset):
        yield from enumerate(ds.shard(num_shards, index, contiguous=True))
        return
    if ds.num_shards >= num_shards:
        yield from enumerate(ds.shard(num_shards, index))
        return
    log.info("split has %d file(s) for %d jobs: every job reads it, keeps every %d-th row", ds.num_shards,
             num_shards, num_shards)  # fmt: skip
    for row, ex in enumerate(ds):
        if row % num_shards == index:
            yield row, ex


def _source_splits(cfg: DataConfig) -> dict[str, str]:
    """Our split -> the dataset's, for the splits read from the dataset (a carved split is not read)."""
    carved = carved_splits(cfg)
    return {ours: theirs for ours, theirs in cfg.hf_split_map.items() if ours not in carved}


def _doc_name(theirs: str, row: int, index: int, num_shards: int) -> str:
    return f"{theirs}[{row}]" if num_shards == 1 else f"{theirs}#{index}[{row}]"


def iter_hf_docs(cfg: DataConfig, index: int = 0, num_shards: int = 1) -> Iterator[tuple[str, Doc]]:
    """(our split, document) of job `index` of `num_shards`, in a fixed order: the dataset's splits in our
    split order, rows in the source's order. Rows with empty text are skipped."""
    field, id_field = cfg.hf_text_field, cfg.hf_id_field
    carved = carved_splits(cfg)
    vf = cfg.val_fraction if "val" in carved else 0.0
    tf = cfg.test_fraction if "test" in carved else 0.0
    tokens = by_tokens(cfg)
    for ours, theirs in _source_splits(cfg).items():
        ds = _open_split(cfg, theirs, ours)
        columns = ds.column_names  # None for a stream whose features are not declared (json)
        for key, value in (("hf_text_field", field), ("hf_id_field", id_field)):
            if value is not None and columns is not None and value not in columns:
                raise ConfigError(f"data.{key}={value!r}: split {theirs!r} has columns {columns}")
        for row, ex in _rows(ds, index, num_shards):
            if field not in ex or (id_field is not None and id_field not in ex):
                key, value = ("hf_text_field", field) if field not in ex else ("hf_id_field", id_field)
                raise ConfigError(f"data.{key}={value!r}: split {theirs!r} has columns {sorted(ex)}")
            text = ex[field]
            if not text or not text.strip():
                continue
            name = str(ex[id_field]) if id_field else _doc_name(theirs, row, index, num_shards)
            split = ours
            if ours == "train" and tokens:
                key = str(ex[id_field]) if id_field else text
                split = CANDIDATE if holdout_u(key, cfg.seed) < cfg.holdout_candidate_fraction else "train"
            elif ours == "train" and (vf or tf):
                split = holdout_split(str(ex[id_field]) if id_field else text, cfg.seed, vf, tf)
            yield split, Doc(name, text)


def hf_docs(cfg: DataConfig) -> dict[str, list[Doc]]:
    """Every document in memory, by split (small data and tests; preparation streams `iter_hf_docs`)."""
    if by_tokens(cfg):  # the split needs token counts: only the gather step knows it
        raise ConfigError("data.val_tokens/test_tokens: the split is decided when preparing; read the prepared folder")
    out: dict[str, list[Doc]] = {s: [] for s in SPLITS}
    for split, doc in iter_hf_docs(cfg):
        out[split].append(doc)
    return out
