"""Preparation as scatter/gather: a tokenizer job, N shard jobs, a gather job; and the CLI.

    python -m mohge.data --config C --out D                    everything in this process (small data, tests)
    python -m mohge.data --config C --out D --procs 4          the same, shard jobs in 4 worker processes
    python -m mohge.data tokenizer --config C --out D          D/tokenizer.json (+ shards/tokenizer-info.json)
    python -m mohge.data shard --index I --config C --out D    shard job I of data.num_shards (prepare_shard)
    python -m mohge.data gather --config C --out D             verify every shard, write meta.json last

The workflow (workflow/rules/data.smk) runs the three steps as separate jobs, the N shard jobs in parallel.
The jobs live here, above what they use: a shard job writes through mohge.data.shards (and, for a token-count
hold-out, mohge.data.holdout's candidate writer); the gather is mohge.data.manifest.gather.
The files are listed in the package docstring (mohge.data) and in mohge.data.manifest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import multiprocessing
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tqdm import tqdm

from mohge.config import SPLITS, ConfigError, DataConfig, load_yaml_or_json
from mohge.config.preflight import offline_variable
from mohge.core.atomic import atomic_path, sha256_file, write_json_atomic
from mohge.core.cli import setup_logging, user_errors

from .document import CANDIDATE, Doc
from .holdout import CandidateWriter
from .manifest import TOKENIZER_INFO, gather, load_meta
from .shards import MAX_META_DOC_NAMES, SHARDS, SplitShardWriter, part_name, token_dtype
from .sources import carved_by_tokens, default_cache_dir, iter_shard_docs, iter_tokenizer_sample, split_record
from .tokenizer import check_tokenizer, eot_id, load_tokenizer, tokenizer_probe, train_tokenizer

log = logging.getLogger("mohge.data")

__all__ = ["MAX_META_DOC_NAMES", "load_data_config", "load_meta", "main", "prepare", "token_dtype"]


def _check_vocab(cfg: DataConfig, where: str, n: int) -> None:
    """The model's vocabulary is data.vocab_size: a given tokenizer must have exactly that many tokens."""
    if n != cfg.vocab_size:
        raise ConfigError(
            f"data.vocab_size={cfg.vocab_size}: the tokenizer {where} has {n} tokens; the model's vocabulary "
            f"must match it (set data.vocab_size: {n})"
        )


def prepare_tokenizer(
    cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The tokenizer job: D/tokenizer.json trained on a bounded sample of train, copied from
    data.tokenizer_file or fetched from data.tokenizer_hub; parsed and round-tripped before use. Its record
    (shards/tokenizer-info.json, meta["tokenizer"]) holds the id of data.eot_token (`eot_id`)."""
    out = Path(out_dir)
    (out / SHARDS).mkdir(parents=True, exist_ok=True)
    target = out / "tokenizer.json"
    info: dict[str, Any] = {"kind": cfg.tokenizer_kind, "file": "tokenizer.json"}
    if cfg.tokenizer_kind == "trained":
        log.info("training byte-level BPE (vocab_size=%d) on a sample of the train split", cfg.vocab_size)
        texts = iter_tokenizer_sample(cfg, cache_dir)
        counted = {"docs": 0, "bytes": 0}

        def counting():  # the sample's size goes into the manifest
            for t in texts:
                counted["docs"] += 1
                counted["bytes"] += len(t.encode("utf-8"))
                yield t

        train_tokenizer(counting(), cfg.vocab_size, target, eot_token=cfg.eot_token)
        info["sample"] = {
            **counted,
            "max_docs": cfg.tokenizer_train_docs or None,
            "max_bytes": cfg.tokenizer_train_bytes,
        }
        if counted["docs"] == 0:
            raise ConfigError(f"data.source={cfg.source!r}: the train split is empty")
    elif cfg.tokenizer_kind == "facts":  # one word per symbol (mohge.data.facts, docs/method.md §12.5)
        from .facts import write_tokenizer as write_facts_tokenizer

        write_facts_tokenizer(cfg, target)
        info["source"] = "facts"
    elif cfg.tokenizer_kind == "file":
        check_tokenizer(cfg.tokenizer_file, cfg.eot_token)  # parse + round trip + end token before anything is copied
        with atomic_path(target) as tmp:
            shutil.copyfile(cfg.tokenizer_file, tmp)
        info["source"] = str(cfg.tokenizer_file)
    else:
        if var := offline_variable():
            raise ConfigError(f"data.tokenizer_hub={cfg.tokenizer_hub!r}: {var} is set, so the hub cannot be reached")
        with atomic_path(target) as tmp:
            Tokenizer.from_pretrained(cfg.tokenizer_hub).save(str(tmp))
        info["source"] = cfg.tokenizer_hub
    tok = check_tokenizer(target, probe=tokenizer_probe(cfg))
    eot = eot_id(tok, cfg.eot_token, f"the tokenizer {info.get('source', target)}")  # none: refused, naming the key
    n = tok.get_vocab_size()
    if cfg.tokenizer_kind != "trained":
        _check_vocab(cfg, str(info["source"]), n)
    elif n < cfg.vocab_size:
        log.warning("the BPE stopped at %d tokens (data.vocab_size=%d): its sample ran out of pairs", n, cfg.vocab_size)
    # The end-of-text id is the tokenizer's (ours: 0; GPT-2's: 50256): every reader takes it from meta["eot_id"].
    info.update(vocab_size=n, eot_token=cfg.eot_token, eot_id=eot, sha256=sha256_file(target))
    write_json_atomic(out / TOKENIZER_INFO, info)
    return info


# An encode batch is data.encode_batch_docs documents or this many characters, whichever comes first: the
# Encoding objects of a batch (ids, token strings, offsets) take ~50-100 bytes per token, so 8 M characters
# (~2 M tokens) keep a job near 200 MB above its imports, whatever the corpus or document size.
BATCH_MAX_CHARS = 8 << 20


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
        raise ConfigError(f"--index {index}: expected 0 <= index < data.num_shards={cfg.num_shards}")
    out = Path(out_dir)
    tok_path = out / "tokenizer.json"
    if not tok_path.is_file():
        raise ConfigError(f"{tok_path} is missing: run `python -m mohge.data tokenizer` for {out} first")
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


def prepare_gather(
    cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The gather job: meta.json over the shard jobs' files (mohge.data.manifest.gather)."""
    return gather(cfg, out_dir, split_record(cfg, cache_dir))


def _shard_job(args: tuple[DataConfig, str, int, str | None]) -> int:
    cfg, out, index, cache_dir = args
    os.environ.setdefault("USE_TORCH", "0")  # as in main(): datasets need not import torch here
    setup_logging()
    prepare_shard(cfg, out, index, cache_dir)
    return index


def prepare(
    cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None, procs: int = 1
) -> dict[str, Any]:
    """All three steps in this process (shard jobs in `procs` worker processes when procs > 1); returns meta.

    The tokenizer sees a bounded sample of the train split only. `cache_dir` keeps downloads
    (default: `default_cache_dir()`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # the completion marker goes first and comes back last
    shutil.rmtree(out / SHARDS, ignore_errors=True)  # no shard of an earlier shard count survives
    prepare_tokenizer(cfg, out, cache_dir)
    jobs = [(cfg, str(out), i, None if cache_dir is None else str(cache_dir)) for i in range(cfg.num_shards)]
    if procs <= 1 or cfg.num_shards == 1:
        for job in jobs:
            prepare_shard(*job)
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding tokenizers' thread pool
        with concurrent.futures.ProcessPoolExecutor(min(procs, cfg.num_shards), mp_context=ctx) as pool:
            list(pool.map(_shard_job, jobs))
    return prepare_gather(cfg, out, cache_dir)


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------

STEPS = ("all", "tokenizer", "shard", "gather")


def load_data_config(path: str | os.PathLike) -> DataConfig:
    """DataConfig from a JSON (or YAML) file holding either a `data` section or the DataConfig itself."""
    d = load_yaml_or_json(path)
    if isinstance(d.get("data"), Mapping):
        d = d["data"]
    return DataConfig.from_dict(d)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else None
    parser = argparse.ArgumentParser(
        prog="mohge data",
        description="Prepare a data source into tokenizer.json, shards/{split}-NNNNN.bin and meta.json. "
        "STEP: all (default: everything here), tokenizer, shard (--index), gather. The tokenizer is trained on "
        "a bounded sample of the train split only; Shakespeare is split by whole plays.",
        epilog="Example: python -m mohge.data --config results/run/config.json --out data/shakespeare",
    )
    keys = ", ".join(f.name for f in dataclasses.fields(DataConfig))
    parser.add_argument("step", nargs="?", default="all", choices=STEPS, help="which step (default: all)")
    parser.add_argument(
        "--config",
        required=True,
        help=f"JSON/YAML file: a run config with a `data` section, or a DataConfig mapping (keys: {keys})",
    )
    parser.add_argument("--out", required=True, help="output folder (created; its meta.json marks completion)")
    parser.add_argument("--index", type=int, default=None, help="shard job number (step shard)")
    parser.add_argument("--procs", type=int, default=1, help="worker processes for the shard jobs (step all)")
    parser.add_argument("--cache-dir", default=None, help=f"download cache (default {default_cache_dir()})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    # `datasets` imports torch when it can (~250 MB, seconds) only to offer torch formatting, which no step uses:
    # a preparation job stays small without it (read when datasets is first imported, i.e. below).
    os.environ.setdefault("USE_TORCH", "0")
    setup_logging(args.log_level)
    if (args.step == "shard") != (args.index is not None):
        parser.error("--index goes with the step shard, and shard needs it")
    cfg = load_data_config(args.config)
    if args.step == "tokenizer":
        info = prepare_tokenizer(cfg, args.out, args.cache_dir)
        print(json.dumps({"out": str(args.out), "tokenizer": info}))
        return 0
    if args.step == "shard":
        part = prepare_shard(cfg, args.out, args.index, args.cache_dir)
        print(
            json.dumps(
                {
                    "out": str(args.out),
                    "index": args.index,
                    "tokens": {s: e["tokens"] for s, e in part["splits"].items()},
                }
            )
        )
        return 0
    run = prepare_gather if args.step == "gather" else prepare
    meta = run(cfg, args.out, args.cache_dir, **({"procs": args.procs} if args.step == "all" else {}))
    print(json.dumps({"out": str(args.out), "vocab_size": meta["vocab_size"], "tokens": meta["tokens"]}))
    return 0
