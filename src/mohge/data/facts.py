"""The facts source (docs/method.md §12.5): N random facts key -> value: how many bits a model stores.

A fact is a key of ``facts_key_len`` symbols over ``facts_key_tokens`` key tokens and a value of
``facts_value_len`` symbols over ``facts_value_tokens`` value tokens, drawn uniformly at random; keys are
distinct, so a fact's value is a function of its key. Every value carries ``facts_value_len × log2(V)`` bits
that nothing but memorisation can predict (Allen-Zhu & Li, arXiv 2404.05405): the study's endpoint, the bits a
model stores, is ``Σ_facts (bits of the value − CE(value | key) in bits)`` (mohge.evaluate.bits_stored).

The table is a pure function of ``data.seed``. The vocabulary is word level, one token per symbol (``K12``,
``V200``), written as a real ``tokenizer.json`` (a `tokenizers` WordLevel model over whitespace-split words),
so an embedding row holds one symbol and cannot hold a fact; the end-of-text token is an ordinary word at id 0
(``data.eot_token``), so an lm-eval context can name it.

Documents. A fact is one document, ``K12 K57 V3 V200``; the pipeline appends the end-of-text token after
every document, and every shard opens with an empty document (a lone end-of-text token), so a shard reads
``<eot> k1 k2 v1 v2 <eot> k1 k2 v1 v2 <eot> ...``. The train split holds ``facts_epochs`` copies of the table,
each in its own order (a permutation drawn from (seed, epoch)), so ``train.data_order: sequential`` reads every
fact exactly ``facts_epochs`` times, freshly shuffled every epoch. ``data.seq_len`` must be a multiple of the
fact length L (key + value + 1): every window then starts with ``<eot>`` and a whole fact, which is exactly the
context a fact is scored in (``<eot> key -> value`` at positions 0..L-1); with ``seq_len = L`` every fact is read
in that context alone (docs/method.md §12.5 says why the study does so).
val and test hold one copy of the table in table order (the study scores the trained facts: there is no held-out
knowledge to measure).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mohge.config import SPLITS, DataConfig
from mohge.core.atomic import atomic_path

UNK = "<unk>"  # WordLevel needs one; no generated document contains an unknown word
START = "start"  # the empty document that opens every shard: its end-of-text token aligns the windows


def key_word(k: int) -> str:
    return f"K{k}"


def value_word(v: int) -> str:
    return f"V{v}"


def vocabulary(cfg: DataConfig) -> list[str]:
    """Words in id order: end-of-text (id 0), unk, the key tokens, the value tokens."""
    return [
        cfg.eot_token,
        UNK,
        *(key_word(k) for k in range(cfg.facts_key_tokens)),
        *(value_word(v) for v in range(cfg.facts_value_tokens)),
    ]


def vocab_size(cfg: DataConfig) -> int:
    """2 + K + V: what data.vocab_size must be for the facts source."""
    return 2 + cfg.facts_key_tokens + cfg.facts_value_tokens


def fact_len(cfg: DataConfig) -> int:
    """Tokens of one fact in the stream: key, value and the end-of-text token after it."""
    return cfg.facts_key_len + cfg.facts_value_len + 1


def bits_per_fact(cfg: DataConfig) -> float:
    """Entropy of one value: facts_value_len × log2(facts_value_tokens)."""
    return cfg.facts_value_len * math.log2(cfg.facts_value_tokens)


def total_bits(cfg: DataConfig) -> float:
    """The data's bits: N × bits_per_fact, the most any model can store."""
    return cfg.facts_num * bits_per_fact(cfg)


def _rng(cfg: DataConfig, *stream: int) -> np.random.Generator:
    # the table and every epoch's order are separate streams of one seed (SeedSequence spawn keys)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(cfg.seed, spawn_key=stream)))


def fact_table(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """(keys [N, key_len], values [N, value_len]) as int64 symbol indices; distinct keys; a pure function of
    data.seed. Keys are drawn uniformly among the K^key_len possible ones without repetition (draw, drop the
    repeats in order of first appearance, draw again for the missing ones)."""
    n, K, kl = cfg.facts_num, cfg.facts_key_tokens, cfg.facts_key_len
    rng = _rng(cfg, 0)
    space = K**kl
    codes: list[int] = []
    seen: set[int] = set()
    while len(codes) < n:
        for c in rng.integers(0, space, size=n - len(codes)).tolist():
            if c not in seen:
                seen.add(c)
                codes.append(c)
    code = np.array(codes, dtype=np.int64)
    keys_NK = np.stack([(code // K**i) % K for i in reversed(range(kl))], axis=1)
    values_NV = _rng(cfg, 1).integers(0, cfg.facts_value_tokens, size=(n, cfg.facts_value_len), dtype=np.int64)
    return keys_NK, values_NV


def key_text(keys: np.ndarray) -> str:
    return " ".join(key_word(int(k)) for k in keys)


def value_text(values: np.ndarray) -> str:
    return " ".join(value_word(int(v)) for v in values)


def fact_texts(cfg: DataConfig) -> list[str]:
    """The text of every fact, in table order: "K12 K57 V3 V200"."""
    keys, values = fact_table(cfg)
    return [f"{key_text(k)} {value_text(v)}" for k, v in zip(keys, values, strict=True)]


def epoch_order(cfg: DataConfig, epoch: int) -> np.ndarray:
    """The order in which train epoch `epoch` lists the facts: a permutation of range(N) from (seed, epoch)."""
    return _rng(cfg, 2, epoch).permutation(cfg.facts_num)


def iter_fact_docs(cfg: DataConfig, index: int = 0, num_shards: int = 1) -> Iterator[tuple[str, Any]]:
    """(split, Doc) of shard job `index`: an empty document (its end-of-text token opens the shard), then its
    contiguous run of train epochs (epochs are never split); the same for its run of the val and test copies.
    Streamed: nothing holds the E copies."""
    from .document import Doc

    texts = fact_texts(cfg)
    E, n = cfg.facts_epochs, len(texts)
    yield "train", Doc(START, "")  # a lone end-of-text token: every window starts with "<eot> k1 k2 v1 v2"
    for e in range(index * E // num_shards, (index + 1) * E // num_shards):
        for i in epoch_order(cfg, e).tolist():
            yield "train", Doc(f"fact-{i:07d}", texts[i])
    for split in SPLITS[1:]:
        yield split, Doc(START, "")
        for i in range(index * n // num_shards, (index + 1) * n // num_shards):
            yield split, Doc(f"fact-{i:07d}", texts[i])


def split_record(cfg: DataConfig) -> dict[str, Any]:
    """meta["split"] of the facts source."""
    return {
        "method": "facts",
        "train": f"{cfg.facts_epochs} copies of the {cfg.facts_num} facts, each epoch in its own order",
        "val": "the facts in table order",
        "test": "the facts in table order",
        "seed": cfg.seed,
        "bits_per_fact": bits_per_fact(cfg),
        "total_bits": total_bits(cfg),
        "fact_len": fact_len(cfg),
    }


def write_tokenizer(cfg: DataConfig, path: str | os.PathLike) -> None:
    """The word-level tokenizer.json of the facts vocabulary (ids as `vocabulary`), written atomically."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(vocabulary(cfg))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with atomic_path(Path(path)) as tmp:
        tok.save(str(tmp), pretty=True)


def task_docs(cfg: DataConfig) -> list[dict[str, str]]:
    """The documents of lm-eval's `mohge_facts` task: one per fact, in table order. The context is the
    end-of-text word and the key (the context every fact has in training), the continuation the value."""
    keys, values = fact_table(cfg)
    return [
        {"context": f"{cfg.eot_token} {key_text(k)}", "value": f" {value_text(v)}"}
        for k, v in zip(keys, values, strict=True)
    ]
