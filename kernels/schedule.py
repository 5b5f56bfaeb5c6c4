"""Host-side tile schedule for the grouped expert GEMMs (no Triton here, so it is testable anywhere).

Experts of different width classes and ragged token counts cannot share one regular grid. Instead the
host writes, once per launch, two small int64 tables that the kernels read (the CUTLASS grouped-GEMM idea):

* a **problem table** ``desc [E, NF]``: one row per expert holding where its operands live (element offsets
  into the shared row buffers, leading dimensions, the inner dimension, the expert's weight address) and
  how many rows (tokens) it has;
* a **tile list** ``tiles [n_tiles, 3]``: ``(expert, m0, n0)`` for every output tile. An expert with C rows and
  N output columns gets ceil(C/BM) * ceil(N/BN) tiles, row-block fastest so that consecutive programs
  share the same weight tile in L2. An expert with no token gets no tile in the row GEMMs, and
  ceil(N/BM) * ceil(M/BN) tiles in the weight-gradient GEMMs (which then write zeros).

The launch grid is exactly ``n_tiles``: no program exits early, whatever the widths.

Row buffers. Sorted rows (x gathered by expert, expert outputs) are ``[A, D]`` and expert e owns rows
``[row0_e, row0_e + C_e)``. Width-dependent buffers (the activation, the pre-activation) are ragged:
flat 1-D buffers where expert e's block ``[C_e, H_e]`` starts at ``rag_e = sum_{e' < e} C_e' * H_e'``
(``[C_e, 2 H_e]`` at ``2 rag_e`` for the pre-activation). Weights stay in the caller's per-class tensors;
each expert's slice is addressed by its raw device address (Triton's grouped-GEMM tutorial pattern), so
nothing is copied or concatenated.

Legend: E experts, C tokens of one expert, A routed rows, D model width, H expert width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class Blocks:
    """Tile shape and launch options of the grouped GEMMs (all blocks >= 16: a GPU dot needs it)."""

    bm: int
    bn: int
    bk: int
    num_warps: int
    num_stages: int


def gemm_blocks(dtype: torch.dtype, interpret: bool) -> Blocks:
    """Block sizes: small in the interpreter (several tiles per expert on test shapes), MMA-sized on GPU."""
    if interpret:
        return Blocks(16, 16, 16, 4, 1)
    if dtype == torch.float32:
        return Blocks(64, 64, 32, 4, 2)
    return Blocks(128, 128, 64, 8, 3)


@dataclass(frozen=True)
class ExpertLayout:
    """Where each expert's rows live, from the per-expert token counts (all numpy int64 [E])."""

    count: np.ndarray  # C_e
    width: np.ndarray  # H_e
    row0: np.ndarray  # first sorted row of expert e
    rag: np.ndarray  # start of expert e's [C_e, H_e] block in a ragged buffer
    rag_total: int  # sum_e C_e * H_e
    d_model: int

    @property
    def num_rows(self) -> int:
        return int(self.count.sum())

    @property
    def aligned(self) -> bool:
        """All offsets and leading dimensions are multiples of 8 elements (lets the kernels vectorise)."""
        return self.d_model % 8 == 0 and bool(np.all(self.width % 8 == 0))


def class_widths(ws, halve: bool = False) -> np.ndarray:
    """Per-expert width H_e (class-major) from per-class weights [n_c, 2H_c, D] (halve) or [n_c, D, H_c]."""
    if halve:
        return np.concatenate([np.full(w.shape[0], w.shape[1] // 2, np.int64) for w in ws])
    return np.concatenate([np.full(w.shape[0], w.shape[2], np.int64) for w in ws])


def expert_layout(counts: list[int], width_E: np.ndarray, d_model: int) -> ExpertLayout:
    count = np.asarray(counts, dtype=np.int64)
    if count.shape != width_E.shape:
        raise ValueError(f"{count.size} token counts for {width_E.size} experts")
    if np.any(count < 0):
        raise ValueError(f"token counts must be >= 0, got {counts}")
    row0 = np.cumsum(count) - count
    sizes = count * width_E
    rag = np.cumsum(sizes) - sizes
    return ExpertLayout(count, width_E, row0, rag, int(sizes.sum()), d_model)


def expert_blocks(ws, counts: list[int], halve: bool = False) -> list[tuple[int, int, int, int, int, int]]:
    """(class c, member j, first sorted row, rows C, ragged offset, width H) of every expert, class-major: what the
    pure-torch references of the ops walk, with the same layout rules as the kernels."""
    width_E = class_widths(ws, halve)
    lay = expert_layout(counts, width_E, 0)
    members = [(c, j) for c, w in enumerate(ws) for j in range(w.shape[0])]
    return [
        (c, j, int(lay.row0[e]), int(lay.count[e]), int(lay.rag[e]), int(width_E[e]))
        for e, (c, j) in enumerate(members)
    ]


def tile_list(m_E: np.ndarray, n_E: np.ndarray, bm: int, bn: int) -> np.ndarray:
    """(expert, m0, n0) of every [bm, bn] tile of each expert's [m_E, n_E] output, row block fastest."""
    nm = -(-m_E // bm)
    nn = -(-n_E // bn)
    per = nm * nn
    e = np.repeat(np.arange(m_E.size, dtype=np.int64), per)
    local = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    return np.stack([e, (local % nm[e]) * bm, (local // nm[e]) * bn], axis=1)


def expert_addresses(ws) -> tuple[np.ndarray, bool]:
    """Device address of every expert's weight slice (class-major), and whether all are 16-byte aligned."""
    addr = np.concatenate(
        [w.data_ptr() + np.arange(w.shape[0], dtype=np.int64) * w.stride(0) * w.element_size() for w in ws]
    )
    return addr, bool(np.all(addr % 16 == 0))


def to_device(desc: np.ndarray, tiles: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
    """One host-to-device copy for both tables; returns (desc, tiles) views of it.

    non_blocking: a blocking copy would synchronise the stream before every launch. From pageable memory
    cudaMemcpyAsync stages the host buffer before it returns, so freeing ``flat`` afterwards is safe.
    """
    flat = np.concatenate([desc.reshape(-1), tiles.reshape(-1)]).astype(np.int64)
    buf = torch.from_numpy(flat).to(device, non_blocking=True)
    return buf[: desc.size], buf[desc.size :]


# ----------------------------------------------------------------------------------------------------
# The same schedule built on the device (the capturable path, :mod:`.capture`): no host copy of the counts
# ----------------------------------------------------------------------------------------------------


def tile_bound(n_E: np.ndarray, rows_total: int, bm: int, bn: int) -> int:
    """An upper bound on the tiles of row GEMMs whose experts share ``rows_total`` rows in any split, expert e's
    output ``n_E[e]`` columns wide: sum_e ceil(C_e / bm) <= ceil(rows_total / bm) + E - 1 row blocks (ceil(a/b) +
    ceil(c/b) <= ceil((a+c)/b) + 1), each at most max_e ceil(n_E / bn) column blocks wide."""
    if n_E.size == 0:
        return 0
    return int(-(-n_E.max() // bn)) * (-(-rows_total // bm) + n_E.size - 1)


def device_tiles(m_E: Tensor, nn_E: Tensor, bm: int, bn: int, bound: int) -> Tensor:
    """:func:`tile_list` computed on the device from per-expert row counts ``m_E`` (int64, on the device) and column
    blocks ``nn_E`` (int64 [E] on the device, ceil(N_e / bn)), padded to ``bound`` rows: int64 [bound, 3] of (expert,
    m0, n0), the real tiles first and in :func:`tile_list`'s order, then surplus rows of expert -1, whose programs
    return at once. Every op is a device op of a shape fixed by ``bound``: a CUDA graph can capture it."""
    nm_E = torch.div(m_E + (bm - 1), bm, rounding_mode="floor")
    per_E = nm_E * nn_E
    end_E = torch.cumsum(per_E, 0)
    i = torch.arange(bound, device=m_E.device, dtype=torch.int64)
    e = torch.searchsorted(end_E, i, right=True)
    real = e < m_E.numel()
    e = e.clamp(max=m_E.numel() - 1)
    local = i - (end_E - per_E)[e]
    nm = nm_E[e].clamp(min=1)
    n0 = torch.div(local, nm, rounding_mode="floor") * bn
    return torch.stack([torch.where(real, e, -1), (local % nm) * bm, n0], 1)
