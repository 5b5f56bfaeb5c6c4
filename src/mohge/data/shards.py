"""Shard files: one job's documents -> token ids (+ levels) written incrementally, with their manifest.

A shard job (`prepare_shard`, `python -m mohge.data shard --index I`) streams its slice of every split
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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from mohge.atomic import sha256_file, write_json_atomic
from mohge.config import SPLITS, DataConfig
from mohge.data.sources import CANDIDATE, Doc, carved_by_tokens, iter_shard_docs
from mohge.graded import LEVEL_SEP, token_levels
from mohge.tokenizer import eot_id, load_tokenizer

log = logging.getLogger("mohge.data")
MAX_META_DOC_NAMES = 10_000  # meta.json lists document names per split up to this many (else null)
SHARDS = "shards"
# An encode batch is data.encode_batch_docs documents or this many characters, whichever comes first: the
# Encoding objects of a batch (ids, token strings, offsets) take ~50-100 bytes per token, so 8 M characters
# (~2 M tokens) keep a job near 200 MB above its imports, whatever the corpus or document size.
BATCH_MAX_CHARS = 8 << 20


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


def _batches(pairs: Iterable[tuple[str, Doc]], max_docs: int, max_chars: int) -> Iterator[list[tuple[str, Doc]]]:
    """Consecutive runs of (split, doc) of at most max_docs documents or about max_chars characters."""
    batch: list[tuple[str, Doc]] = []
    chars = 0
    for pair in pairs:
        batch.append(pair)
        chars += len(pair[1].text)
        if len(batch) >= max_docs or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def encode_docs(tok: Tokenizer, texts: list[str], with_offsets: bool) -> tuple[list[list[int]], list | None]:
    """Ids (and offsets) of many texts, in parallel inside `tokenizers`; no special token is added."""
    if with_offsets:
        encs = tok.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encs], [e.offsets for e in encs]
    # encode_batch_fast skips the offsets: the same ids, less work when no level needs them
    return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)], None


def prepare_shard(
    cfg: DataConfig, out_dir: str | os.PathLike, index: int, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Shard job `index` of cfg.num_shards: write its shard files and its manifest (part-IIIII.json, last).
    The tokenizer is out_dir/tokenizer.json, written by the tokenizer job (mohge.data.prepare)."""
    if not 0 <= index < cfg.num_shards:
        raise ValueError(f"--index {index}: expected 0 <= index < data.num_shards={cfg.num_shards}")
    out = Path(out_dir)
    tok_path = out / "tokenizer.json"
    if not tok_path.is_file():
        raise FileNotFoundError(f"{tok_path} is missing: run `python -m mohge.data tokenizer` for {out} first")
    tok = load_tokenizer(tok_path)
    eot = eot_id(tok, cfg.eot_token, tok_path)  # the id the tokenizer job records in meta["eot_id"]
    (out / SHARDS).mkdir(parents=True, exist_ok=True)
    (out / part_name(index)).unlink(missing_ok=True)  # the completion marker goes first and comes back last
    dtype = token_dtype(cfg.vocab_size)
    with_levels = cfg.source == "graded"
    carving = carved_by_tokens(cfg)  # val/test held out by token count: the gather writes them (mohge.data.holdout)
    writers: dict[str, Any] = {
        s: SplitShardWriter(out, cfg, s, index, dtype, with_levels, eot) for s in SPLITS if s not in carving
    }
    if carving:
        from mohge.data.holdout import CandidateWriter

        writers[CANDIDATE] = CandidateWriter(out, cfg, index, dtype, eot)
    try:
        pairs = iter_shard_docs(cfg, index, cfg.num_shards, cache_dir)
        with tqdm(unit="doc", desc=f"shard {index}", disable=None) as bar:
            for batch in _batches(pairs, cfg.encode_batch_docs, BATCH_MAX_CHARS):
                ids, offsets = encode_docs(tok, [d.text for _, d in batch], with_levels)
                for split in writers:  # keep the stream order within each split
                    pick = [k for k, (s, _) in enumerate(batch) if s == split]
                    if pick:
                        sub_offsets = [offsets[k] for k in pick] if offsets is not None else None
                        writers[split].add([batch[k][1] for k in pick], [ids[k] for k in pick], sub_offsets)
                bar.update(len(batch))
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    part = {
        "index": index,
        "num_shards": cfg.num_shards,
        "dtype": dtype.name,
        "config": cfg.to_dict(),
        "tokenizer_sha256": sha256_file(tok_path),
        "splits": {s: w.finish() for s, w in writers.items() if s != CANDIDATE},
    }
    if carving:
        part["candidates"] = writers[CANDIDATE].finish()
    write_json_atomic(out / part_name(index), part)
    log.info("shard %d/%d: tokens %s", index, cfg.num_shards, {s: e["tokens"] for s, e in part["splits"].items()})
    return part
