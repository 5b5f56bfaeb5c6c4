"""Op ``up_swiglu``: the up projection of every expert with SiLU(a) * u fused in its epilogue (Triton).

    xs [A, D] sorted rows, W1 per class [n_c, 2H_c, D]  ->  act = SiLU(a) * u (ragged [C, H]),
                                                            h = [a | u] (ragged [C, 2H], kept for the backward)

with [a; u] = W1_e x per row of expert e (arXiv 2604.23108, docs/method.md §1.2). One grouped launch covers every
expert of every width class; ``counts`` (tokens per expert, host ints) place each expert's rows.
Ladder: ``_up_swiglu_kernel`` -> ``up_swiglu()`` (checks) -> ``mohge::up_swiglu`` custom op with a fake impl;
``up_swiglu_torch`` is its pure-torch reference (same signature).
The autograd of the whole expert block lives in :mod:`mohge.kernels.swiglu`.

Legend: A routed rows, D model width, C tokens of one expert, H its width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .grouped import (
    ROW_FIELDS,
    launch,
    layout,
    load_tile,
    mma,
    rag_total,
    row_problem,
    table,
    weight_ptr,
)
from .schedule import expert_addresses, expert_blocks

Tensor = torch.Tensor


@triton.jit
def _up_swiglu_kernel(
    x_ptr, act_ptr, h_ptr, desc_ptr, tile_ptr,
    HINT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # x   [A, D] sorted rows; expert e's rows at a_off = row0_e * D, lda = D, kdim = D
    # W1_e [2H, D] at b_addr (ldb = D): rows [0, H) give a, rows [H, 2H) give u; ncol = H
    # act ragged [C, H] at c_off = rag_e (ldc = H);  h ragged [C, 2H] = [a | u] at 2 c_off (ld 2 ldc)
    e, m0, n0 = load_tile(tile_ptr, BM, BN)
    if e < 0:  # a surplus tile of a fixed grid (the capturable path, kernels/capture.py)
        return
    a_off, lda, kdim, b_addr, ldb, ncol, c_off, ldc, rows = row_problem(desc_ptr, e, HINT)
    w_ptr = weight_ptr(b_addr, x_ptr, HINT)
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
        acc_a = mma(xt, wa, acc_a, UPCAST, PRECISION)
        acc_u = mma(xt, wu, acc_u, UPCAST, PRECISION)
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


def up_swiglu(xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> tuple[Tensor, Tensor]:
    """act = SiLU(a) * u, h = [a | u] with [a; u] = W1_e x per sorted row (ragged outputs)."""
    D = xs_AD.shape[-1]
    w1s = [w.contiguous() for w in w1s]
    lay = layout("up_swiglu", xs_AD, w1s, counts, True, D)
    xs_AD = xs_AD.contiguous()
    addr, aligned = expert_addresses(w1s)
    act_R = xs_AD.new_empty(lay.rag_total)
    h_R = xs_AD.new_empty(2 * lay.rag_total)
    C, H = lay.count, lay.width
    desc = table(
        ROW_FIELDS, a_off=lay.row0 * D, lda=D, kdim=D, b_addr=addr, ldb=D, ncol=H, c_off=lay.rag, ldc=H, rows=C
    )
    launch(_up_swiglu_kernel, (xs_AD, act_R, h_R), desc, C, H, xs_AD.dtype, lay.aligned and aligned)
    return act_R, h_R


def up_swiglu_torch(xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> tuple[Tensor, Tensor]:
    """Pure-torch reference of :func:`up_swiglu`, same signature and ragged layout."""
    total = rag_total(w1s, counts, True)
    act_R, h_R = xs_AD.new_empty(total), xs_AD.new_empty(2 * total)
    for c, j, r0, C, rag, H in expert_blocks(w1s, counts, True):
        h_C2H = xs_AD[r0 : r0 + C].float() @ w1s[c][j].float().t()
        act_R[rag : rag + C * H] = (F.silu(h_C2H[:, :H]) * h_C2H[:, H:]).reshape(-1).to(act_R.dtype)
        h_R[2 * rag : 2 * (rag + C * H)] = h_C2H.reshape(-1).to(h_R.dtype)
    return act_R, h_R


up_swiglu_op = torch.library.custom_op("mohge::up_swiglu", up_swiglu, mutates_args=())


@up_swiglu_op.register_fake
def _(xs, w1s, counts):
    rows = rag_total(w1s, counts, True)
    return xs.new_empty(rows), xs.new_empty(2 * rows)
