"""The composite op: grouped SwiGLU experts of several widths in Triton, the fast path of
:func:`mohge.kernels.expert_swiglu`, as one ``autograd.Function`` that orders the ``mohge::`` ops.

Same contract and result as ``swiglu_grouped_torch`` in :mod:`mohge.kernels.reference` (the bias-free
SwiGLU expert of arXiv 2604.23108, docs/method.md §1.2, combined as in §3):

    y_t = sum_k gates[t, k] * W2_e (SiLU(a) * u),   [a; u] = W1_e x_t,   e = idx[t, k]

Forward, with the A = T*K routed slots sorted by expert (one host sync: the per-expert counts):

    xs  = gather_rows(x, tok)             permute                                [A, D]
    act, h = up_swiglu(xs, W1)            grouped GEMM, SiLU(a) * u in epilogue  ragged [C, H], [C, 2H]
    out = down_proj(act, W2)              grouped GEMM                           [A, D]
    y   = combine_rows(out, inv, gates)   deterministic unpermute                [T, D]

Backward: gate_grad (dgates, dout = gate * dy), down_proj_bwd (dact and the SwiGLU backward fused),
up_proj_bwd_x, combine_rows without gates (dx), grad_w1, grad_w2. Every op is a ``mohge::`` custom op;
this module only orders them (ops in :mod:`.permute`, :mod:`.up_swiglu`, :mod:`.grouped_mm`,
:mod:`.wgrad`). Kernels run on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``.

Legend: T tokens, D model width, K experts per token, E experts, A = T*K slots, C tokens of one expert,
H expert width.
"""

from __future__ import annotations

import torch

from .grouped import INTERPRET
from .grouped_mm import down_proj_bwd_op, down_proj_op, up_proj_bwd_x_op
from .permute import combine_rows_op, gate_grad_op, gather_rows_op
from .reference import check_contract, sort_slots
from .up_swiglu import up_swiglu_op
from .wgrad import grad_w1_op, grad_w2_op

Tensor = torch.Tensor
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

__all__ = ["SUPPORTED_DTYPES", "route", "swiglu_grouped_triton"]


def route(idx_TK: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """Sort the slots by expert. Returns (order_A, tok_A, inv_TK, counts).

    order_A: flat slot of each sorted row (stable: ties keep token order); tok_A = order_A // K;
    inv_TK: sorted position of slot (t, k) (the inverse permutation, for the atomic-free combine);
    counts: tokens per expert as host ints (the one device-to-host sync of the forward).
    """
    T, K = idx_TK.shape
    order_A, tok_A, counts_E = sort_slots(idx_TK.to(torch.int64), num_experts)  # the torch path's sort
    inv_A = torch.empty_like(order_A)
    inv_A[order_A] = torch.arange(order_A.numel(), device=order_A.device)
    counts = counts_E.tolist()
    if len(counts) != num_experts:
        raise ValueError(f"expert ids must lie in [0, {num_experts}), got counts for {len(counts)} ids")
    return order_A, tok_A, inv_A.view(T, K), counts


class _TritonSwiGLU(torch.autograd.Function):
    """permute -> up (SwiGLU epilogue) -> down -> gated unpermute, and the hand-ordered backward."""

    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, num_classes, *weights):
        w1s, w2s = list(weights[:num_classes]), list(weights[num_classes:])
        E = sum(w.shape[0] for w in w1s)
        order_A, tok_A, inv_TK, counts = route(idx_TK, E)
        xs_AD = gather_rows_op(x_TD, tok_A)
        act_R, h_R = up_swiglu_op(xs_AD, w1s, counts)
        out_AD = down_proj_op(act_R, w2s, counts)
        y_TD = combine_rows_op(out_AD, inv_TK, gates_TK)
        ctx.num_classes, ctx.counts = num_classes, counts
        ctx.save_for_backward(xs_AD, act_R, h_R, out_AD, order_A, inv_TK, gates_TK, *weights)
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_AD, act_R, h_R, out_AD, order_A, inv_TK, gates_TK, *weights = ctx.saved_tensors
        nc, counts = ctx.num_classes, ctx.counts
        w1s, w2s = weights[:nc], weights[nc:]
        need_x, need_g = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        need_w1 = any(ctx.needs_input_grad[4 : 4 + nc])
        need_w2 = any(ctx.needs_input_grad[4 + nc :])
        dgates_TK, dout_AD = gate_grad_op(dy_TD.contiguous(), out_AD, order_A, gates_TK)
        dx_TD = dw1s = dw2s = None
        if need_x or need_w1:
            dh_R = down_proj_bwd_op(dout_AD, h_R, w2s, counts)
            if need_x:
                dx_TD = combine_rows_op(up_proj_bwd_x_op(dh_R, w1s, counts), inv_TK, None)
            if need_w1:
                dw1s = grad_w1_op(dh_R, xs_AD, w1s, counts)
        if need_w2:
            dw2s = grad_w2_op(dout_AD, act_R, w2s, counts)
        dws = [*(dw1s or [None] * nc), *(dw2s or [None] * nc)]
        return (dx_TD, None, dgates_TK if need_g else None, None, *dws)


def swiglu_grouped_triton(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> Tensor:
    """Triton grouped path; same signature and result as ``swiglu_grouped_torch``, differentiable in
    x, gates and every weight."""
    check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    if x_TD.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"triton path supports {SUPPORTED_DTYPES}, got {x_TD.dtype}")
    if x_TD.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"triton path needs CUDA tensors (got {x_TD.device}); on a CPU set TRITON_INTERPRET=1 before "
            "importing mohge.kernels.swiglu, or use backend='torch'"
        )
    if idx_TK.device != x_TD.device or gates_TK.device != x_TD.device:
        raise ValueError(f"idx on {idx_TK.device} and gates on {gates_TK.device} must be on {x_TD.device}")
    return _TritonSwiGLU.apply(x_TD, idx_TK, gates_TK, len(w1s), *w1s, *w2s)
