"""Preparation as scatter/gather: a tokenizer job, N shard jobs, a gather job; and the CLI.

    python -m mohge.data --config C --out D                    everything in this process (small data, tests)
    python -m mohge.data --config C --out D --procs 4          the same, shard jobs in 4 worker processes
    python -m mohge.data tokenizer --config C --out D          D/tokenizer.json (+ shards/tokenizer-info.json)
    python -m mohge.data shard --index I --config C --out D    shard job I of data.num_shards (mohge.data.shards)
    python -m mohge.data gather --config C --out D             verify every shard, write meta.json last

The workflow (workflow/rules/data.smk) runs the three steps as separate jobs, the N shard jobs in parallel.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mohge.atomic import atomic_path, sha256_file, write_json_atomic
from mohge.cli import user_errors
from mohge.config import ConfigError, DataConfig, load_yaml_or_json
from mohge.data.facts import tokenizer_probe
from mohge.data.facts import write_tokenizer as write_facts_tokenizer
from mohge.data.manifest import TOKENIZER_INFO, gather, load_meta
from mohge.data.shards import MAX_META_DOC_NAMES, SHARDS, prepare_shard, token_dtype
from mohge.data.sources import default_cache_dir, iter_tokenizer_sample, split_record
from mohge.preflight import offline_variable
from mohge.tokenizer import check_tokenizer, eot_id, train_tokenizer

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
            raise ValueError(f"data.source={cfg.source!r}: the train split is empty")
    elif cfg.tokenizer_kind == "facts":  # one word per symbol (mohge.data.facts, docs/method.md §12.5)
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
        from tokenizers import Tokenizer

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


def prepare_gather(
    cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The gather job: meta.json over the shard jobs' files (mohge.data.manifest.gather)."""
    return gather(cfg, out_dir, split_record(cfg, cache_dir))


def _shard_job(args: tuple[DataConfig, str, int, str | None]) -> int:
    cfg, out, index, cache_dir = args
    os.environ.setdefault("USE_TORCH", "0")  # as in main(): datasets need not import torch here
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
        prog="python -m mohge.data",
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
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
