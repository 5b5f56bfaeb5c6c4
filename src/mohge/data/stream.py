"""Reading prepared token files: `TokenStream` (the memory-mapped token stream of one split) and its batches.

`TokenStream.open` reads a prepared folder through :mod:`mohge.data.loader` (format version 2: one or many shards
per split, each size-checked against meta.json). Two train orders (``train.data_order``):
`get_batch` (random) is a pure function of (seed, step), so a resumed run that knows only its step draws
exactly the batches it would have drawn; `window_batch` (sequential) reads windows by their global index
(:class:`mohge.data.loader.WindowOrder`). `iter_eval_batches` covers a split in order, scoring every token once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mohge.config import DATA_ORDERS
from mohge.core.knobs import ConfigError

from .loader import WindowOrder, check_size, concat, memmap_shard, split_shards, verify_split
from .prepare import load_meta


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ConfigError(f"{path}: {size} bytes, not a whole number of {dtype.name} tokens (truncated?)")
    if size == 0:  # mmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class TokenStream:
    """Tokens of one split, memory-mapped: one file, or (``open``) the split's shards in order as one token
    stream (`tokens` is then a :class:`mohge.data.loader.ShardedArray`). Shapes: B batch size, S sequence length.

    `get_batch` samples B random windows of the whole stream; the batch is a pure function of (generator_seed,
    step), so a resumed run that knows only its step draws exactly the batches it would have drawn.
    `window_batch` reads B sequential windows by global index (windows never cross a shard boundary).
    `iter_eval_batches` covers the split sequentially, scoring every token after the first exactly once.
    """

    def __init__(self, path: str | os.PathLike, dtype: str = "uint16", levels_path: str | os.PathLike | None = None):
        self.path = Path(path)
        self.tokens = _memmap(self.path, np.dtype(dtype))
        self.levels = None if levels_path is None else _memmap(Path(levels_path), np.dtype(np.int8))
        if self.levels is not None and len(self.levels) != len(self.tokens):
            raise ConfigError(f"{levels_path}: {len(self.levels)} levels for {len(self.tokens)} tokens in {path}")
        self.shard_tokens, self.shard_names = [len(self.tokens)], [self.path.name]
        self._orders: dict[tuple[int, int], WindowOrder] = {}

    @classmethod
    def open(cls, data_dir: str | os.PathLike, split: str, verify: bool = False) -> TokenStream:
        """The stream of `split` in a folder written by `prepare`: its shards in order, memory-mapped, each
        size-checked against meta.json (a mismatch names the file). With ``verify``, also their sha256, once per
        process (:func:`mohge.data.loader.verify_split`; training checks every split at its start instead)."""
        data_dir = Path(data_dir)
        meta = load_meta(data_dir)
        shards, dtype = split_shards(data_dir, meta, split), np.dtype(meta["dtype"])
        if verify:
            for sh in shards:  # sizes first: a truncated shard is named without hashing the others
                check_size(data_dir / sh.file, sh.tokens, dtype.itemsize)
            verify_split(data_dir, split, meta)
        with_levels = [sh.levels_file is not None for sh in shards]
        if any(with_levels) and not all(with_levels):
            raise ConfigError(f"{data_dir / 'meta.json'}: split {split!r} has levels for some shards only")
        stream = cls.__new__(cls)
        stream.path = data_dir / shards[0].file  # the first shard: what messages name for the split
        stream.tokens = concat([memmap_shard(data_dir / sh.file, dtype, sh.tokens) for sh in shards])
        stream.levels = None
        if all(with_levels):
            int8 = np.dtype(np.int8)
            stream.levels = concat([memmap_shard(data_dir / sh.levels_file, int8, sh.tokens) for sh in shards])
        stream.shard_tokens, stream.shard_names = [sh.tokens for sh in shards], [sh.file for sh in shards]
        stream._orders = {}
        return stream

    def __len__(self) -> int:
        return len(self.tokens)

    def get_batch(
        self, step: int, batch_size: int, seq_len: int, generator_seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_BS, y_BS) int64 with y_BS[b, t] = x_BS[b, t + 1] in the token stream (next-token targets)."""
        if step < 0 or generator_seed < 0:
            raise ConfigError(f"step={step}, generator_seed={generator_seed}: expected non-negative integers")
        if len(self) < seq_len + 1:
            raise ConfigError(f"{self.path}: {len(self)} tokens, a window needs seq_len + 1 = {seq_len + 1}")
        # A SeedSequence of both numbers: (seed, step) pairs never share a stream, unlike seed + step.
        rng = np.random.default_rng([generator_seed, step])
        starts_B = rng.integers(0, len(self) - seq_len, size=batch_size)
        window_BS1 = self.tokens[starts_B[:, None] + np.arange(seq_len + 1)].astype(np.int64)
        return torch.from_numpy(window_BS1[:, :-1].copy()), torch.from_numpy(window_BS1[:, 1:].copy())

    def window_order(self, seq_len: int, seed: int) -> WindowOrder:
        """The sequential order of this split's windows (cached per (seq_len, seed))."""
        if (seq_len, seed) not in self._orders:
            self._orders[seq_len, seed] = WindowOrder(self.shard_tokens, seq_len, seed, self.shard_names)
        return self._orders[seq_len, seed]

    def window_batch(
        self, first_window: int, batch_size: int, seq_len: int, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_BS, y_BS) int64 of the sequential windows ``first_window .. first_window + batch_size - 1``
        (global indices across epochs, see :class:`mohge.data.loader.WindowOrder`)."""
        starts_B = self.window_order(seq_len, seed).starts(first_window, batch_size)
        window_BS1 = self.tokens[starts_B[:, None] + np.arange(seq_len + 1)].astype(np.int64)
        return torch.from_numpy(window_BS1[:, :-1].copy()), torch.from_numpy(window_BS1[:, 1:].copy())

    def iter_eval_batches(self, batch_size: int, seq_len: int, with_levels: bool = False) -> Iterator[tuple]:
        """Non-overlapping windows in order: window k has inputs tokens[kS : kS+S] and targets
        tokens[kS+1 : kS+S+1]. Up to `batch_size` full windows per batch; a final shorter window (the
        remainder) comes alone as a (1, r) batch. Yields (x_BS, y_BS), or (x_BS, y_BS, levels_BS) with
        the level of each target when `with_levels` (graded data only)."""
        if with_levels and self.levels is None:
            raise ConfigError(f"{self.path}: no levels file beside it")
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


class TrainBatches:
    """The train batches of one data-parallel rank ``rank`` of ``world`` under ``train.data_order``.

    ``random``: step s reads ``stream.get_batch(s, B, S, seed * 1000 + rank)``, a pure function of (seed, step,
    rank); its position is the step. ``sequential``: step s reads the windows ``[p + rank B, p + (rank + 1) B)``
    where ``p = start_window + (s - start_step) B world`` is the global window position at step s; ``p`` is what
    a checkpoint keeps (``position``), so a run resumed at ``start_step`` from ``start_window`` on any world
    size reads the windows that come next, none skipped, none twice.
    """

    def __init__(
        self,
        stream: TokenStream,
        order: str,
        batch_size: int,
        seq_len: int,
        seed: int,
        rank: int,
        world: int,
        start_step: int = 0,
        start_window: int = 0,
    ):
        if order not in DATA_ORDERS:
            raise ConfigError(f"train.data_order={order!r}: expected one of {DATA_ORDERS}")
        self.stream, self.order, self.B, self.S, self.seed = stream, order, batch_size, seq_len, seed
        self.rank, self.world, self.start_step, self.start_window = rank, world, start_step, start_window
        if order == "sequential":
            stream.window_order(seq_len, seed)  # a split without a whole window is refused before the first step

    def window_at(self, step: int) -> int:
        """The global window position at the start of ``step`` (sequential order)."""
        return self.start_window + (step - self.start_step) * self.B * self.world

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_BS, y_BS) of this rank at 0-based ``step``."""
        if self.order == "random":
            return self.stream.get_batch(step, self.B, self.S, self.seed * 1000 + self.rank)
        return self.stream.window_batch(self.window_at(step) + self.rank * self.B, self.B, self.S, self.seed)

    def position(self, step: int) -> dict[str, Any]:
        """The data position before ``step`` (after ``step`` steps), as checkpoints and log rows record it."""
        if self.order == "random":
            return {"order": "random", "step": step}
        order = self.stream.window_order(self.S, self.seed)
        pos = order.position(self.window_at(step))
        return {"order": "sequential", **pos, "windows_per_epoch": order.per_epoch}
