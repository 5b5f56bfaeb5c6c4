"""Held-out splits by token count (data.val_tokens / test_tokens; docs/method.md §12.2), exact and streamed.

The rule: order every document of the pool by its u (mohge.data.hf.holdout_u); val is the shortest u-prefix
whose tokens (each document's ids and its EOT) reach val_tokens, test the next documents until their tokens
reach test_tokens, train everything else. Documents of equal u (exact duplicates of their key) are never cut
apart: a split that ends inside such a group takes the whole group, so a text never sits in two splits.

Why in two steps: a shard job sees only its slice, and a u-prefix by tokens needs every job's documents.
  shard job i   documents with u < holdout_candidate_fraction are candidates: instead of train, they go to
                shards/cand-{i:05d}.bin (ids + EOT, as a shard), .idx (one CANDIDATE_INDEX row per document:
                u, a tie-break hash, tokens, characters, offset of its record) and .jsonl (name and text, for
                the held-out text and the manifest's names).
  gather        reads the indexes of all jobs (~80 bytes per candidate; the candidates are a bounded share of
                the corpus), orders them by (u, sha256 of the text), cuts val and test, and writes
                shards/val-00000.bin, shards/test-00000.bin and the candidates left over as one more train
                shard, shards/train-{N:05d}.bin (N = num_shards), every one listed in meta.json like any shard.
Every ordering key is a function of the document alone, so the carved shards are byte-identical whatever the
shard count and whichever process ran which job. The candidates must hold the wanted tokens, else the gather
refuses the config naming data.holdout_candidate_fraction and the numbers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from mohge.config import ConfigError, DataConfig

from .document import Doc
from .hf import carved_splits, holdout_key, holdout_u
from .shards import MAX_META_DOC_NAMES, SplitShardWriter, _HashedFile, doc_record, shard_entry, shard_name, verify_shard

log = logging.getLogger("mohge.data")
CAND = "cand"  # file stem of a job's candidates: shards/cand-{i:05d}.{bin,idx,jsonl}
CANDIDATE_INDEX = np.dtype([("u", "<f8"), ("tie", "<u8"), ("tokens", "<u8"), ("chars", "<u8"), ("rec", "<u8")])
ROOM = 1.5  # below this many times the wanted tokens in the candidates, the gather warns (the bound is tight)


def _tie(text: str) -> int:
    """Second sort key after u: the first 8 bytes of sha256(text), so equal-u documents have a fixed order."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


class CandidateWriter:
    """Shard job side: the job's candidates, ids written as a shard (EOT appended there), plus index and records."""

    def __init__(self, out: Path, cfg: DataConfig, index: int, dtype: np.dtype, eot: int):
        self.cfg = cfg
        self.ids = SplitShardWriter(out, cfg, CAND, index, dtype, with_levels=False, eot=eot)
        self.index_file = _HashedFile(out / shard_name(CAND, index, ".idx"))
        self.records = _HashedFile(out / shard_name(CAND, index, ".jsonl"))
        self.index = index

    def add(self, docs: list[Doc], ids_per_doc: list[list[int]], offsets: list | None) -> None:
        before = self.ids.tokens
        self.ids.add(docs, ids_per_doc, offsets)
        rows = np.zeros(len(docs), dtype=CANDIDATE_INDEX)
        for k, (doc, ids) in enumerate(zip(docs, ids_per_doc, strict=True)):
            rec = (json.dumps(doc_record(self.cfg.source, doc), ensure_ascii=False) + "\n").encode("utf-8")
            u = holdout_u(holdout_key(self.cfg, doc), self.cfg.seed)
            rows[k] = (u, _tie(doc.text), len(ids) + 1, len(doc.text), self.records.nbytes)  # + 1: the EOT
            self.records.write(rec)
        assert int(rows["tokens"].sum()) == self.ids.tokens - before, "one EOT per document"
        self.index_file.write(rows.tobytes())

    def finish(self) -> dict[str, Any]:
        entry = self.ids.finish()
        entry["index_file"], entry["index_sha256"] = shard_name(CAND, self.index, ".idx"), self.index_file.finish()
        entry["records_file"], entry["records_sha256"] = shard_name(CAND, self.index, ".jsonl"), self.records.finish()
        entry["records_bytes"] = self.records.nbytes
        return entry

    def abort(self) -> None:
        for f in (self.ids, self.index_file, self.records):
            f.abort()


class _CarvedShard:
    """Gather side: one carved shard, written front to back from candidates' bytes (ids already end in EOT)."""

    def __init__(self, out: Path, cfg: DataConfig, split: str, index: int):
        self.out, self.cfg, self.split, self.index = out, cfg, split, index
        self.ids = _HashedFile(out / shard_name(split, index))
        self.eval = _HashedFile(out / shard_name(split, index, ".eval.jsonl")) if split != "train" else None
        self.eval_docs = 0
        self.tokens = self.docs = self.chars = 0
        self.names: list[str] | None = []

    def wants_record(self) -> bool:
        return self.names is not None or (self.eval is not None and self.eval_docs < self.cfg.eval_docs_max)

    def add(self, ids: np.ndarray, chars: int, record: bytes | None) -> None:
        self.ids.write(ids.tobytes())
        self.tokens += len(ids)
        self.docs += 1
        self.chars += chars
        if record is not None:
            if self.names is not None:
                rec = json.loads(record)
                self.names.append(rec[next(iter(rec))])  # the record's first key is the document's name
                if len(self.names) > MAX_META_DOC_NAMES:
                    self.names = None
            if self.eval is not None and self.eval_docs < self.cfg.eval_docs_max:
                self.eval.write(record)  # the held-out text for lm-eval: the first eval_docs_max documents
                self.eval_docs += 1

    def abort(self) -> None:
        for f in (self.ids, self.eval):
            if f is not None:
                f.abort()

    def finish(self) -> dict[str, Any]:
        entry = shard_entry(self, self.ids.finish())
        if self.eval is not None:
            self.eval.finish()
            entry["eval_file"], entry["eval_docs"] = shard_name(self.split, self.index, ".eval.jsonl"), self.eval_docs
        return entry


def _cut(u: np.ndarray, cum: np.ndarray, start: int, target: int) -> int | None:
    """End (exclusive) of the split that starts at `start` in u order: the fewest documents whose tokens reach
    `target`, extended over documents of the same u; None when the candidates run out first."""
    if target == 0:
        return start
    base = cum[start - 1] if start else 0
    k = int(np.searchsorted(cum, base + target, side="left"))  # first k with cum[k] >= base + target
    if k >= len(cum):
        return None
    end = k + 1
    while end < len(u) and u[end] == u[end - 1]:  # never cut a group of equal u (exact duplicates) apart
        end += 1
    return end


def carve(
    cfg: DataConfig, out: Path, parts: list[dict[str, Any]], dtype: np.dtype
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The gather's part: val/test (and the leftover train shard) from every job's candidates.
    Returns the new shard entries per split and what goes into meta["split"]."""
    carved = carved_splits(cfg)
    targets = {s: getattr(cfg, f"{s}_tokens") if s in carved else 0 for s in ("val", "test")}
    cands = [p["candidates"] for p in parts]
    for c in cands:  # every file of every job checked against its manifest before it is read
        verify_shard(out, c["file"], c["tokens"] * dtype.itemsize, c["sha256"])
        verify_shard(out, c["index_file"], c["docs"] * CANDIDATE_INDEX.itemsize, c["index_sha256"])
        verify_shard(out, c["records_file"], c["records_bytes"], c["records_sha256"])
    rows = [np.fromfile(out / c["index_file"], dtype=CANDIDATE_INDEX) for c in cands]
    job = np.concatenate([np.full(len(r), j, dtype=np.int64) for j, r in enumerate(rows)])
    pos = np.concatenate([np.arange(len(r), dtype=np.int64) for r in rows])
    start = np.concatenate([(np.cumsum(r["tokens"]) - r["tokens"]).astype(np.int64) for r in rows])  # in its .bin
    idx = np.concatenate(rows) if rows else np.zeros(0, dtype=CANDIDATE_INDEX)
    # u first, then the text's hash; (job, position) only separates byte-identical documents
    order = np.lexsort((pos, job, idx["tie"], idx["u"]))
    u, toks = idx["u"][order], idx["tokens"][order].astype(np.int64)
    cum = np.cumsum(toks)
    cand_tokens = int(cum[-1]) if len(cum) else 0
    total = cand_tokens + sum(p["splits"]["train"]["tokens"] for p in parts)
    need = targets["val"] + targets["test"]
    val_end = _cut(u, cum, 0, targets["val"])
    test_end = None if val_end is None else _cut(u, cum, val_end, targets["test"])
    key, f = "holdout_candidate_fraction", cfg.holdout_candidate_fraction
    if test_end is None:
        if need > total:
            raise ConfigError(
                f"data.val_tokens={targets['val']}: plus test_tokens={targets['test']} = {need} exceeds the "
                f"corpus's {total} tokens"
            )
        raise ConfigError(
            f"data.{key}={f}: its candidates (u < {f}) hold {cand_tokens} of the corpus's {total} tokens, fewer "
            f"than val_tokens + test_tokens = {need}; set it to about {min(1.0, 2 * need / total):.3g} "
            f"(twice the wanted share {need / total:.3g})"
        )
    if cand_tokens < ROOM * need:
        log.warning("data.%s=%s: the candidates hold %d tokens, less than %.1fx the %d wanted", key, f, cand_tokens,
                    ROOM, need)  # fmt: skip
    bounds = {"val": (0, val_end), "test": (val_end, test_end), "train": (test_end, len(u))}
    # a split the dataset gives itself keeps its jobs' shards (its bounds are empty: its target is 0)
    writers = {s: _CarvedShard(out, cfg, s, 0) for s in carved}
    writers["train"] = _CarvedShard(out, cfg, "train", cfg.num_shards)  # after the N jobs' train shards
    bins = [np.memmap(out / c["file"], dtype=dtype, mode="r") if c["tokens"] else None for c in cands]
    handles = [open(out / c["records_file"], "rb") for c in cands]  # noqa: SIM115 (closed below)
    try:
        for split, w in writers.items():
            a, b = bounds[split]
            for k in order[a:b]:
                j, row = int(job[k]), idx[k]
                ids = bins[j][start[k] : start[k] + int(row["tokens"])]
                record = None
                if w.wants_record():
                    handles[j].seek(int(row["rec"]))
                    record = handles[j].readline()
                w.add(ids, int(row["chars"]), record)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        for h in handles:
            h.close()
    entries = {s: w.finish() for s, w in writers.items()}
    thresholds = {
        s: float(u[end]) if end < len(u) else f for s, end in (("val", val_end), ("test", test_end))
    }  # val: u < thresholds["val"]; test: thresholds["val"] <= u < thresholds["test"]; train: the rest
    record = {
        "u_thresholds": thresholds,
        "tokens_obtained": {s: entries[s]["tokens"] for s in carved},
        "candidate_tokens": cand_tokens,
        "candidate_docs": len(u),
        "returned_to_train": {"tokens": entries["train"]["tokens"], "docs": entries["train"]["docs"]},
    }
    log.info("held out by tokens: %s (thresholds %s)", record["tokens_obtained"], thresholds)
    return {s: [e] for s, e in entries.items()}, record
