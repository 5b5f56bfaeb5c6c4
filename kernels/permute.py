"""Permute and unpermute for the grouped experts (Triton): move rows between token order and expert order.

* ``gather_rows``   xs[a] = x[src[a]]                         (permute: token rows into expert-sorted order)
* ``combine_rows``  y[t]  = sum_k g[t, k] * rows[inv[t, k]]    (unpermute with gate weights)
* ``gate_grad``     dgates[slot] = <dy[tok], out[a]>,  dout[a] = gates[slot] * dy[tok]  (gate backward)

``combine_rows`` is a deterministic segmented reduction: each program owns a block of tokens and reads
their K expert-sorted rows through the inverse permutation ``inv[t, k]`` (the sorted position of slot
(t, k)), so there are no atomics and the sum order is fixed. Used without gates it is also the backward
of ``gather_rows``.

Legend: T tokens, D model width, K experts per token, A = T*K routed slots.
Ladder per op: ``_op_kernel`` -> ``op()`` launcher (checks) -> ``mohge::op`` custom op with a fake impl;
``op_torch`` is each op's pure-torch reference (same signature).
The autograd of the whole expert block lives in :mod:`mohge.kernels.swiglu`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grouped import INTERPRET

Tensor = torch.Tensor


def _blocks(D: int) -> tuple[int, int]:
    """(rows per program, columns per program) for the row-copy kernels."""
    return (16, 64) if INTERPRET else (16, min(256, triton.next_power_of_2(D)))


@triton.jit
def _gather_rows_kernel(x_ptr, src_ptr, out_ptr, A, D, BR: tl.constexpr, BD: tl.constexpr):
    # x [T, D], src int64 [A] (row of x for each output row), out [A, D]
    r = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    r_ok = r < A
    src = tl.load(src_ptr + r, mask=r_ok, other=0)
    ok = r_ok[:, None] & (c < D)[None, :]
    v = tl.load(x_ptr + src[:, None] * D + c[None, :], mask=ok)
    tl.store(out_ptr + r[:, None] * D + c[None, :], v, mask=ok)


@triton.jit
def _combine_rows_kernel(
    rows_ptr, inv_ptr, gate_ptr, y_ptr, T, K, D,
    HAS_GATE: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # rows [A, D] expert-sorted, inv int64 [T, K] sorted position of slot (t, k), gate [T, K], y [T, D]
    t = tl.program_id(0) * BT + tl.arange(0, BT).to(tl.int64)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    t_ok = t < T
    ok = t_ok[:, None] & (c < D)[None, :]
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    for k in range(K):
        pos = tl.load(inv_ptr + t * K + k, mask=t_ok, other=0)
        v = tl.load(rows_ptr + pos[:, None] * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_GATE:
            g = tl.load(gate_ptr + t * K + k, mask=t_ok, other=0.0).to(tl.float32)
            v = v * g[:, None]
        acc += v
    tl.store(y_ptr + t[:, None] * D + c[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gate_grad_kernel(
    dy_ptr, out_ptr, order_ptr, gates_ptr, dgates_ptr, dout_ptr, A, K, D,
    BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # dy [T, D], out [A, D] ungated expert outputs (sorted), order int64 [A] flat slot of sorted row a,
    # gates [T*K]; writes dgates [T*K] (slot order) and dout [A, D] = gate * dy[token]
    r = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    r_ok = r < A
    slot = tl.load(order_ptr + r, mask=r_ok, other=0)
    tok = slot // K
    g = tl.load(gates_ptr + slot, mask=r_ok, other=0.0).to(tl.float32)
    dot = tl.zeros((BR,), dtype=tl.float32)
    for d0 in range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        ok = r_ok[:, None] & (c < D)[None, :]
        dy = tl.load(dy_ptr + tok[:, None] * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
        o = tl.load(out_ptr + r[:, None] * D + c[None, :], mask=ok, other=0.0).to(tl.float32)
        dot += tl.sum(dy * o, axis=1)
        tl.store(dout_ptr + r[:, None] * D + c[None, :], (dy * g[:, None]).to(dout_ptr.dtype.element_ty), mask=ok)
    tl.store(dgates_ptr + slot, dot.to(dgates_ptr.dtype.element_ty), mask=r_ok)


def _check_index(name: str, idx: Tensor, device: torch.device) -> Tensor:
    if idx.dtype not in (torch.int64, torch.int32) or idx.device != device:
        raise ValueError(f"{name} must be an integer tensor on {device}, got {idx.dtype} on {idx.device}")
    return idx.to(torch.int64).contiguous()


def gather_rows(x_TD: Tensor, src_A: Tensor) -> Tensor:
    """out[a] = x[src[a]]: [T, D] rows -> [A, D]."""
    if x_TD.dim() != 2 or src_A.dim() != 1:
        raise ValueError(f"gather_rows wants x [T, D] and src [A], got {tuple(x_TD.shape)}, {tuple(src_A.shape)}")
    x_TD = x_TD.contiguous()
    src_A = _check_index("src", src_A, x_TD.device)
    (A,), D = src_A.shape, x_TD.shape[1]
    out_AD = x_TD.new_empty(A, D)
    BR, BD = _blocks(D)
    if A and D:
        _gather_rows_kernel[(triton.cdiv(A, BR), triton.cdiv(D, BD))](x_TD, src_A, out_AD, A, D, BR=BR, BD=BD)
    return out_AD


def combine_rows(rows_AD: Tensor, inv_TK: Tensor, gates_TK: Tensor | None) -> Tensor:
    """y[t] = sum_k gates[t, k] * rows[inv[t, k]] (gates omitted: a plain sum). [A, D] -> [T, D]."""
    if rows_AD.dim() != 2 or inv_TK.dim() != 2:
        raise ValueError(
            f"combine_rows wants rows [A, D], inv [T, K]; got {tuple(rows_AD.shape)}, {tuple(inv_TK.shape)}"
        )
    if gates_TK is not None and (gates_TK.shape != inv_TK.shape or gates_TK.device != rows_AD.device):
        raise ValueError(f"gates {tuple(gates_TK.shape)} must match inv {tuple(inv_TK.shape)} on {rows_AD.device}")
    rows_AD = rows_AD.contiguous()
    inv_TK = _check_index("inv", inv_TK, rows_AD.device)
    (T, K), D = inv_TK.shape, rows_AD.shape[1]
    y_TD = rows_AD.new_empty(T, D)
    BT, BD = _blocks(D)
    if T and D:
        gates = inv_TK if gates_TK is None else gates_TK.contiguous()
        grid = (triton.cdiv(T, BT), triton.cdiv(D, BD))
        _combine_rows_kernel[grid](rows_AD, inv_TK, gates, y_TD, T, K, D, HAS_GATE=gates_TK is not None, BT=BT, BD=BD)
    return y_TD


def gate_grad(dy_TD: Tensor, out_AD: Tensor, order_A: Tensor, gates_TK: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of the gated combine: (dgates [T, K], dout [A, D]) from dy [T, D] and the saved outputs."""
    T, K = gates_TK.shape
    if dy_TD.shape[0] != T or out_AD.shape != (T * K, dy_TD.shape[1]) or order_A.shape != (T * K,):
        raise ValueError(
            f"gate_grad: dy {tuple(dy_TD.shape)}, out {tuple(out_AD.shape)}, order {tuple(order_A.shape)} "
            f"do not fit gates [T={T}, K={K}]"
        )
    dy_TD, out_AD, gates_TK = dy_TD.contiguous(), out_AD.contiguous(), gates_TK.contiguous()
    order_A = _check_index("order", order_A, dy_TD.device)
    A, D = out_AD.shape
    dgates_TK = torch.empty_like(gates_TK)
    dout_AD = torch.empty_like(out_AD)
    BR, BD = _blocks(D)
    if A:
        _gate_grad_kernel[(triton.cdiv(A, BR),)](
            dy_TD, out_AD, order_A, gates_TK, dgates_TK, dout_AD, A, K, D, BR=BR, BD=BD
        )
    return dgates_TK, dout_AD


def gather_rows_torch(x_TD: Tensor, src_A: Tensor) -> Tensor:
    """Pure-torch reference of :func:`gather_rows`."""
    return x_TD[src_A]


def combine_rows_torch(rows_AD: Tensor, inv_TK: Tensor, gates_TK: Tensor | None) -> Tensor:
    """Pure-torch reference of :func:`combine_rows` (fp32 sum over k, like the kernel)."""
    v_TKD = rows_AD[inv_TK].float()
    if gates_TK is not None:
        v_TKD = v_TKD * gates_TK.float()[:, :, None]
    return v_TKD.sum(1).to(rows_AD.dtype)


def gate_grad_torch(dy_TD: Tensor, out_AD: Tensor, order_A: Tensor, gates_TK: Tensor) -> tuple[Tensor, Tensor]:
    """Pure-torch reference of :func:`gate_grad`."""
    T, K = gates_TK.shape
    dy_AD = dy_TD[order_A // K].float()
    dgates = torch.zeros(T * K, dtype=torch.float32, device=dy_TD.device)
    dgates[order_A] = (dy_AD * out_AD.float()).sum(-1)
    dout_AD = gates_TK.reshape(-1)[order_A].float()[:, None] * dy_AD
    return dgates.view(T, K).to(gates_TK.dtype), dout_AD.to(out_AD.dtype)


@torch.library.custom_op("mohge::gather_rows", mutates_args=())
def gather_rows_op(x_TD: Tensor, src_A: Tensor) -> Tensor:
    return gather_rows(x_TD, src_A)


@gather_rows_op.register_fake
def _(x_TD, src_A):
    return x_TD.new_empty(src_A.shape[0], x_TD.shape[1])


@torch.library.custom_op("mohge::combine_rows", mutates_args=())
def combine_rows_op(rows_AD: Tensor, inv_TK: Tensor, gates_TK: Tensor | None) -> Tensor:
    return combine_rows(rows_AD, inv_TK, gates_TK)


@combine_rows_op.register_fake
def _(rows_AD, inv_TK, gates_TK):
    return rows_AD.new_empty(inv_TK.shape[0], rows_AD.shape[1])


@torch.library.custom_op("mohge::gate_grad", mutates_args=())
def gate_grad_op(dy_TD: Tensor, out_AD: Tensor, order_A: Tensor, gates_TK: Tensor) -> tuple[Tensor, Tensor]:
    return gate_grad(dy_TD, out_AD, order_A, gates_TK)


@gate_grad_op.register_fake
def _(dy_TD, out_AD, order_A, gates_TK):
    return torch.empty_like(gates_TK), torch.empty_like(out_AD)
