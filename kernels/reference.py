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


def _key_dtype(num_experts: int) -> torch.dtype:
    """The narrowest integer type that holds every expert id below ``num_experts``."""
    for dtype in (torch.uint8, torch.int16, torch.int32):
        if num_experts - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def sort_slots(idx_TK: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """Sort the T*K routed slots by expert id (stable, so ties keep token order).

    Returns (order_A, tok_A, counts_E): order_A are flat slot ids sorted by expert, tok_A = order_A // K
    the token of each sorted slot, counts_E the number of slots per expert (zero allowed). The sort reads the ids
    in the narrowest integer type that holds them (a stable sort's order is unique: the same order, computed on
    1-byte keys up to 256 experts, 8x faster than on int64 ones on a CPU at 40 960 slots).
    """
    flat_A = idx_TK.reshape(-1)
    order_A = torch.argsort(flat_A.to(_key_dtype(num_experts)), stable=True)
    tok_A = torch.div(order_A, idx_TK.shape[1], rounding_mode="floor")
    counts_E = torch.bincount(flat_A, minlength=num_experts)
    return order_A, tok_A, counts_E


def row_bucket(count: int) -> int:
    """Rows a GEMM of ``count`` rows is padded to on a CPU in bf16/fp16: a multiple of 16 rows, 4 per octave
    (at most 25% padding, about 12% on average).

    oneDNN, which runs CPU bf16 GEMMs, builds (JIT-compiles) one kernel per GEMM shape and caches it; a ragged
    row count per expert makes nearly every call a new shape (measured: 3.3x the time of a repeated shape at
    [C, 256] x [256, 480]). Bucketed counts reuse a few hundred cached kernels. fp32 GEMMs go to MKL, which
    has no per-shape cost: nothing is padded there, so the fp32 path is unchanged.
    """
    if count <= 16:
        return 16 * (count > 0)
    step = max(16, 1 << (count.bit_length() - 3))  # 2^floor(log2 count) / 4
    return -(-count // step) * step


def pads_rows(x: Tensor) -> bool:
    """Whether the expert GEMMs of ``x`` run on bucketed row counts (:func:`row_bucket`): CPU bf16/fp16."""
    return x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16)


class RowLayout:
    """Where the sorted slots live in the row buffer of the expert GEMMs.

    Sorted slot i of expert e sits at row ``row0[e] + i - bound[e]``; without padding the buffer is the
    sorted slots themselves (``dest_A`` None). With padding each expert owns ``rows[e] >= counts[e]`` rows, the
    extra rows all-zero in the inputs (a zero row maps to a zero output row and adds zero to a weight gradient).
    ``tok_P`` is the token of each row, ``T`` (one past the last token) on a padding row: a gather reads a zero row
    there and a sum by token drops it, so every per-row step of the layer runs on the row buffer as it is.
    """

    def __init__(self, x_TD: Tensor, idx_TK: Tensor, num_experts: int, pad: bool) -> None:
        self.order_A, self.tok_A, counts_E = sort_slots(idx_TK, num_experts)
        self.counts = counts_E.tolist()
        self.bounds = [0, *torch.cumsum(counts_E, 0).tolist()]
        self.T = x_TD.shape[0]
        self.dest_A: Tensor | None = None
        self.tok_P = self.tok_A
        self.rows = self.counts
        if pad:
            self.rows = [row_bucket(c) for c in self.counts]
            row0_E = torch.tensor([0, *self.rows[:-1]]).cumsum(0)
            shift_E = row0_E - torch.tensor(self.bounds[:-1])
            self.dest_A = torch.arange(self.tok_A.numel()) + torch.repeat_interleave(shift_E, counts_E.cpu())
            self.dest_A = self.dest_A.to(x_TD.device)
            self.tok_P = self.tok_A.new_full((sum(self.rows),), self.T)
            self.tok_P[self.dest_A] = self.tok_A
        self.row0 = [0, *torch.tensor(self.rows, dtype=torch.int64).cumsum(0).tolist()]

    @property
    def num_rows(self) -> int:
        return self.row0[-1]

    def gather(self, x_TD: Tensor) -> Tensor:
        """Row buffer [P, D] of the token rows: x[tok] per row, zero rows for padding."""
        if self.dest_A is None:
            return x_TD.index_select(0, self.tok_A)  # row copies: ~3x the speed of indexing at [T, 32]
        return torch.cat([x_TD, x_TD.new_zeros(1, x_TD.shape[1])]).index_select(0, self.tok_P)

    def per_row(self, v_A: Tensor) -> Tensor:
        """A value per sorted slot [A] as a value per row [P], 0 on padding rows."""
        if self.dest_A is None:
            return v_A
        return v_A.new_zeros(self.num_rows).index_copy_(0, self.dest_A, v_A)

    def per_slot(self, v_P: Tensor) -> Tensor:
        """The values [A] of the real rows (sorted slot order) of a value per row [P]."""
        return v_P if self.dest_A is None else v_P.index_select(0, self.dest_A)

    def sum_by_token(self, v_PD: Tensor) -> Tensor:
        """[T, D]: the rows of ``v_PD`` summed by token, in row order (padding rows dropped)."""
        if self.dest_A is None:
            return v_PD.new_zeros(self.T, v_PD.shape[1]).index_add_(0, self.tok_A, v_PD)
        return v_PD.new_zeros(self.T + 1, v_PD.shape[1]).index_add_(0, self.tok_P, v_PD)[: self.T]


def gate_up_halves(h_R2H: Tensor) -> tuple[Tensor, Tensor]:
    """The gate a and up u halves [R, H] of a pre-activation [R, 2H].

    In bf16/fp16 they are copied out of their row-strided views, so SiLU and the products that follow run
    vectorised over one flat range: on a strided view a CPU's elementwise loop goes row by row and does each
    row's tail (H mod the vector width) element by element, in the slow scalar SiLU. fp32 keeps the views: there
    the scalar and vector SiLU round differently, and the copies would change the results' last bits.
    """
    a_RH, u_RH = h_R2H.chunk(2, dim=-1)
    if h_R2H.element_size() < 4:
        a_RH, u_RH = a_RH.contiguous(), u_RH.contiguous()
    return a_RH, u_RH


class _GroupedSwiGLU(torch.autograd.Function):
    """Sort-gather-compute-scatter with a hand-written backward.

    Every expert sees one contiguous slice of the sorted rows, so each projection is a single GEMM on
    contiguous memory; only the pre-activation H per expert is kept for the backward. On a CPU in bf16 the
    slices are padded to bucketed row counts (:func:`row_bucket`, :class:`RowLayout`).
    """

    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, num_classes, silu, *weights):
        w1s, w2s = weights[:num_classes], weights[num_classes:]
        w1_e, w2_e = _flat_weights(w1s, w2s)
        E = len(w1_e)
        lay = RowLayout(x_TD, idx_TK, E, pads_rows(x_TD))
        gate_P = lay.per_row(gates_TK.reshape(-1).index_select(0, lay.order_A))
        xs_PD = lay.gather(x_TD)
        out_PD = x_TD.new_empty(xs_PD.shape)
        pre = []  # pre-activation (a, u), each [C, H], per non-empty expert
        for e in range(E):
            s, t = lay.row0[e], lay.row0[e + 1]
            if s == t:
                pre.append(None)
                continue
            h_C2H = xs_PD[s:t] @ w1_e[e].t()
            if silu is None:
                a_CH, u_CH = gate_up_halves(h_C2H)
                act_CH = F.silu(a_CH) * u_CH
            else:  # the halves as views (the kernels take rows of any stride); each row times its gate
                a_CH, u_CH = h_C2H.chunk(2, dim=-1)
                act_CH = silu.silu_mul(a_CH, u_CH, gate_P[s:t])
            torch.mm(act_CH, w2_e[e].t(), out=out_PD[s:t])
            pre.append((a_CH, u_CH))
        y_TD = lay.sum_by_token(out_PD * gate_P[:, None] if silu is None else out_PD)
        ctx.num_classes, ctx.silu = num_classes, silu
        ctx.lay = lay
        ctx.pre = pre
        ctx.save_for_backward(xs_PD, out_PD, gate_P, gates_TK, *weights)
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_PD, out_PD, gate_P, gates_TK, *weights = ctx.saved_tensors
        nc, lay = ctx.num_classes, ctx.lay
        w1s, w2s = weights[:nc], weights[nc:]
        w1_e, w2_e = _flat_weights(w1s, w2s)
        dys_PD = lay.gather(dy_TD)
        if ctx.silu is None:
            dgate_A = lay.per_slot((out_PD * dys_PD).sum(-1))
            dout_PD = dys_PD * gate_P[:, None]
        else:  # the gates are inside the kernels' products: each row's gate gradient comes out of their backward
            dgate_P, dout_PD = gate_P.new_zeros(gate_P.shape), dys_PD
        need_dx = ctx.needs_input_grad[0]  # an input that needs no gradient (frozen) gets no input-gradient GEMMs
        dxs_PD = torch.empty_like(xs_PD) if need_dx else None  # every row belongs to exactly one expert slice
        # every weight gradient slice is written by its expert's GEMM; only experts without a token need zeros
        dw1s = [torch.empty_like(w) for w in w1s]
        dw2s = [torch.empty_like(w) for w in w2s]
        members = [(c, j) for c, w in enumerate(w1s) for j in range(w.shape[0])]
        for e, au in enumerate(ctx.pre):
            c, j = members[e]
            if au is None:
                dw1s[c][j].zero_()
                dw2s[c][j].zero_()
                continue
            s, t = lay.row0[e], lay.row0[e + 1]
            a_CH, u_CH = au
            if ctx.silu is None:
                silu_CH = F.silu(a_CH)
                act_CH = silu_CH * u_CH
            else:
                act_CH = ctx.silu.silu_mul(a_CH, u_CH, gate_P[s:t])
            dact_CH = dout_PD[s:t] @ w2_e[e]
            torch.mm(dout_PD[s:t].t(), act_CH, out=dw2s[c][j])
            C, H = a_CH.shape
            dh_C2H = a_CH.new_empty(C, 2 * H)
            # d/da SiLU(a)*u = dact*u*SiLU'(a) (aten's fused silu_backward); d/du = dact*SiLU(a)
            if ctx.silu is None:
                dh_C2H[:, :H] = torch.ops.aten.silu_backward(dact_CH * u_CH, a_CH)
                torch.mul(dact_CH, silu_CH, out=dh_C2H[:, H:])
            else:
                ctx.silu.silu_mul_backward(a_CH, u_CH, dact_CH, dh_C2H[:, :H], dh_C2H[:, H:], gate_P[s:t], dgate_P[s:t])
            torch.mm(dh_C2H.t(), xs_PD[s:t], out=dw1s[c][j])
            if need_dx:
                torch.mm(dh_C2H, w1_e[e], out=dxs_PD[s:t])
        dx_TD = lay.sum_by_token(dxs_PD) if need_dx else None
        if ctx.silu is not None:
            dgate_A = lay.per_slot(dgate_P)
        dgates_TK = torch.zeros_like(gates_TK).reshape(-1).index_copy_(0, lay.order_A, dgate_A)
        ctx.pre = ctx.lay = ctx.silu = None
        return (dx_TD, None, dgates_TK.view_as(gates_TK), None, None, *dw1s, *dw2s)


def swiglu_grouped_torch(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s, silu=None) -> Tensor:
    """Fast pure-torch path (the CPU training path): one sort, one gather, a GEMM per expert slice. ``silu``: where
    given (the fused path: :mod:`mohge.model.native`), its ``silu_mul(a, u, g)`` and ``silu_mul_backward(a, u, dact,
    da, du, g, dg)`` compute SiLU and its products on each expert's row-strided halves with each row's gate inside
    (the down projection's rows come out gated, and the gates' gradients out of the backward's pass), in their own
    roundings; else torch's ops, the gates applied to the down projection's output."""
    check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    return _GroupedSwiGLU.apply(x_TD, idx_TK, gates_TK, len(w1s), silu, *w1s, *w2s)
