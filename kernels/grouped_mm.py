"""Ops ``down_proj``, ``down_proj_bwd``, ``up_proj_bwd_x``: the row GEMMs of one kernel (Triton).

``_grouped_mm_kernel`` computes C_e = A_e B_e for every expert at once, B_e stored [N, K] (a torch weight,
``B_NK``) or [K, N], optionally with the SwiGLU backward in its epilogue. Three ops launch it:

    down_proj      act (ragged [C, H]), W2       -> out [A, D]                  forward
    down_proj_bwd  dout [A, D], h, W2            -> dh = [da | du] (ragged)     backward, SwiGLU backward fused
    up_proj_bwd_x  dh (ragged [C, 2H]), W1       -> dxs [A, D]                  backward

Ladder per op: ``_grouped_mm_kernel`` -> launcher (checks) -> ``mohge::<op>`` custom op with a fake impl;
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
    ROW_FIELDS,
    check_ragged,
    launch,
    layout,
    load_tile,
    mma,
    row_problem,
    table,
    weight_ptr,
)
from .schedule import expert_addresses, expert_blocks

Tensor = torch.Tensor


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
    e, m0, n0 = load_tile(tile_ptr, BM, BN)
    if e < 0:  # a surplus tile of a fixed grid (the capturable path, kernels/capture.py)
        return
    a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows = row_problem(desc_ptr, e, HINT)
    b_ptr = weight_ptr(b_addr, a_ptr, HINT)
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
        acc = mma(at, bt, acc, UPCAST, PRECISION)
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


def down_proj(act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """out_e = act_e W2_e^T per expert: ragged [C, H] -> [A, D]."""
    w2s = [w.contiguous() for w in w2s]
    D = w2s[0].shape[1]
    lay = layout("down_proj", act_R, w2s, counts, False, D)
    act_R = check_ragged("down_proj", act_R, lay.rag_total)
    addr, aligned = expert_addresses(w2s)
    out_AD = act_R.new_empty(lay.num_rows, D)
    C, H = lay.count, lay.width
    desc = table(
        ROW_FIELDS, a_off=lay.rag, lda=H, kdim=H, b_addr=addr, ldb=H, ncol=D, c_off=lay.row0 * D, ldc=D, rows=C
    )
    hint = lay.aligned and aligned
    launch(_grouped_mm_kernel, (act_R, out_AD, out_AD), desc, C, np.full_like(C, D), act_R.dtype, hint,
            B_NK=True, SWIGLU_BWD=False)  # fmt: skip
    return out_AD


def down_proj_bwd(dout_AD: Tensor, h_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """dh = [da | du] from dact = dout_e W2_e and the saved pre-activation h (SwiGLU backward fused)."""
    w2s = [w.contiguous() for w in w2s]
    D = w2s[0].shape[1]
    lay = layout("down_proj_bwd", dout_AD, w2s, counts, False, D)
    h_R = check_ragged("down_proj_bwd", h_R, 2 * lay.rag_total)
    dout_AD = dout_AD.contiguous()
    addr, aligned = expert_addresses(w2s)
    dh_R = torch.empty_like(h_R)
    C, H = lay.count, lay.width
    desc = table(
        ROW_FIELDS, a_off=lay.row0 * D, lda=D, kdim=D, b_addr=addr, ldb=H, ncol=H, c_off=2 * lay.rag, ldc=2 * H, rows=C
    )
    launch(_grouped_mm_kernel, (dout_AD, dh_R, h_R), desc, C, H, dout_AD.dtype, lay.aligned and aligned,
            B_NK=False, SWIGLU_BWD=True)  # fmt: skip
    return dh_R


def up_proj_bwd_x(dh_R: Tensor, w1s: list[Tensor], counts: list[int]) -> Tensor:
    """dxs_e = dh_e W1_e per expert: ragged [C, 2H] -> [A, D]."""
    w1s = [w.contiguous() for w in w1s]
    D = w1s[0].shape[2]
    lay = layout("up_proj_bwd_x", dh_R, w1s, counts, True, D)
    dh_R = check_ragged("up_proj_bwd_x", dh_R, 2 * lay.rag_total)
    addr, aligned = expert_addresses(w1s)
    dxs_AD = dh_R.new_empty(lay.num_rows, D)
    C, H = lay.count, lay.width
    desc = table(
        ROW_FIELDS,
        a_off=2 * lay.rag,
        lda=2 * H,
        kdim=2 * H,
        b_addr=addr,
        ldb=D,
        ncol=D,
        c_off=lay.row0 * D,
        ldc=D,
        rows=C,
    )
    hint = lay.aligned and aligned
    launch(_grouped_mm_kernel, (dh_R, dxs_AD, dxs_AD), desc, C, np.full_like(C, D), dh_R.dtype, hint,
            B_NK=False, SWIGLU_BWD=False)  # fmt: skip
    return dxs_AD


def down_proj_torch(act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """Pure-torch reference of :func:`down_proj`."""
    out_AD = act_R.new_empty(int(sum(counts)), w2s[0].shape[1])
    for c, j, r0, C, rag, H in expert_blocks(w2s, counts):
        out_AD[r0 : r0 + C] = act_R[rag : rag + C * H].view(C, H) @ w2s[c][j].t()
    return out_AD


def down_proj_bwd_torch(dout_AD: Tensor, h_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """Pure-torch reference of :func:`down_proj_bwd`: dact = dout W2, then d[a | u] of act = SiLU(a) u."""
    dh_R = torch.empty_like(h_R)
    for c, j, r0, C, rag, H in expert_blocks(w2s, counts):
        dact_CH = dout_AD[r0 : r0 + C].float() @ w2s[c][j].float()
        a_CH, u_CH = h_R[2 * rag : 2 * (rag + C * H)].view(C, 2 * H).float().split(H, dim=1)
        s_CH = torch.sigmoid(a_CH)
        d_C2H = torch.cat([dact_CH * u_CH * s_CH * (1 + a_CH * (1 - s_CH)), dact_CH * a_CH * s_CH], dim=1)
        dh_R[2 * rag : 2 * (rag + C * H)] = d_C2H.reshape(-1).to(dh_R.dtype)
    return dh_R


def up_proj_bwd_x_torch(dh_R: Tensor, w1s: list[Tensor], counts: list[int]) -> Tensor:
    """Pure-torch reference of :func:`up_proj_bwd_x`."""
    dxs_AD = dh_R.new_empty(int(sum(counts)), w1s[0].shape[2])
    for c, j, r0, C, rag, H in expert_blocks(w1s, counts, True):
        dxs_AD[r0 : r0 + C] = dh_R[2 * rag : 2 * (rag + C * H)].view(C, 2 * H) @ w1s[c][j]
    return dxs_AD


down_proj_op = torch.library.custom_op("mohge::down_proj", down_proj, mutates_args=())
down_proj_bwd_op = torch.library.custom_op("mohge::down_proj_bwd", down_proj_bwd, mutates_args=())
up_proj_bwd_x_op = torch.library.custom_op("mohge::up_proj_bwd_x", up_proj_bwd_x, mutates_args=())


@down_proj_op.register_fake
def _(act, w2s, counts):
    return act.new_empty(int(sum(counts)), w2s[0].shape[1])


@down_proj_bwd_op.register_fake
def _(dout, h, w2s, counts):
    return torch.empty_like(h)


@up_proj_bwd_x_op.register_fake
def _(dh, w1s, counts):
    return dh.new_empty(int(sum(counts)), w1s[0].shape[2])
