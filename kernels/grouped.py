"""What the grouped expert GEMMs share: device-side problem-table readers, and the host-side launch.

The three grouped GEMM ops (:mod:`.up_swiglu`, :mod:`.grouped_mm`, :mod:`.wgrad`) each read a per-expert problem
table and a tile list that the host builds (:mod:`.schedule`, which has the layout and tile rules). This module
holds the ``@triton.jit`` helpers their kernels call (reading a table row, a tile, a weight address; the dot
with the interpreter's bf16 workaround) and the host side of every launch (checking a row buffer against the
weights, building the table, choosing blocks, launching over exactly the tile list).

Accumulation is fp32 for every input dtype. fp32 inputs use IEEE fp32 products (no TF32), to match torch.
Legend: A routed rows (sorted by expert), C tokens of one expert, D model width, E experts, H expert width.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .schedule import ExpertLayout, class_widths, expert_layout, gemm_blocks, tile_list, to_device

Tensor = torch.Tensor

# Problem table columns of the row GEMMs (int64 [E, 9]); offsets and leading dims are in elements.
ROW_FIELDS = ("a_off", "lda", "kdim", "b_addr", "ldb", "ncol", "c_off", "ldc", "rows")
# Problem table columns of the weight-gradient GEMM (int64 [E, 8]).
WGRAD_FIELDS = ("g_off", "ldg", "x_off", "ldx", "rows", "ncol", "mcol", "out_addr")


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # The interpreter's bf16 dot is wrong: upcast there (UPCAST is true only when interpreting).
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def load_hinted(ptr, HINT: tl.constexpr):
    # Offsets and leading dims are multiples of 8 elements when the host says so: lets loads vectorise.
    # (The hint must sit on the load itself: a multiple_of on a function argument is lost on inlining.)
    v = tl.load(ptr)
    if HINT:
        v = tl.multiple_of(v, 8)
    return v


@triton.jit
def load_tile(tile_ptr, BM: tl.constexpr, BN: tl.constexpr):
    # This program's (expert, first row, first column); tile starts are multiples of the block sizes.
    t = tile_ptr + 3 * tl.program_id(0)
    return tl.load(t), tl.multiple_of(tl.load(t + 1), BM), tl.multiple_of(tl.load(t + 2), BN)


@triton.jit
def row_problem(desc_ptr, e, HINT: tl.constexpr):
    d = desc_ptr + e * 9
    a_off = load_hinted(d + 0, HINT)
    lda = load_hinted(d + 1, HINT)
    kdim = load_hinted(d + 2, HINT)
    b_addr = tl.load(d + 3)
    ldb = load_hinted(d + 4, HINT)
    ncol = load_hinted(d + 5, HINT)
    c_off = load_hinted(d + 6, HINT)
    ldc = load_hinted(d + 7, HINT)
    rows = tl.load(d + 8)
    return a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows


@triton.jit
def weight_ptr(addr, like_ptr, HINT: tl.constexpr):
    # A raw device address from the problem table, typed like `like_ptr` (16-byte aligned under HINT).
    p = addr.to(tl.pointer_type(like_ptr.dtype.element_ty))
    if HINT:
        p = tl.multiple_of(p, 16)
    return p


# Whether these kernels run in Triton's interpreter: fixed when the @triton.jit decorators above ran (by
# TRITON_INTERPRET at import time), so ask the decorated object rather than the environment now.
INTERPRET = not isinstance(mma, triton.runtime.JITFunction)


def launch_options(dtype: torch.dtype) -> dict:
    """Constexprs shared by every launch for inputs of ``dtype``."""
    return {
        "UPCAST": INTERPRET,
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def layout(name: str, rows: Tensor, ws, counts: list[int], halve: bool, d_model: int) -> ExpertLayout:
    """Check a row buffer against the weights and counts; return the experts' layout."""
    lay = expert_layout(counts, class_widths(ws, halve), d_model)
    for w in ws:
        if w.dtype != rows.dtype or w.device != rows.device:
            raise ValueError(f"{name}: weight {w.dtype} on {w.device} != input {rows.dtype} on {rows.device}")
    if rows.dim() == 2 and tuple(rows.shape) != (lay.num_rows, d_model):
        raise ValueError(f"{name}: rows {tuple(rows.shape)} != [sum(counts)={lay.num_rows}, D={d_model}]")
    return lay


def check_ragged(name: str, t: Tensor, numel: int) -> Tensor:
    if t.dim() != 1 or t.numel() != numel:
        raise ValueError(f"{name}: ragged buffer of shape {tuple(t.shape)}, expected [{numel}]")
    return t.contiguous()


def table(fields: tuple[str, ...], **cols) -> np.ndarray:
    """Per-expert problem table int64 [E, F], columns in kernel order (scalars broadcast over experts)."""
    assert set(cols) == set(fields), (sorted(cols), fields)
    E = next(c.size for c in cols.values() if isinstance(c, np.ndarray))
    out = np.empty((E, len(fields)), dtype=np.int64)
    for i, name in enumerate(fields):
        out[:, i] = cols[name]
    return out


def launch(kernel, args, desc, m_E, n_E, dtype, hint: bool, **constexprs) -> None:
    b = gemm_blocks(dtype, INTERPRET)
    tiles = tile_list(m_E, n_E, b.bm, b.bn)
    if tiles.shape[0] == 0:
        return
    desc_t, tiles_t = to_device(desc, tiles, args[0].device)
    kernel[(tiles.shape[0],)](
        *args, desc_t, tiles_t, HINT=hint, BM=b.bm, BN=b.bn, BK=b.bk,
        num_warps=b.num_warps, num_stages=b.num_stages, **launch_options(dtype), **constexprs,
    )  # fmt: skip


def rag_total(ws, counts: list[int], halve: bool) -> int:
    return int(np.dot(np.asarray(counts, dtype=np.int64), class_widths(ws, halve)))
