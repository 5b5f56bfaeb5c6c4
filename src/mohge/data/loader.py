"""Reading a prepared folder: its shards, checked against meta.json, and the sequential order of training windows.

A split's *token stream* is the concatenation of its shards in meta order (format version 2: ``meta["shards"]``,
paths relative to the folder, as mohge.data's docstring lists them). Every shard is memory-mapped, never read whole.

Checks, each refusal a ConfigError that names the shard file (one line, exit 2 through the CLIs):

* size, always, on every open: the file holds exactly ``tokens × itemsize`` bytes (its levels file ``tokens``);
* sha256, once: :func:`verify_split` hashes the shards of a split the first time a process opens them, and a
  marker file (the run's ``SCRATCH/data_verified.json``) lets a resumed training run skip what its first start
  already hashed.

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
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mohge.config import SPLITS, ConfigError
from mohge.core.atomic import write_json_atomic

HASH_CHUNK = 1 << 24  # 16 MiB per read while hashing a shard: memory stays flat on shards of any size


@dataclass(frozen=True)
class Shard:
    """One token file of a split as meta.json describes it (paths relative to the prepared folder)."""

    file: str
    tokens: int
    sha256: str | None
    levels_file: str | None = None
    levels_sha256: str | None = None


def split_shards(data_dir: str | os.PathLike, meta: dict[str, Any], split: str) -> list[Shard]:
    """The shards of ``split`` in order, from a meta.json of format version 2."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    version = meta.get("format_version", 1)
    if version != 2:
        raise ConfigError(
            f"{Path(data_dir) / 'meta.json'}: format_version={version!r}, this reader knows 2 (sharded): "
            "prepare the data again (python -m mohge.data)"
        )
    entries = meta.get("shards", {}).get(split)
    if not entries:
        raise ConfigError(f"{Path(data_dir) / 'meta.json'}: no shards listed for split {split!r}")
    shards = []
    for e in entries:
        lv = e.get("levels") or {}
        shards.append(Shard(e["file"], int(e["tokens"]), e.get("sha256"), lv.get("file"), lv.get("sha256")))
    if sum(sh.tokens for sh in shards) != meta["tokens"][split]:
        raise ConfigError(
            f"{Path(data_dir) / 'meta.json'}: the shards of {split!r} hold {sum(sh.tokens for sh in shards)} "
            f"tokens, meta['tokens'] says {meta['tokens'][split]}"
        )
    return shards


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


# Files this process has hashed and found as meta.json says: (resolved path, size, mtime_ns, sha256).
_VERIFIED: set[tuple[str, int, int, str]] = set()


def _stamp(path: Path, sha: str) -> tuple[str, int, int, str]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, sha)


def _files_of(data_dir: Path, meta: dict[str, Any], split: str) -> list[tuple[Path, str | None]]:
    pairs = []
    for sh in split_shards(data_dir, meta, split):
        pairs.append((data_dir / sh.file, sh.sha256))
        if sh.levels_file is not None:
            pairs.append((data_dir / sh.levels_file, sh.levels_sha256))
    return pairs


def verify_split(data_dir: str | os.PathLike, split: str, meta: dict[str, Any] | None = None) -> None:
    """Hash every shard (and levels file) of ``split`` against meta.json, once per process and file version;
    a mismatch is a ConfigError naming the file and both hashes. A file without a recorded sha256 is skipped."""
    data_dir = Path(data_dir)
    meta = meta if meta is not None else json.loads((data_dir / "meta.json").read_text())
    todo = []
    for path, expected in _files_of(data_dir, meta, split):
        if expected is None:
            continue
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


def verify_folder(data_dir: str | os.PathLike, marker: str | os.PathLike) -> None:
    """Check the token files of every split against meta.json once per run: the result is kept in ``marker``
    (in the run's scratch), so a resumed run does not read the tokens again. Sizes are still checked on every
    open (:func:`memmap_shard`)."""
    data_dir, marker = Path(data_dir), Path(marker)
    meta = json.loads((data_dir / "meta.json").read_text())
    files = {str(p.relative_to(data_dir)): sha for s in SPLITS for p, sha in _files_of(data_dir, meta, s)}
    record = {"data": str(data_dir.resolve()), "sha256": {k: v for k, v in sorted(files.items()) if v}}
    if marker.is_file() and json.loads(marker.read_text()) == record:
        return
    for s in SPLITS:
        verify_split(data_dir, s, meta)
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
