"""Ops ``grad_w1``, ``grad_w2``: the weight gradients of every expert, one kernel (Triton).

``_wgrad_kernel`` computes dW_e = G_e^T X_e for every expert at once, reducing over the expert's C rows (an
expert with no token gets zeros):

    grad_w1   dh (ragged [C, 2H]), xs [A, D]   -> dW1 per class [n_c, 2H_c, D]
    grad_w2   dout [A, D], act (ragged [C, H]) -> dW2 per class [n_c, D, H_c]

Ladder per op: ``_wgrad_kernel`` -> launcher (checks) -> ``mohge::<op>`` custom op with a fake impl;
``<op>_torch`` is each op's pure-torch reference (same signature).
The autograd of the whole expert block lives in :mod:`mohge.kernels.swiglu`.

Legend: A routed rows, D model width, C tokens of one expert, H its width.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .grouped import (
    WGRAD_FIELDS,
    check_ragged,
    launch,
    layout,
    load_hinted,
    load_tile,
    mma,
    table,
    weight_ptr,
)
from .schedule import expert_addresses, expert_blocks

Tensor = torch.Tensor


@triton.jit
def _wgrad_kernel(
    g_ptr, x_ptr, desc_ptr, tile_ptr,
    HINT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # dW_e[ncol, mcol] = G_e[rows, ncol]^T @ X_e[rows, mcol], written densely (ld mcol) at out_addr
    # G_e at g_ptr + g_off (ldg), X_e at x_ptr + x_off (ldx); tile (e, n0, m0) covers dW_e[n0:+BM, m0:+BN]
    e, n0, m0 = load_tile(tile_ptr, BM, BN)
    if e < 0:  # a surplus tile of a fixed grid (the capturable path, kernels/capture.py)
        return
    d = desc_ptr + e * 8
    g_off = load_hinted(d + 0, HINT)
    ldg = load_hinted(d + 1, HINT)
    x_off = load_hinted(d + 2, HINT)
    ldx = load_hinted(d + 3, HINT)
    rows = tl.load(d + 4)
    ncol = load_hinted(d + 5, HINT)
    mcol = load_hinted(d + 6, HINT)
    out_ptr = weight_ptr(tl.load(d + 7), g_ptr, HINT)
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
        acc = mma(gt, xt, acc, UPCAST, PRECISION)
        gt_ptrs += BK * ldg
        x_ptrs += BK * ldx
    ok = n_ok[:, None] & m_ok[None, :]
    tl.store(out_ptr + rn[:, None] * mcol + rm[None, :], acc.to(g_ptr.dtype.element_ty), mask=ok)


def grad_w1(dh_R: Tensor, xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """dW1_e = dh_e^T xs_e, one [n_c, 2H_c, D] tensor per class (zeros for an expert with no token)."""
    D = xs_AD.shape[-1]
    lay = layout("grad_w1", xs_AD, w1s, counts, True, D)
    dh_R = check_ragged("grad_w1", dh_R, 2 * lay.rag_total)
    xs_AD = xs_AD.contiguous()
    dws = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in w1s]
    addr, aligned = expert_addresses(dws)
    C, H = lay.count, lay.width
    desc = table(
        WGRAD_FIELDS, g_off=2 * lay.rag, ldg=2 * H, x_off=lay.row0 * D, ldx=D, rows=C, ncol=2 * H, mcol=D, out_addr=addr
    )
    launch(_wgrad_kernel, (dh_R, xs_AD), desc, 2 * H, np.full_like(C, D), xs_AD.dtype, lay.aligned and aligned)
    return dws


def grad_w2(dout_AD: Tensor, act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """dW2_e = dout_e^T act_e, one [n_c, D, H_c] tensor per class (zeros for an expert with no token)."""
    D = dout_AD.shape[-1]
    lay = layout("grad_w2", dout_AD, w2s, counts, False, D)
    act_R = check_ragged("grad_w2", act_R, lay.rag_total)
    dout_AD = dout_AD.contiguous()
    dws = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in w2s]
    addr, aligned = expert_addresses(dws)
    C, H = lay.count, lay.width
    desc = table(WGRAD_FIELDS, g_off=lay.row0 * D, ldg=D, x_off=lay.rag, ldx=H, rows=C, ncol=D, mcol=H, out_addr=addr)
    launch(_wgrad_kernel, (dout_AD, act_R), desc, np.full_like(C, D), H, dout_AD.dtype, lay.aligned and aligned)
    return dws


def grad_w1_torch(dh_R: Tensor, xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """Pure-torch reference of :func:`grad_w1`."""
    dws = [torch.zeros_like(w) for w in w1s]
    for c, j, r0, C, rag, H in expert_blocks(w1s, counts, True):
        dws[c][j] = dh_R[2 * rag : 2 * (rag + C * H)].view(C, 2 * H).t() @ xs_AD[r0 : r0 + C]
    return dws


def grad_w2_torch(dout_AD: Tensor, act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """Pure-torch reference of :func:`grad_w2`."""
    dws = [torch.zeros_like(w) for w in w2s]
    for c, j, r0, C, rag, H in expert_blocks(w2s, counts):
        dws[c][j] = dout_AD[r0 : r0 + C].t() @ act_R[rag : rag + C * H].view(C, H)
    return dws


grad_w1_op = torch.library.custom_op("mohge::grad_w1", grad_w1, mutates_args=())
grad_w2_op = torch.library.custom_op("mohge::grad_w2", grad_w2, mutates_args=())


@grad_w1_op.register_fake
def _(dh, xs, w1s, counts):
    return [torch.empty_like(w) for w in w1s]


@grad_w2_op.register_fake
def _(dout, act, w2s, counts):
    return [torch.empty_like(w) for w in w2s]
