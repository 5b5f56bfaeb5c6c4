"""Shard files: one job's documents -> token ids (+ levels) written incrementally, with their manifest.

The writers and names of the shard files, and their check (`verify_shard`). A shard job
(`mohge.data.prepare.prepare_shard`, `python -m mohge.data shard --index I`) streams its slice of every split
(mohge.data.sources.iter_shard_docs), encodes the documents in batches with `tokenizers`' `encode_batch`
(parallel in Rust), and appends each batch to

    shards/{split}-{I:05d}.bin            ids, each document followed by EOT (dtype of mohge.data.prepare)
    shards/{split}-{I:05d}.levels.bin     graded corpus only: int8 level per token
    shards/{split}-{I:05d}.eval.jsonl     val/test only: the first data.eval_docs_max held-out documents

while a running sha256 follows every byte. Nothing of a split is held in memory beyond one batch, so the
job's memory does not grow with the corpus. The files are written under temporary names and renamed at the
end; the job's manifest `shards/part-{I:05d}.json` is written last (its completion marker), and the gather
step (mohge.data.prepare.gather) reads only complete jobs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from mohge.config import DataConfig
from mohge.core.atomic import sha256_file
from mohge.core.knobs import ConfigError

from .document import Doc
from .graded import LEVEL_SEP, token_levels

log = logging.getLogger("mohge.data")
MAX_META_DOC_NAMES = 10_000  # meta.json lists document names per split up to this many (else null)
SHARDS = "shards"


def shard_name(split: str, index: int, suffix: str = ".bin") -> str:
    """Path of a shard file relative to the data folder, e.g. shards/train-00002.bin."""
    return f"{SHARDS}/{split}-{index:05d}{suffix}"


def part_name(index: int) -> str:
    """The manifest of shard job `index`, relative to the data folder."""
    return f"{SHARDS}/part-{index:05d}.json"


def shard_entry(shard: Any, sha256: str) -> dict[str, Any]:
    """The manifest entry of a finished shard (``shard`` has split, index, tokens, docs, chars, names); the levels
    and eval-file keys are added by the writer that has them."""
    return {
        "file": shard_name(shard.split, shard.index),
        "tokens": shard.tokens,
        "docs": shard.docs,
        "sha256": sha256,
        "levels": None,
        "chars": shard.chars,
        "names": shard.names,
    }


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def verify_shard(data_dir: str | os.PathLike, file: str, nbytes: int, sha256: str) -> None:
    """A shard file whose size or sha256 differs from its manifest entry is refused, named."""
    path = Path(data_dir) / file
    if not path.is_file():
        raise ConfigError(f"{path} is missing: prepare the data again")
    size = path.stat().st_size
    if size != nbytes:
        raise ConfigError(f"{path}: {size} bytes, the manifest expects {nbytes} (truncated or changed?)")
    actual = sha256_file(path)
    if actual != sha256:
        raise ConfigError(f"{path}: sha256 {actual}, the manifest expects {sha256} (changed?); prepare the data again")


def doc_record(source: str, doc: Doc) -> dict[str, Any]:
    """One line of {val,test}_docs.jsonl: the document's name under its source's key, its text (and levels)."""
    key = {"shakespeare": "play", "text": "file", "hf": "id", "graded": "id", "facts": "id"}[source]
    rec: dict[str, Any] = {key: doc.name, "text": doc.text}
    if doc.levels is not None:
        rec["levels"] = doc.levels
    return rec


class _HashedFile:
    """A binary file written once, front to back, under a temporary name, with a running sha256."""

    def __init__(self, path: Path):
        self.path, self.tmp = path, path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.fh: IO[bytes] = open(self.tmp, "wb")  # noqa: SIM115 (closed in finish/abort)
        self.sha, self.nbytes = hashlib.sha256(), 0

    def write(self, payload: bytes) -> None:
        self.fh.write(payload)
        self.sha.update(payload)
        self.nbytes += len(payload)

    def finish(self) -> str:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)
        return self.sha.hexdigest()

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


class SplitShardWriter:
    """The shard of one split written by one job: ids (+ levels), counts, names and held-out documents."""

    def __init__(
        self, out: Path, cfg: DataConfig, split: str, index: int, dtype: np.dtype, with_levels: bool, eot: int
    ):
        self.out, self.cfg, self.split, self.index, self.dtype = out, cfg, split, index, dtype
        self.eot = eot  # the tokenizer's id of data.eot_token (meta["eot_id"]), appended after every document
        self.ids = _HashedFile(out / shard_name(split, index))
        self.levels = _HashedFile(out / shard_name(split, index, ".levels.bin")) if with_levels else None
        self.eval: IO[str] | None = None
        if split in ("val", "test"):  # held-out text for lm-eval, bounded (the gather step keeps the first ones)
            self.eval_path = out / shard_name(split, index, ".eval.jsonl")
            self.eval = open(self.eval_path.with_suffix(".tmp"), "w", encoding="utf-8")  # noqa: SIM115
        self.tokens = self.docs = self.chars = self.eval_docs = 0
        self.names: list[str] | None = []

    def add(self, docs: list[Doc], ids_per_doc: list[list[int]], offsets: list | None) -> None:
        """Append a batch of documents, each followed by EOT."""
        flat: list[int] = []
        for x in ids_per_doc:  # list.extend runs in C: cheaper than any per-token Python loop
            flat.extend(x)
            flat.append(self.eot)
        ids = np.array(flat, dtype=self.dtype)
        total = len(ids)
        self.ids.write(ids.tobytes())
        if self.levels is not None:
            assert offsets is not None
            parts = []
            for doc, offs in zip(docs, offsets, strict=True):
                assert doc.levels is not None and len(doc.levels) == len(doc.text)
                parts += [token_levels(offs, doc.levels), np.array([LEVEL_SEP], dtype=np.int8)]
            levels = np.concatenate(parts).astype(np.int8)
            assert len(levels) == total
            self.levels.write(levels.tobytes())
        self.tokens += total
        self.docs += len(docs)
        self.chars += sum(len(d.text) for d in docs)
        if self.names is not None:
            self.names += [d.name for d in docs]
            if len(self.names) > MAX_META_DOC_NAMES:
                self.names = None
        if self.eval is not None:
            for doc in docs[: max(0, self.cfg.eval_docs_max - self.eval_docs)]:
                self.eval.write(json.dumps(doc_record(self.cfg.source, doc), ensure_ascii=False) + "\n")
                self.eval_docs += 1

    def finish(self) -> dict[str, Any]:
        entry = shard_entry(self, self.ids.finish())
        if self.levels is not None:
            entry["levels"] = {
                "file": shard_name(self.split, self.index, ".levels.bin"),
                "sha256": self.levels.finish(),
            }
        if self.eval is not None:
            self.eval.close()
            os.replace(self.eval_path.with_suffix(".tmp"), self.eval_path)
            entry["eval_file"], entry["eval_docs"] = shard_name(self.split, self.index, ".eval.jsonl"), self.eval_docs
        return entry

    def abort(self) -> None:
        for f in (self.ids, self.levels):
            if f is not None:
                f.abort()
        if self.eval is not None:
            self.eval.close()
            self.eval_path.with_suffix(".tmp").unlink(missing_ok=True)
