"""Grouped GEMM kernels over experts of different widths and ragged token counts (Triton).

Three kernels serve the six expert projections of the SwiGLU forward and backward; each reads the
per-expert problem table and tile list built on the host by :mod:`mohge.kernels.triton_schedule`:

* ``_up_swiglu_kernel``   [a; u] = x W1_e^T for one (rows, columns) tile of both halves at once, with
  SiLU(a) * u fused in the epilogue (arXiv 2604.23108, docs/method.md §1.2); writes the activation and [a; u];
* ``_grouped_mm_kernel``  C_e = A_e B_e with B_e stored [N, K] (``B_NK``) or [K, N]; optionally the SwiGLU
  backward in the epilogue (reads [a; u], writes [da; du]);
* ``_wgrad_kernel``       dW_e = G_e^T X_e, reducing over the expert's C rows (zero rows: writes zeros).

Accumulation is fp32 for every input dtype. fp32 inputs use IEEE fp32 products (no TF32), to match torch.
Legend: C tokens of one expert, D model width, H expert width, N/M output columns, K the reduction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Problem table columns of the row GEMMs (int64 [E, 9]); offsets and leading dims are in elements.
ROW_FIELDS = ("a_off", "lda", "kdim", "b_addr", "ldb", "ncol", "c_off", "ldc", "rows")
# Problem table columns of the weight-gradient GEMM (int64 [E, 8]).
WGRAD_FIELDS = ("g_off", "ldg", "x_off", "ldx", "rows", "ncol", "mcol", "out_addr")


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # The interpreter's bf16 dot is wrong: upcast there (UPCAST is true only when interpreting).
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _load_hinted(ptr, HINT: tl.constexpr):
    # Offsets and leading dims are multiples of 8 elements when the host says so: lets loads vectorise.
    # (The hint must sit on the load itself: a multiple_of on a function argument is lost on inlining.)
    v = tl.load(ptr)
    if HINT:
        v = tl.multiple_of(v, 8)
    return v


@triton.jit
def _load_tile(tile_ptr, BM: tl.constexpr, BN: tl.constexpr):
    # This program's (expert, first row, first column); tile starts are multiples of the block sizes.
    t = tile_ptr + 3 * tl.program_id(0)
    return tl.load(t), tl.multiple_of(tl.load(t + 1), BM), tl.multiple_of(tl.load(t + 2), BN)


@triton.jit
def _row_problem(desc_ptr, e, HINT: tl.constexpr):
    d = desc_ptr + e * 9
    a_off = _load_hinted(d + 0, HINT)
    lda = _load_hinted(d + 1, HINT)
    kdim = _load_hinted(d + 2, HINT)
    b_addr = tl.load(d + 3)
    ldb = _load_hinted(d + 4, HINT)
    ncol = _load_hinted(d + 5, HINT)
    c_off = _load_hinted(d + 6, HINT)
    ldc = _load_hinted(d + 7, HINT)
    rows = tl.load(d + 8)
    return a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows


@triton.jit
def _weight_ptr(addr, like_ptr, HINT: tl.constexpr):
    # A raw device address from the problem table, typed like `like_ptr` (16-byte aligned under HINT).
    p = addr.to(tl.pointer_type(like_ptr.dtype.element_ty))
    if HINT:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def _up_swiglu_kernel(
    x_ptr, act_ptr, h_ptr, desc_ptr, tile_ptr,
    HINT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # x   [A, D] sorted rows; expert e's rows at a_off = row0_e * D, lda = D, kdim = D
    # W1_e [2H, D] at b_addr (ldb = D): rows [0, H) give a, rows [H, 2H) give u; ncol = H
    # act ragged [C, H] at c_off = rag_e (ldc = H);  h ragged [C, 2H] = [a | u] at 2 c_off (ld 2 ldc)
    e, m0, n0 = _load_tile(tile_ptr, BM, BN)
    a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows = _row_problem(desc_ptr, e, HINT)
    w_ptr = _weight_ptr(b_addr, x_ptr, HINT)
    rm = m0 + tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < rows
    n_ok = rn < ncol
    x_ptrs = x_ptr + a_off + rm[:, None] * lda + rk[None, :]
    wa_ptrs = w_ptr + rn[None, :] * ldb + rk[:, None]
    wu_ptrs = wa_ptrs + ncol * ldb
    acc_a = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, kdim, BK):
        k_ok = rk < kdim - k0
        xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        wa = tl.load(wa_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        wu = tl.load(wu_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc_a = _mma(xt, wa, acc_a, UPCAST, PRECISION)
        acc_u = _mma(xt, wu, acc_u, UPCAST, PRECISION)
        x_ptrs += BK
        wa_ptrs += BK
        wu_ptrs += BK
    ok = m_ok[:, None] & n_ok[None, :]
    dt = act_ptr.dtype.element_ty
    h_idx = 2 * c_off + rm[:, None] * (2 * ldc) + rn[None, :]
    tl.store(h_ptr + h_idx, acc_a.to(dt), mask=ok)
    tl.store(h_ptr + h_idx + ncol, acc_u.to(dt), mask=ok)
    act = acc_a * tl.sigmoid(acc_a) * acc_u
    tl.store(act_ptr + c_off + rm[:, None] * ldc + rn[None, :], act.to(dt), mask=ok)


@triton.jit
def _grouped_mm_kernel(
    a_ptr, c_ptr, h_ptr, desc_ptr, tile_ptr,
    B_NK: tl.constexpr, SWIGLU_BWD: tl.constexpr,
    HINT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # C_e[rows, ncol] = A_e[rows, kdim] @ B_e[kdim, ncol]
    # A_e at a_ptr + a_off (leading dim lda); C_e at c_ptr + c_off (ldc)
    # B_e at b_addr: element (k, n) at n * ldb + k if B_NK (a torch weight [N, K]) else k * ldb + n
    # SWIGLU_BWD: h_ptr holds [a | u] laid out like C with 2*ncol columns; the product is d(act) and
    #   the kernel writes [da | du] into C (which then has 2*ncol columns too)
    e, m0, n0 = _load_tile(tile_ptr, BM, BN)
    a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows = _row_problem(desc_ptr, e, HINT)
    b_ptr = _weight_ptr(b_addr, a_ptr, HINT)
    rm = m0 + tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < rows
    n_ok = rn < ncol
    a_ptrs = a_ptr + a_off + rm[:, None] * lda + rk[None, :]
    if B_NK:
        b_ptrs = b_ptr + rn[None, :] * ldb + rk[:, None]
        b_step = BK
    else:
        b_ptrs = b_ptr + rk[:, None] * ldb + rn[None, :]
        b_step = BK * ldb
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, kdim, BK):
        k_ok = rk < kdim - k0
        at = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        bt = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _mma(at, bt, acc, UPCAST, PRECISION)
        a_ptrs += BK
        b_ptrs += b_step
    ok = m_ok[:, None] & n_ok[None, :]
    dt = c_ptr.dtype.element_ty
    c_idx = c_off + rm[:, None] * ldc + rn[None, :]
    if SWIGLU_BWD:
        # act = SiLU(a) u:  da = dact * u * s (1 + a (1 - s)),  du = dact * SiLU(a),  s = sigmoid(a)
        a = tl.load(h_ptr + c_idx, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + c_idx + ncol, mask=ok, other=0.0).to(tl.float32)
        s = tl.sigmoid(a)
        tl.store(c_ptr + c_idx, (acc * u * s * (1.0 + a * (1.0 - s))).to(dt), mask=ok)
        tl.store(c_ptr + c_idx + ncol, (acc * a * s).to(dt), mask=ok)
    else:
        tl.store(c_ptr + c_idx, acc.to(dt), mask=ok)


@triton.jit
def _wgrad_kernel(
    g_ptr, x_ptr, desc_ptr, tile_ptr,
    HINT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # dW_e[ncol, mcol] = G_e[rows, ncol]^T @ X_e[rows, mcol], written densely (ld mcol) at out_addr
    # G_e at g_ptr + g_off (ldg), X_e at x_ptr + x_off (ldx); tile (e, n0, m0) covers dW_e[n0:+BM, m0:+BN]
    e, n0, m0 = _load_tile(tile_ptr, BM, BN)
    d = desc_ptr + e * 8
    g_off = _load_hinted(d + 0, HINT)
    ldg = _load_hinted(d + 1, HINT)
    x_off = _load_hinted(d + 2, HINT)
    ldx = _load_hinted(d + 3, HINT)
    rows = tl.load(d + 4)
    ncol = _load_hinted(d + 5, HINT)
    mcol = _load_hinted(d + 6, HINT)
    out_ptr = _weight_ptr(tl.load(d + 7), g_ptr, HINT)
    rn = n0 + tl.arange(0, BM)
    rm = m0 + tl.arange(0, BN)
    rc = tl.arange(0, BK)
    n_ok = rn < ncol
    m_ok = rm < mcol
    gt_ptrs = g_ptr + g_off + rc[None, :] * ldg + rn[:, None]  # G^T tile [BM, BK]
    x_ptrs = x_ptr + x_off + rc[:, None] * ldx + rm[None, :]  # X tile [BK, BN]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for c0 in range(0, rows, BK):
        c_ok = rc < rows - c0
        gt = tl.load(gt_ptrs, mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        xt = tl.load(x_ptrs, mask=c_ok[:, None] & m_ok[None, :], other=0.0)
        acc = _mma(gt, xt, acc, UPCAST, PRECISION)
        gt_ptrs += BK * ldg
        x_ptrs += BK * ldx
    ok = n_ok[:, None] & m_ok[None, :]
    tl.store(out_ptr + rn[:, None] * mcol + rm[None, :], acc.to(g_ptr.dtype.element_ty), mask=ok)


# Whether these kernels run in Triton's interpreter: fixed when the @triton.jit decorators above ran (by
# TRITON_INTERPRET at import time), so ask the decorated object rather than the environment now.
INTERPRET = not isinstance(_mma, triton.runtime.JITFunction)


def launch_options(dtype: torch.dtype) -> dict:
    """Constexprs shared by every launch for inputs of ``dtype``."""
    return {
        "UPCAST": INTERPRET,
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }
