"""Reading a prepared folder: its shards, checked against meta.json, and the sequential order of training windows.

A split's *token stream* is the concatenation of its shards in meta order (format version 2: ``meta["shards"]``,
paths relative to the folder, as mohge.data's docstring lists them). Every shard is memory-mapped, never read whole.

Checks, each refusal a ConfigError that names the shard file (one line, exit 2 through the CLIs):

* size, always, on every open: the file holds exactly ``tokens × itemsize`` bytes (its levels file ``tokens``);
* sha256, once per file version: :func:`verify_split` hashes the shards of a split the first time a process
  opens them; a training run keeps what it hashed in ``SCRATCH/data_verified.json`` (:func:`verify_folder`),
  keyed per file by size, mtime_ns, ctime_ns and the expected sha256, so a resume re-hashes exactly the files
  that changed since (a shard rewritten in place, same size, is hashed again and refused);
* the manifest itself: meta.json is read within bounds (a truncated one is named); every entry must name a file
  inside the folder (no absolute path, no ``..``) and carry its sha256, and a reader refuses a meta.json that
  does not list a file it needs (``files``: tokenizer.json, the held-out text and documents; :func:`sealed_file`).

Sequential order (``train.data_order: sequential``, :class:`WindowOrder`). A *window* is ``seq_len + 1`` tokens
of one shard at offset ``k × seq_len`` (inputs and next-token targets); windows never cross a shard boundary, as
documents never do, and the last ``< seq_len + 1`` tokens of a shard start no window. An epoch reads every
window once, shard after shard, in an order of the shards permuted per epoch by the seed; the window at global
index ``g`` (counted from the first step, across epochs) is a pure function of (shard sizes, seq_len, seed, g).
Step ``s`` of a data-parallel world of ``W`` ranks reads the ``B × W`` windows from the position ``p`` it starts
at; rank ``r`` reads ``[p + r B, p + (r + 1) B)``. The position is what a checkpoint keeps, so a resumed run, on
any world size, goes on with the window after the last one read.

Legend: B batch size (sequences per rank), S sequence length, N tokens.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from tqdm import tqdm

from mohge.config import SPLITS, ConfigError
from mohge.core.atomic import sha256_file, write_json_atomic
from mohge.core.knobs import load_json_file

HEX64 = re.compile(r"^[0-9a-f]{64}$")

HASH_CHUNK = 1 << 24  # 16 MiB per read while hashing a shard: memory stays flat on shards of any size


@dataclass(frozen=True)
class Shard:
    """One token file of a split as meta.json describes it (paths relative to the prepared folder)."""

    file: str
    tokens: int
    sha256: str | None
    levels_file: str | None = None
    levels_sha256: str | None = None


def read_meta(data_dir: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared folder, read within bounds; missing, truncated or malformed is refused by name."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: run `python -m mohge.data` for {data_dir} first")
    meta = load_json_file(path, "meta.json")
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: expected a mapping, got {type(meta).__name__}; prepare the data again")
    return meta


def inside(folder: Path, rel: Any, where: str) -> Path:
    """``folder / rel`` when ``rel`` is a relative path inside ``folder`` (no absolute path, no ``..``, no
    backslash); else a ConfigError naming the manifest entry ``where``."""
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
    if not parts or rel.startswith("/") or "\\" in rel or ".." in parts or Path(rel).is_absolute():
        raise ConfigError(f"{where}={rel!r}: not a file inside {folder}; prepare the data again")
    return folder / rel


def sealed_hash(value: Any, where: str) -> str:
    """A manifest entry's sha256 (64 hex digits); an entry without one is refused: it would not be checked."""
    if not isinstance(value, str) or not HEX64.fullmatch(value):
        raise ConfigError(f"{where}={value!r}: no sha256, so the file is not sealed; prepare the data again")
    return value


def split_shards(data_dir: str | os.PathLike, meta: dict[str, Any], split: str) -> list[Shard]:
    """The shards of ``split`` in order, from a meta.json of format version 2; every entry must name a file
    inside the folder and carry its sha256 (else a ConfigError naming the entry)."""
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: expected one of {SPLITS}")
    data_dir = Path(data_dir)
    where = data_dir / "meta.json"
    version = meta.get("format_version", 1)
    if version != 2:
        raise ConfigError(
            f"{where}: format_version={version!r}, this reader knows 2 (sharded): "
            "prepare the data again (python -m mohge.data)"
        )
    entries = (meta.get("shards") or {}).get(split)
    if not entries or not isinstance(entries, list):
        raise ConfigError(f"{where}: no shards listed for split {split!r}")
    shards = []
    for i, e in enumerate(entries):
        at = f"{where}: shards.{split}[{i}]"
        if not isinstance(e, dict) or isinstance(e.get("tokens"), bool) or not isinstance(e.get("tokens"), int):
            raise ConfigError(f"{at}: expected {{file, tokens, sha256, ...}}; prepare the data again")
        inside(data_dir, e.get("file"), f"{at}.file")
        sha = sealed_hash(e.get("sha256"), f"{at}.sha256")
        lv = e.get("levels") or {}
        if lv:
            inside(data_dir, lv.get("file"), f"{at}.levels.file")
            sealed_hash(lv.get("sha256"), f"{at}.levels.sha256")
        shards.append(Shard(e["file"], int(e["tokens"]), sha, lv.get("file"), lv.get("sha256")))
    if sum(sh.tokens for sh in shards) != (meta.get("tokens") or {}).get(split):
        raise ConfigError(
            f"{where}: the shards of {split!r} hold {sum(sh.tokens for sh in shards)} "
            f"tokens, meta['tokens'] says {(meta.get('tokens') or {}).get(split)}"
        )
    return shards


def sealed_entry(data_dir: str | os.PathLike, meta: dict[str, Any], name: str) -> tuple[Path, int, str]:
    """(path, bytes, sha256) of a non-token file meta.json seals (``files``: tokenizer.json, {val,test}.txt,
    {val,test}_docs.jsonl); a meta.json that does not list it, or lists it without size or hash, is refused."""
    data_dir = Path(data_dir)
    where = data_dir / "meta.json"
    entry = (meta.get("files") or {}).get(name)
    if not isinstance(entry, dict):
        raise ConfigError(
            f"{where} does not list {name} (its size and sha256): a folder prepared before every input was "
            "sealed, or an edited manifest; prepare the data again"
        )
    path = inside(data_dir, entry.get("file", name), f"{where}: files.{name}.file")
    size = entry.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ConfigError(f"{where}: files.{name}.bytes={size!r}: no size; prepare the data again")
    return path, size, sealed_hash(entry.get("sha256"), f"{where}: files.{name}.sha256")


def sealed_file(data_dir: str | os.PathLike, name: str, meta: dict[str, Any] | None = None) -> Path:
    """The path of ``name`` after checking it against meta.json (size, then sha256 once per process and file
    version): what the task builder, the trainer and the evaluation read instead of the bare file."""
    meta = meta if meta is not None else read_meta(data_dir)
    path, size, expected = sealed_entry(data_dir, meta, name)
    if not path.is_file():
        raise ConfigError(f"{path} is missing (listed in {Path(data_dir) / 'meta.json'})")
    if (have := path.stat().st_size) != size:
        raise _refuse(path, f"{have} bytes, meta.json expects {size}")
    if _stamp(path, expected) not in _VERIFIED:
        if (actual := sha256_file(path)) != expected:
            raise _refuse(path, f"sha256 {actual} ({size} bytes), meta.json expects {expected}")
        _VERIFIED.add(_stamp(path, expected))
    return path


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path} was changed or truncated: {why}; prepare the data again")


def check_size(path: Path, tokens: int, itemsize: int) -> None:
    """The file holds exactly ``tokens`` items of ``itemsize`` bytes (else a ConfigError naming it)."""
    if not path.is_file():
        raise ConfigError(f"{path} is missing (listed in {path.parent / 'meta.json'})")
    size = path.stat().st_size
    if size != tokens * itemsize:
        raise _refuse(path, f"{size} bytes, meta.json says {tokens} tokens of {itemsize} bytes ({tokens * itemsize})")


def memmap_shard(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """The tokens of one shard, memory-mapped read-only, after the size check."""
    check_size(path, tokens, dtype.itemsize)
    if tokens == 0:  # mmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _sha256(path: Path, bar: tqdm) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


# Files this process has hashed and found as meta.json says: (resolved path, size, mtime_ns, ctime_ns, sha256).
# ctime_ns too: a rewrite that puts the old mtime back (touch -d) still moves the ctime, which no user can set.
_VERIFIED: set[tuple[str, int, int, int, str]] = set()


def _stamp(path: Path, sha: str) -> tuple[str, int, int, int, str]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha)


def _files_of(data_dir: Path, meta: dict[str, Any], split: str) -> list[tuple[Path, str | None]]:
    pairs = []
    for sh in split_shards(data_dir, meta, split):
        pairs.append((data_dir / sh.file, sh.sha256))
        if sh.levels_file is not None:
            pairs.append((data_dir / sh.levels_file, sh.levels_sha256))
    return pairs


def verify_split(data_dir: str | os.PathLike, split: str, meta: dict[str, Any] | None = None) -> None:
    """Hash every shard (and levels file) of ``split`` against meta.json, once per process and file version;
    a mismatch is a ConfigError naming the file and both hashes (an entry without a sha256 is refused by
    :func:`split_shards`)."""
    data_dir = Path(data_dir)
    meta = meta if meta is not None else read_meta(data_dir)
    todo = []
    for path, expected in _files_of(data_dir, meta, split):
        if not path.is_file():
            raise ConfigError(f"{path} is missing (listed in {data_dir / 'meta.json'})")
        if _stamp(path, expected) not in _VERIFIED:
            todo.append((path, expected))
    total = sum(p.stat().st_size for p, _ in todo)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"sha256 {split}", disable=None, leave=False) as bar:
        for path, expected in todo:
            actual = _sha256(path, bar)
            if actual != expected:
                raise _refuse(path, f"sha256 {actual} ({path.stat().st_size} bytes), meta.json expects {expected}")
            _VERIFIED.add(_stamp(path, expected))


def _file_record(path: Path, sha: str) -> dict[str, Any]:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "sha256": sha}


def verify_folder(data_dir: str | os.PathLike, marker: str | os.PathLike, required: tuple[str, ...] = ()) -> None:
    """Check every token file of every split, and the sealed files ``required`` (``files`` of meta.json, e.g.
    tokenizer.json), against meta.json; ``marker`` (in the run's scratch) keeps per file its size, mtime_ns,
    ctime_ns and the sha256 found, so a resumed run hashes again exactly the files that changed since (any change
    of size, mtime or ctime, or of meta.json itself). Sizes are still checked on every open (:func:`memmap_shard`)."""
    data_dir, marker = Path(data_dir), Path(marker)
    meta = read_meta(data_dir)
    want: dict[str, tuple[Path, str, int | None]] = {}
    for s in SPLITS:
        for path, sha in _files_of(data_dir, meta, s):
            want[str(path.relative_to(data_dir))] = (path, sha, None)
    for name in required:
        path, size, sha = sealed_entry(data_dir, meta, name)
        want[name] = (path, sha, size)
    meta_rec = _file_record(data_dir / "meta.json", hashlib.sha256((data_dir / "meta.json").read_bytes()).hexdigest())
    old: dict[str, Any] = {}
    if marker.is_file():
        try:
            prev = load_json_file(marker, "verification record")
        except ConfigError:
            prev = {}
        if isinstance(prev, dict) and prev.get("data") == str(data_dir.resolve()) and prev.get("meta") == meta_rec:
            old = prev.get("files") or {}
    files: dict[str, Any] = {}
    todo = []
    for rel, (path, sha, size) in sorted(want.items()):
        if not path.is_file():
            raise ConfigError(f"{path} is missing (listed in {data_dir / 'meta.json'})")
        rec = _file_record(path, sha)
        if size is not None and rec["bytes"] != size:
            raise _refuse(path, f"{rec['bytes']} bytes, meta.json expects {size}")
        if old.get(rel) == rec:
            files[rel] = rec
        else:
            todo.append((rel, path, sha))
    total = sum(p.stat().st_size for _, p, _ in todo)
    with tqdm(total=total, unit="B", unit_scale=True, desc="sha256", disable=None, leave=False) as bar:
        for rel, path, expected in todo:
            actual = _sha256(path, bar)
            if actual != expected:
                raise _refuse(path, f"sha256 {actual} ({path.stat().st_size} bytes), meta.json expects {expected}")
            files[rel] = _file_record(path, expected)
            _VERIFIED.add(_stamp(path, expected))
    record = {"data": str(data_dir.resolve()), "meta": meta_rec, "files": files}
    if todo or not marker.is_file() or old != files:
        write_json_atomic(marker, record)


# ----------------------------------------------------------------------------------------------------
# Many shards as one array
# ----------------------------------------------------------------------------------------------------


class ShardedArray:
    """Read-only concatenation of 1-D arrays (memory-mapped shards) without copying them. Supports ``len``, int and
    fancy (integer array) indexing, and contiguous slices (a slice inside one part is that part's view)."""

    def __init__(self, parts: list[np.ndarray]):
        assert parts and len({p.dtype for p in parts}) == 1, "one dtype for every part"
        self.parts = parts
        self.bounds = np.cumsum([0] + [len(p) for p in parts])  # part i holds [bounds[i], bounds[i + 1])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.concatenate(self.parts)
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(len(self))
            if step != 1:
                raise IndexError("ShardedArray: only contiguous slices")
            return self._slice(lo, max(lo, hi))
        if isinstance(key, int | np.integer):
            i = int(key) + (len(self) if key < 0 else 0)
            p = int(np.searchsorted(self.bounds, i, side="right")) - 1
            return self.parts[p][i - self.bounds[p]]
        idx = np.asarray(key, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} items")
        part = np.searchsorted(self.bounds, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for p in np.unique(part):
            sel = part == p
            out[sel] = self.parts[p][flat[sel] - self.bounds[p]]
        return out.reshape(idx.shape)

    def _slice(self, lo: int, hi: int) -> np.ndarray | ShardedArray:
        pieces = []
        for p, arr in enumerate(self.parts):
            a, b = max(lo, self.bounds[p]), min(hi, self.bounds[p + 1])
            if a < b:
                pieces.append(arr[a - self.bounds[p] : b - self.bounds[p]])
        if not pieces:
            return self.parts[0][:0]
        return pieces[0] if len(pieces) == 1 else ShardedArray(pieces)


def concat(parts: list[np.ndarray]) -> np.ndarray | ShardedArray:
    """One shard: itself (so a format-1 folder reads exactly as before); several: a :class:`ShardedArray`."""
    return parts[0] if len(parts) == 1 else ShardedArray(parts)


# ----------------------------------------------------------------------------------------------------
# Sequential order
# ----------------------------------------------------------------------------------------------------


class WindowOrder:
    """Windows of ``seq_len + 1`` tokens in shard order, shards permuted per epoch by ``seed`` (module docstring).

    ``shard_tokens[i]`` is the size of shard i; ``names[i]`` its file (for the human-readable position)."""

    def __init__(self, shard_tokens: list[int], seq_len: int, seed: int, names: list[str] | None = None):
        self.seq_len, self.seed = seq_len, seed
        self.names = names or [str(i) for i in range(len(shard_tokens))]
        # windows of shard i: offsets 0, S, 2S, ... while offset + S + 1 <= tokens
        self.windows = np.array([max(0, (n - 1) // seq_len) for n in shard_tokens], dtype=np.int64)
        self.bases = np.cumsum([0] + list(shard_tokens))[:-1]  # shard i starts at bases[i] in the token stream
        self.per_epoch = int(self.windows.sum())
        if self.per_epoch == 0:
            raise ConfigError(
                f"data.seq_len={seq_len}: no shard of the split has seq_len + 1 = {seq_len + 1} tokens "
                f"(shard sizes {list(shard_tokens)[:8]})"
            )
        self._epoch: tuple[int, np.ndarray, np.ndarray] | None = None

    def _shard_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(shards in this epoch's order, cumulative windows before each of them)."""
        if self._epoch is None or self._epoch[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.windows))
            self._epoch = (epoch, order, np.cumsum(self.windows[order]))
        return self._epoch[1], self._epoch[2]

    def locate(self, g: int) -> tuple[int, int, int]:
        """(epoch, shard index, token offset in the shard) of global window ``g``."""
        if g < 0:
            raise ValueError(f"window {g}: expected a non-negative index")
        epoch, i = divmod(int(g), self.per_epoch)
        order, ends = self._shard_order(epoch)
        k = int(np.searchsorted(ends, i, side="right"))  # the k-th shard of the epoch holds window i
        before = int(ends[k - 1]) if k else 0
        return epoch, int(order[k]), (i - before) * self.seq_len

    def starts(self, first: int, count: int) -> np.ndarray:
        """Token-stream offsets of windows ``first .. first + count - 1``."""
        out = np.empty(count, dtype=np.int64)
        for j in range(count):
            _, shard, offset = self.locate(first + j)
            out[j] = self.bases[shard] + offset
        return out

    def position(self, g: int) -> dict[str, Any]:
        """The position before window ``g``, for checkpoints and logs: ``window`` is the one that counts; epoch,
        shard (its file) and offset (tokens into it) say where that is."""
        epoch, shard, offset = self.locate(g)
        return {"window": int(g), "epoch": epoch, "shard": self.names[shard], "offset": offset}
