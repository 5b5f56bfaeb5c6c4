"""Reading prepared token files: `TokenStream` (memory-mapped tokens of one split) and its batches.

`get_batch` is a pure function of (seed, step), so a resumed run that knows only its step draws exactly the
batches it would have drawn; `iter_eval_batches` covers a split in order, scoring every token once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from mohge.config import SPLITS
from mohge.data.prepare import load_meta


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
