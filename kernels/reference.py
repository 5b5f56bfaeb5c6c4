"""Pure-torch expert computation: the obvious per-expert loop and the fast grouped path.

Both compute, for every token t,

    y_t = sum_k gates[t, k] * E_{idx[t, k]}(x_t),    E_e(x) = W2_e (SiLU(a) * u),  [a; u] = W1_e x

(the bias-free SwiGLU expert of arXiv 2604.23108, docs/method.md §1.2). Experts come in *width classes*:
class c holds n_c experts of intermediate width h_c, stored as one tensor per class. Expert ids are
class-major: ids [off_c, off_c + n_c) belong to class c. For MoHGE a class is a group, so class-major
is exactly the router order.

Legend: T tokens, D model width, K experts per token, E experts, A = T*K routed slots,
C tokens of one expert, H intermediate width of one class.

Tensor contract (shared with the Triton path in ``swiglu.py``):
    x_TD      float [T, D]
    idx_TK    int64 [T, K]         expert id per slot, in [0, E)
    gates_TK  float [T, K]
    w1s       list of [n_c, 2*H_c, D]   rows [0, H) are the gate a, rows [H, 2H) the up projection u
    w2s       list of [n_c, D, H_c]
    returns   float [T, D]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def check_contract(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> int:
    """Validate shapes and dtypes shared by every backend; return the number of experts E."""
    if x_TD.dim() != 2:
        raise ValueError(f"x must be [T, D], got shape {tuple(x_TD.shape)}")
    T, D = x_TD.shape
    if idx_TK.shape != gates_TK.shape or idx_TK.dim() != 2 or idx_TK.shape[0] != T:
        raise ValueError(f"idx {tuple(idx_TK.shape)} and gates {tuple(gates_TK.shape)} must both be [T={T}, K]")
    if idx_TK.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"idx must be an integer tensor, got {idx_TK.dtype}")
    if len(w1s) != len(w2s) or not w1s:
        raise ValueError(f"need one (w1, w2) pair per width class, got {len(w1s)} and {len(w2s)}")
    E = 0
    for c, (w1, w2) in enumerate(zip(w1s, w2s, strict=True)):
        n, two_h, d1 = w1.shape
        n2, d2, h = w2.shape
        if d1 != D or d2 != D or n != n2 or two_h != 2 * h:
            raise ValueError(
                f"class {c}: w1 {tuple(w1.shape)} / w2 {tuple(w2.shape)} do not fit [n, 2H, D={D}] / [n, D={D}, H]"
            )
        if w1.dtype != x_TD.dtype or w2.dtype != x_TD.dtype:
            raise ValueError(f"class {c}: weight dtype {w1.dtype}/{w2.dtype} != input dtype {x_TD.dtype}")
        E += n
    return E


def _flat_weights(w1s, w2s) -> tuple[list[Tensor], list[Tensor]]:
    """Per-expert views, in class-major expert-id order."""
    return [w[j] for w in w1s for j in range(w.shape[0])], [w[j] for w in w2s for j in range(w.shape[0])]


def swiglu_loop(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> Tensor:
    """The obvious reference: one expert at a time, tokens found by masking (what the release runs).

    Autograd does the backward. Slow but transparently right; every faster path is tested against it.
    """
    E = check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    w1_e, w2_e = _flat_weights(w1s, w2s)
    y_TD = torch.zeros_like(x_TD)
    for e in range(E):
        tok_C, slot_C = torch.where(idx_TK == e)
        if tok_C.numel() == 0:
            continue
        a_CH, u_CH = (x_TD[tok_C] @ w1_e[e].t()).chunk(2, dim=-1)
        out_CD = (F.silu(a_CH) * u_CH) @ w2_e[e].t()
        y_TD = y_TD.index_add(0, tok_C, out_CD * gates_TK[tok_C, slot_C, None])
    return y_TD


def sort_slots(idx_TK: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """Sort the T*K routed slots by expert id (stable, so ties keep token order).

    Returns (order_A, tok_A, counts_E): order_A are flat slot ids sorted by expert, tok_A = order_A // K
    the token of each sorted slot, counts_E the number of slots per expert (zero allowed).
    """
    flat_A = idx_TK.reshape(-1)
    order_A = torch.argsort(flat_A, stable=True)
    tok_A = torch.div(order_A, idx_TK.shape[1], rounding_mode="floor")
    counts_E = torch.bincount(flat_A, minlength=num_experts)
    return order_A, tok_A, counts_E


class _GroupedSwiGLU(torch.autograd.Function):
    """Sort-gather-compute-scatter with a hand-written backward.

    Every expert sees one contiguous slice of the sorted rows, so each projection is a single GEMM on
    contiguous memory; only the pre-activation H per expert is kept for the backward.
    """

    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, num_classes, *weights):
        w1s, w2s = weights[:num_classes], weights[num_classes:]
        w1_e, w2_e = _flat_weights(w1s, w2s)
        E = len(w1_e)
        order_A, tok_A, counts_E = sort_slots(idx_TK, E)
        gate_A = gates_TK.reshape(-1)[order_A]
        xs_AD = x_TD[tok_A]
        out_AD = x_TD.new_empty(xs_AD.shape)
        pre = []  # pre-activation [C, 2H] per non-empty expert
        bounds = [0, *torch.cumsum(counts_E, 0).tolist()]
        for e in range(E):
            s, t = bounds[e], bounds[e + 1]
            if s == t:
                pre.append(None)
                continue
            h_C2H = xs_AD[s:t] @ w1_e[e].t()
            a_CH, u_CH = h_C2H.chunk(2, dim=-1)
            torch.mm(F.silu(a_CH) * u_CH, w2_e[e].t(), out=out_AD[s:t])
            pre.append(h_C2H)
        y_TD = torch.zeros_like(x_TD).index_add_(0, tok_A, out_AD * gate_A[:, None])
        ctx.num_classes = num_classes
        ctx.bounds = bounds
        ctx.pre = pre
        ctx.save_for_backward(xs_AD, out_AD, order_A, tok_A, gate_A, gates_TK, *weights)
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_AD, out_AD, order_A, tok_A, gate_A, gates_TK, *weights = ctx.saved_tensors
        nc = ctx.num_classes
        w1s, w2s = weights[:nc], weights[nc:]
        w1_e, w2_e = _flat_weights(w1s, w2s)
        dys_AD = dy_TD[tok_A]
        dgate_A = (out_AD * dys_AD).sum(-1)
        dout_AD = dys_AD * gate_A[:, None]
        dxs_AD = torch.empty_like(xs_AD)  # every sorted row belongs to exactly one expert slice
        dw1s = [torch.zeros_like(w) for w in w1s]
        dw2s = [torch.zeros_like(w) for w in w2s]
        members = [(c, j) for c, w in enumerate(w1s) for j in range(w.shape[0])]
        for e, h_C2H in enumerate(ctx.pre):
            if h_C2H is None:
                continue
            c, j = members[e]
            s, t = ctx.bounds[e], ctx.bounds[e + 1]
            a_CH, u_CH = h_C2H.chunk(2, dim=-1)
            silu_CH = F.silu(a_CH)
            dact_CH = dout_AD[s:t] @ w2_e[e]
            torch.mm(dout_AD[s:t].t(), silu_CH * u_CH, out=dw2s[c][j])
            dh_C2H = torch.empty_like(h_C2H)
            H = a_CH.shape[1]
            # d/da SiLU(a)*u = dact*u*SiLU'(a) (aten's fused silu_backward); d/du = dact*SiLU(a)
            dh_C2H[:, :H] = torch.ops.aten.silu_backward(dact_CH * u_CH, a_CH)
            torch.mul(dact_CH, silu_CH, out=dh_C2H[:, H:])
            torch.mm(dh_C2H.t(), xs_AD[s:t], out=dw1s[c][j])
            torch.mm(dh_C2H, w1_e[e], out=dxs_AD[s:t])
        dx_TD = torch.zeros_like(dy_TD).index_add_(0, tok_A, dxs_AD)
        dgates_TK = torch.zeros_like(gates_TK).reshape(-1).index_copy_(0, order_A, dgate_A)
        ctx.pre = None
        return (dx_TD, None, dgates_TK.view_as(gates_TK), None, *dw1s, *dw2s)


def swiglu_grouped_torch(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> Tensor:
    """Fast pure-torch path (the CPU training path): one sort, one gather, a GEMM per expert slice."""
    check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    return _GroupedSwiGLU.apply(x_TD, idx_TK, gates_TK, len(w1s), *w1s, *w2s)
