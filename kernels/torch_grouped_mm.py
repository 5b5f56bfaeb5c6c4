"""Backend ``grouped_mm``: one ``torch.nn.functional.grouped_mm`` per width class for each projection.

The experts of one width class share their shapes, so a class's GEMMs are one grouped GEMM over the sorted rows,
the class's experts delimited by ``offs`` (int32 ends of each expert's rows). Per class c (n_c experts, width H):

    forward   h = grouped_mm(xs, W1^T)           [P_c, 2H]     a, u = h[:, :H], h[:, H:]
              out = grouped_mm(SiLU(a) u, W2^T)   [P_c, D]
    backward  dact = grouped_mm(dout, W2)         [P_c, H]
              dW2 = grouped_mm(dout^T, SiLU(a) u) [n_c, D, H]   (2-D x 2-D: the rows are the jagged K)
              dh = [SiLU'(a) u dact | SiLU(a) dact]
              dW1 = grouped_mm(dh^T, xs)          [n_c, 2H, D]
              dxs = grouped_mm(dh, W1)            [P_c, D]

No Python loop over experts, no zero-filled gradient (an expert without rows gets the grouped GEMM's zero block),
the token rows gathered and the outputs scattered by index (:class:`mohge.kernels.reference.RowLayout`, shared
with the ``torch`` backend, so the two order every sum alike). On a CPU ``grouped_mm`` calls one GEMM per group
and agrees with ``torch`` to rounding (MKL's fp32 results may depend on a slice's alignment). On CUDA it is
PyTorch's grouped GEMM (CUTLASS on Hopper), bf16 only there; on a CPU it takes fp32 and bf16 (bf16 rows padded
to bucketed counts, see :func:`mohge.kernels.reference.row_bucket`).

Its requirement: every row stride a multiple of 16 bytes, i.e. D and every width H a multiple of 4 (fp32) or 8
(bf16) elements; :func:`check_alignment` names the offending size.

Legend: T tokens, D model width, K experts per token, A = T*K routed slots, P rows of the (padded) row buffer,
H width of one class, n_c experts of class c.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import RowLayout, check_contract, gate_up_halves, pads_rows

Tensor = torch.Tensor


def check_alignment(x_TD: Tensor, w1s, w2s) -> None:
    """``grouped_mm`` needs 16-byte row strides: D and each width a multiple of 16 / element size."""
    step = 16 // x_TD.element_size()
    sizes = {"d_model": x_TD.shape[1], **{f"width of class {c}": w.shape[2] for c, w in enumerate(w2s)}}
    for name, n in sizes.items():
        if n % step:
            raise ValueError(f"backend grouped_mm: {name}={n} is not a multiple of {step} ({x_TD.dtype} rows)")


class _ClassRows:
    """Rows of the row buffer that belong to each width class, and the int32 ``offs`` of its experts."""

    def __init__(self, lay: RowLayout, sizes: list[int], device: torch.device) -> None:
        self.spans, self.offs = [], []
        e0 = 0
        for n in sizes:
            r0, r1 = lay.row0[e0], lay.row0[e0 + n]
            ends = torch.tensor(lay.row0[e0 + 1 : e0 + n + 1], dtype=torch.int64) - r0
            self.spans.append((r0, r1))
            self.offs.append(ends.to(device=device, dtype=torch.int32))
            e0 += n


class _GroupedMMSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, num_classes, *weights):
        w1s, w2s = weights[:num_classes], weights[num_classes:]
        lay = RowLayout(x_TD, idx_TK, sum(w.shape[0] for w in w1s), pads_rows(x_TD))
        rows = _ClassRows(lay, [w.shape[0] for w in w1s], x_TD.device)
        gate_P = lay.per_row(gates_TK.reshape(-1).index_select(0, lay.order_A))
        xs_PD = lay.gather(x_TD)
        out_PD = x_TD.new_empty(xs_PD.shape)
        pre = []  # pre-activation (a, u), each [P_c, H], per class
        for (r0, r1), offs, w1, w2 in zip(rows.spans, rows.offs, w1s, w2s, strict=True):
            if r0 == r1:
                pre.append(None)
                continue
            h_P2H = F.grouped_mm(xs_PD[r0:r1], w1.transpose(-2, -1), offs=offs)
            a_PH, u_PH = gate_up_halves(h_P2H)
            out_cD = F.grouped_mm(F.silu(a_PH) * u_PH, w2.transpose(-2, -1), offs=offs)
            if r1 - r0 == len(out_PD):  # one class holds every row: its output is the row buffer
                out_PD = out_cD
            else:
                out_PD[r0:r1] = out_cD
            pre.append((a_PH, u_PH))
        y_TD = lay.sum_by_token(out_PD * gate_P[:, None])
        ctx.num_classes, ctx.lay, ctx.rows, ctx.pre = num_classes, lay, rows, pre
        ctx.save_for_backward(xs_PD, out_PD, gate_P, gates_TK, *weights)
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_PD, out_PD, gate_P, gates_TK, *weights = ctx.saved_tensors
        nc, lay, rows = ctx.num_classes, ctx.lay, ctx.rows
        w1s, w2s = weights[:nc], weights[nc:]
        dys_PD = lay.gather(dy_TD)
        dgate_A = lay.per_slot((out_PD * dys_PD).sum(-1))
        dout_PD = dys_PD * gate_P[:, None]
        need_dx = ctx.needs_input_grad[0]  # an input that needs no gradient (frozen) gets no input-gradient GEMMs
        dxs_PD = torch.empty_like(xs_PD) if need_dx else None
        dw1s, dw2s = [], []
        for (r0, r1), offs, w1, w2, au in zip(rows.spans, rows.offs, w1s, w2s, ctx.pre, strict=True):
            if au is None:  # no row in the whole class
                dw1s.append(torch.zeros_like(w1))
                dw2s.append(torch.zeros_like(w2))
                continue
            a_PH, u_PH = au
            silu_PH = F.silu(a_PH)
            dout = dout_PD[r0:r1]
            dact_PH = F.grouped_mm(dout, w2, offs=offs)
            dw2s.append(F.grouped_mm(dout.t(), silu_PH * u_PH, offs=offs))
            P, H = a_PH.shape
            dh_P2H = a_PH.new_empty(P, 2 * H)
            dh_P2H[:, :H] = torch.ops.aten.silu_backward(dact_PH * u_PH, a_PH)  # d/da of SiLU(a) u
            torch.mul(dact_PH, silu_PH, out=dh_P2H[:, H:])  # d/du
            dw1s.append(F.grouped_mm(dh_P2H.t(), xs_PD[r0:r1], offs=offs))
            if not need_dx:
                continue
            dxs_cD = F.grouped_mm(dh_P2H, w1, offs=offs)
            if r1 - r0 == len(dxs_PD):
                dxs_PD = dxs_cD
            else:
                dxs_PD[r0:r1] = dxs_cD
        dx_TD = lay.sum_by_token(dxs_PD) if need_dx else None
        dgates_TK = torch.zeros_like(gates_TK).reshape(-1).index_copy_(0, lay.order_A, dgate_A)
        ctx.pre = ctx.lay = ctx.rows = None
        return (dx_TD, None, dgates_TK.view_as(gates_TK), None, *dw1s, *dw2s)


def swiglu_grouped_mm(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> Tensor:
    """The expert block through ``F.grouped_mm``, one call per width class and projection (contract: reference.py)."""
    check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    check_alignment(x_TD, w1s, w2s)
    w1s, w2s = [w.contiguous() for w in w1s], [w.contiguous() for w in w2s]
    return _GroupedMMSwiGLU.apply(x_TD, idx_TK, gates_TK, len(w1s), *w1s, *w2s)
