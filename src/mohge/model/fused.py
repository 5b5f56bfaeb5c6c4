"""The fused training path for small models: ``train.fused: true`` (docs/speed.md).

At the capacity study's sizes (d_model 32 and 64, windows of 5 tokens) a training step's time goes to kernels whose
inner loops are a few elements long (PyTorch's CPU flash attention per (window, head) problem, RoPE over half-rows of
4 channels, the norms, the routers' softmax and top-k over 4 to 32 entries a token) and to the [T, V] tensors of the
LM head's cross-entropy, written and read again four times. The fused path runs:

- a block's attention half, ``x + attn(norm(x))`` (norm, QKV, RoPE, attention, output projection, residual) and the
  feed-forward norm of its output, as one graph compiled by ``torch.compile`` (inductor: loops over whole rows,
  fused) when it is multi-head attention over causal windows, the attention written as broadcast products and a
  masked softmax (:func:`short_causal_attention`) in place of ``F.scaled_dot_product_attention`` up to
  :data:`SHORT_WINDOW` tokens, SDPA inside the graph beyond (:func:`mohge.model.transformer._attention_half`); masks
  and MLA stay eager;
- the MoE router's forward (scores, selection, gates) and the layer's aux losses, compiled: :func:`route`; on a CPU
  in fp32 the router's steps after its GEMMs, forward and backward, are kernels of our own that the graph calls
  (:mod:`mohge.model.route_kernel`), elsewhere its top-k (:mod:`mohge.model.topk`);
- on a CPU, the routed experts with each width class's pre-activations transposed and their combine by token as
  kernels of our own in fp32 (:func:`mohge.model.native.combine`), compiled otherwise: :func:`experts`;
- the LM head and its mean cross-entropy in chunks of :data:`LOSS_CHUNK` tokens (:func:`linear_cross_entropy`): each
  chunk's logits, softmax and gradients stay in cache and the [T, V] logits are never stored, the softmax and its
  gradient one kernel pass a row in fp32 on a CPU (:func:`mohge.model.native.softmax_xent_`); under bf16 autocast
  the chunk's GEMMs in bf16 and the softmax in fp32.

Compiled graphs are built once per shape at the first steps and shared by every layer. Each piece computes the eager
model's function in other roundings (the order of a sum, inductor's exponential), so a run on the fused path is a run
of its own, not the committed studies' arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn as nn

from mohge import kernels
from mohge.kernels.reference import RowLayout, check_contract, pads_rows, swiglu_grouped_torch

from . import native
from .routing import Routing

Tensor = torch.Tensor

# The longest window compiled as broadcast products. Measured on an Intel Xeon with AMX, one thread, forward and
# backward against SDPA at B*H*S = 40,960: 0.25x its time at 5 tokens, 0.43x at 8, 0.84x at 16, 1.61x at 32.
SHORT_WINDOW = 16

# The narrowest width class whose experts' dW2 [D, H] is computed in place as doutT @ actT (both operands transposed)
# rather than as [H, D] then copied. Measured on an AMD EPYC with avx512_bf16, one thread, 8 experts of 384 rows at D
# 512: the copying form takes 0.78x the in-place form's time at H 32 and 0.07x at H 11; 1.03x at 64, 1.26x at 192,
# 1.38x at 416, 1.28x at 640 (MKL gave the same bits both ways from H 32 there).
DW2_DIRECT_WIDTH = 64

# Tokens per chunk of the head's loss. Measured at T 10,240, D 32, V 514, one thread, forward and backward: 0.56x
# the time of F.linear + F.cross_entropy at 128 tokens, 0.51x at 256, 0.50x at 512, 0.56x at 1,024.
LOSS_CHUNK = 512


def short_causal_attention(q_BHSd: Tensor, k_BHSd: Tensor, v_BHSd: Tensor) -> Tensor:
    """Causal softmax attention (scale 1/sqrt(d)) as ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``
    computes it, written as broadcast products and sums over a short window: compiled, each query's scores, softmax
    and weighted sum run as one loop over its few keys."""
    S, d = q_BHSd.shape[-2:]
    s_BHSS = (q_BHSd[..., :, None, :] * k_BHSd[..., None, :, :]).sum(-1) * d**-0.5
    causal_SS = torch.ones(S, S, dtype=torch.bool, device=q_BHSd.device).tril()
    p_BHSS = torch.softmax(s_BHSS.masked_fill(~causal_SS, float("-inf")), dim=-1)
    return (p_BHSS[..., None] * v_BHSd[..., None, :, :]).sum(-2)


# Graphs dynamo keeps for one compiled function before it runs that function eagerly, silently, from then on (its own
# limit is 8): a graph per shape, dtype and module class (the MoE and MoHGE routers share `_routed`), and one process
# may train, bench or test many (`mohge bench peers` times 12 of the router's; a test process more)
RECOMPILE_LIMIT = 64


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled by ``torch.compile`` (static shapes: once per shape), one compiled function per ``fn``; dynamo's
    recompile limit raised to :data:`RECOMPILE_LIMIT` for the process (never lowered)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False)


def _routed(layer: nn.Module, x_TD: Tensor) -> tuple[tuple[Tensor | None, ...], dict[str, Tensor]]:
    r = layer.router(x_TD)
    aux = layer.aux_losses(r) if layer.training else {}
    return (r.idx_TK, r.gates_TK, r.probs_TE, r.group_logits_TG, r.group_map_TG), aux


def route(layer: nn.Module, x_TD: Tensor) -> tuple[Routing, dict[str, Tensor]]:
    """``layer.router(x_TD)`` and, in training, the layer's aux losses of that routing, compiled as one graph (one for
    every MoE layer of a class and configuration)."""
    (idx, gates, probs, group_logits, group_map), aux = compiled(_routed)(layer, x_TD)
    r = Routing(idx_TK=idx, gates_TK=gates, probs_TE=probs, group_logits_TG=group_logits, group_map_TG=group_map)
    return r, aux


def _combine(out_PD: Tensor, row_TK: Tensor, gates_TK: Tensor) -> Tensor:
    """y[t] = sum_k gates[t, k] * out[row[t, k]]: a token's expert outputs, read by gather, summed in slot order."""
    T, K = row_TK.shape
    return (out_PD[row_TK.reshape(-1)].view(T, K, -1) * gates_TK[..., None]).sum(1)


def _combine_backward(
    dy_TD: Tensor, out_PD: Tensor, row_TK: Tensor, tok_P: Tensor, gate_P: Tensor
) -> tuple[Tensor, Tensor]:
    """The gradients of :func:`_combine`: per row, its token's dy times its gate (0 on a padding row, token T); per
    slot, dy of its token dotted with its row's output."""
    T, K = row_TK.shape
    padded = tok_P.shape[0] > T * K  # a static shape: decided once per compiled graph
    dy_ext = torch.cat([dy_TD, dy_TD.new_zeros(1, dy_TD.shape[1])]) if padded else dy_TD
    dout_PD = dy_ext[tok_P] * gate_P[:, None]
    dgates_TK = (out_PD[row_TK.reshape(-1)].view(T, K, -1) * dy_TD[:, None, :]).sum(-1)
    return dout_PD, dgates_TK


def _sum_rows(v_PD: Tensor, row_TK: Tensor) -> Tensor:
    """[T, D]: the rows of each token's slots summed, in slot order."""
    T, K = row_TK.shape
    return v_PD[row_TK.reshape(-1)].view(T, K, -1).sum(1)


# Elements of one half (gate or up) of a class's transposed pre-activations the element-wise steps take at a time: a
# run of consecutive experts of the class, so the steps read what their GEMMs just wrote while it is in cache and write
# what the next GEMMs read. Measured on an Intel Xeon with AMX, one thread, forward and backward of the peers bench's
# d256 MoE layer (width 240, about 512 rows an expert): 0.93-0.96x the eager layer's time with runs of 2^13 to 2^17
# elements, 1.0x with whole classes (runs of any size: the capacity study's d_model 64 step took the same time).
ELEMENTWISE_CHUNK = 1 << 16


def _chunks(cols: list[tuple[int, int]], H: int) -> list[tuple[int, int]]:
    """Runs [j0, j1) of a class's experts whose columns ``cols`` hold at most :data:`ELEMENTWISE_CHUNK` elements of a
    half of width ``H`` together (at least one expert each)."""
    runs, j0 = [], 0
    for j in range(1, len(cols)):
        if (cols[j][1] - cols[j0][0]) * H > ELEMENTWISE_CHUNK:
            runs.append((j0, j))
            j0 = j
    return [*runs, (j0, len(cols))]


class _ClassSwiGLU(torch.autograd.Function):
    """The grouped pure-torch expert block (:mod:`mohge.kernels.reference`: one sort, one gather, GEMMs on each
    expert's contiguous slice of the sorted rows) with each width class's pre-activations stored transposed, one
    [2H, rows of the class] buffer, and its SiLU products, one [H, rows] buffer kept for the backward: the gate and up
    halves are row-major blocks whose rows are an expert's tokens, so SiLU and the products run over rows hundreds of
    elements long, on runs of experts (:func:`_chunks`), instead of per expert over half-rows of H elements (the
    grouped path: element by element in each row's tail, 5-6x the time at widths 5-19). The combine by token, its
    gradients and the input's gradient are gathers by slot in place of index_add: kernels of our own on fp32 CPU rows
    (:func:`mohge.model.native.combine`, :func:`~mohge.model.native.combine_backward`), else :func:`_combine`,
    :func:`_combine_backward`, :func:`_sum_rows`, compiled where the row count is fixed (no padding rows). Each
    expert's operands are views made by one split or unbind per tensor, the same views as indexing them one by one."""

    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, num_classes, *weights):
        w1s, w2s = weights[:num_classes], weights[num_classes:]
        lay = RowLayout(x_TD, idx_TK, sum(w.shape[0] for w in w1s), pads_rows(x_TD))
        rows_A = torch.arange(len(lay.order_A), device=x_TD.device) if lay.dest_A is None else lay.dest_A
        row_TK = torch.empty_like(lay.order_A).index_copy_(0, lay.order_A, rows_A).view_as(idx_TK)
        gate_P = lay.per_row(gates_TK.reshape(-1).index_select(0, lay.order_A))
        xs_PD = lay.gather(x_TD)
        out_PD = torch.empty_like(xs_PD)  # every row lies in one expert's slice
        saved, first = [], 0
        for w1, w2 in zip(w1s, w2s, strict=True):
            n, H = w2.shape[0], w2.shape[2]
            r0 = lay.row0[first]
            cols = [(lay.row0[first + j] - r0, lay.row0[first + j + 1] - r0) for j in range(n)]
            sizes = [t - s for s, t in cols]
            R = cols[-1][1]
            hT_2HR, act_HR = x_TD.new_empty(2 * H, R), x_TD.new_empty(H, R)
            h_j, xT_j = hT_2HR.split(sizes, dim=1), xs_PD[r0 : r0 + R].t().split(sizes, dim=1)
            out_j, w1_j, w2T_j = out_PD[r0 : r0 + R].split(sizes), w1.unbind(0), w2.transpose(1, 2).unbind(0)
            for j0, j1 in _chunks(cols, H):
                c0, c1 = cols[j0][0], cols[j1 - 1][1]
                for j in range(j0, j1):
                    if sizes[j]:
                        torch.mm(w1_j[j], xT_j[j], out=h_j[j])
                act_CH = native.silu_mul(hT_2HR[:H, c0:c1], hT_2HR[H:, c0:c1], out=act_HR[:, c0:c1]).t()
                for j, act_ch in zip(range(j0, j1), act_CH.split(sizes[j0:j1]), strict=True):
                    if sizes[j]:
                        torch.mm(act_ch, w2T_j[j], out=out_j[j])
            saved.append((r0, cols, hT_2HR, act_HR))
            first += n
        glue = compiled if lay.dest_A is None else (lambda fn: fn)
        ctx.num_classes, ctx.lay, ctx.classes, ctx.glue = num_classes, lay, saved, glue
        ctx.save_for_backward(xs_PD, out_PD, row_TK, gate_P, *weights)
        y_TD = native.combine(out_PD, row_TK, gates_TK)  # fp32 on a CPU: one kernel pass, else the graph
        return glue(_combine)(out_PD, row_TK, gates_TK) if y_TD is None else y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_PD, out_PD, row_TK, gate_P, *weights = ctx.saved_tensors
        w1s, w2s = weights[: ctx.num_classes], weights[ctx.num_classes :]
        grads = native.combine_backward(dy_TD.contiguous(), out_PD, row_TK, ctx.lay.tok_P, gate_P)
        if grads is None:
            grads = ctx.glue(_combine_backward)(dy_TD, out_PD, row_TK, ctx.lay.tok_P, gate_P)
        dout_PD, dgates_TK = grads
        need_dx = ctx.needs_input_grad[0]  # an input that needs no gradient (frozen) gets no input-gradient GEMMs
        dxs_PD = torch.empty_like(xs_PD) if need_dx else None
        dw1s, dw2s = [torch.empty_like(w) for w in w1s], []
        for w1, w2, dw1, (r0, cols, hT_2HR, act_HR) in zip(w1s, w2s, dw1s, ctx.classes, strict=True):
            H = w2.shape[2]
            sizes = [t - s for s, t in cols]
            R = cols[-1][1]
            doutT_j, dout_j = dout_PD[r0 : r0 + R].t().split(sizes, dim=1), dout_PD[r0 : r0 + R].split(sizes)
            xs_j = xs_PD[r0 : r0 + R].split(sizes)
            dxs_j = dxs_PD[r0 : r0 + R].split(sizes) if need_dx else None
            # narrow classes: each expert's dW2 transposed, [H, D] = act [H, rows] @ dout [rows, D], MKL's GEMM on
            # the row-major operands as they lie, then one copy (dW2 [D, H] as doutT @ actT, both operands
            # transposed, ran 4-6x slower at H <= 11); from DW2_DIRECT_WIDTH that form, into dW2 itself
            direct = H >= DW2_DIRECT_WIDTH
            dw2 = w2.new_empty(w2.shape) if direct else w2.new_empty(w2.shape[0], H, w2.shape[1])
            w1_j, w2T_j, dw1_j, dw2_j = w1.unbind(0), w2.transpose(1, 2).unbind(0), dw1.unbind(0), dw2.unbind(0)
            for j0, j1 in _chunks(cols, H):
                c0, c1 = cols[j0][0], cols[j1 - 1][1]
                a_HC, u_HC = hT_2HR[:H, c0:c1], hT_2HR[H:, c0:c1]
                act_j = act_HR[:, c0:c1].split(sizes[j0:j1], dim=1)
                dact_HC = a_HC.new_empty(a_HC.shape)
                dact_j = dact_HC.split(sizes[j0:j1], dim=1)
                for k, j in enumerate(range(j0, j1)):
                    if not sizes[j]:  # an expert without a token: its weights get zero gradients
                        dw1_j[j].zero_()
                        dw2_j[j].zero_()
                        continue
                    torch.mm(w2T_j[j], doutT_j[j], out=dact_j[k])
                    if direct:
                        torch.mm(doutT_j[j], act_j[k].t(), out=dw2_j[j])
                    else:
                        torch.mm(act_j[k], dout_j[j], out=dw2_j[j])
                dh_2HC = a_HC.new_empty(2 * H, c1 - c0)
                native.silu_mul_backward(a_HC, u_HC, dact_HC, dh_2HC[:H], dh_2HC[H:])  # d/da, d/du of SiLU(a)*u
                dh_j, dhT_j = dh_2HC.split(sizes[j0:j1], dim=1), dh_2HC.t().split(sizes[j0:j1])
                for k, j in enumerate(range(j0, j1)):
                    if sizes[j]:
                        torch.mm(dh_j[k], xs_j[j], out=dw1_j[j])
                        if need_dx:
                            torch.mm(dhT_j[k], w1_j[j], out=dxs_j[j])
            dw2s.append(dw2 if direct else dw2.transpose(1, 2).contiguous())
        dx_TD = None
        if need_dx:
            dx_TD = native.combine(dxs_PD, row_TK, None)
            dx_TD = ctx.glue(_sum_rows)(dxs_PD, row_TK) if dx_TD is None else dx_TD
        ctx.lay = ctx.classes = None
        return (dx_TD, None, dgates_TK, None, *dw1s, *dw2s)


def experts(bank: nn.Module, x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor) -> Tensor:
    """``bank(x_TD, idx_TK, gates_TK)`` (:class:`~mohge.model.experts.RoutedExperts`) on the fused path: where its
    backend is the pure-torch one (a CPU) and it computes in fp32 (or fp64), the experts' function computed by
    :class:`_ClassSwiGLU`, in other roundings (vectorised SiLU, sums by token in slot order); in bf16 on a CPU the
    grouped pure-torch path with SiLU and its products through :mod:`mohge.model.native`; elsewhere the bank's own
    kernels."""
    if kernels.resolve_backend(bank.backend, x_TD.device) != "torch":
        return bank(x_TD, idx_TK, gates_TK)
    x_TD, gates_TK, w1s, w2s = bank.operands(x_TD, gates_TK)
    if pads_rows(x_TD):  # bf16/fp16 on a CPU: oneDNN's GEMMs on transposed operands and strided outputs cost more
        return swiglu_grouped_torch(x_TD, idx_TK, gates_TK, w1s, w2s, silu=native)
    return class_swiglu(x_TD, idx_TK, gates_TK, w1s, w2s)


def class_swiglu(x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor, w1s, w2s) -> Tensor:
    """The expert block of :func:`mohge.kernels.expert_swiglu` (its tensor contract) through :class:`_ClassSwiGLU`."""
    check_contract(x_TD, idx_TK, gates_TK, w1s, w2s)
    return _ClassSwiGLU.apply(x_TD, idx_TK, gates_TK, len(w1s), *w1s, *w2s)


def _softmax_xent_(z_CV: Tensor, y_C1: Tensor, T: int, total: Tensor) -> Tensor:
    """:func:`mohge.model.native.softmax_xent_` in torch's ops (any dtype and device): the rows' losses added to
    ``total``, the gradient (softmax - one-hot) / T returned (``z_CV`` overwritten on the way)."""
    z_CV -= z_CV.amax(-1, keepdim=True)
    p_CV = z_CV.exp()
    sum_C1 = p_CV.sum(-1, keepdim=True)
    total += (sum_C1.log() - z_CV.gather(1, y_C1)).sum()  # -log softmax at the target
    p_CV /= sum_C1
    p_CV.scatter_add_(1, y_C1, p_CV.new_full(y_C1.shape, -1.0))  # d(loss sum)/dz = softmax - one-hot
    p_CV *= 1.0 / T
    return p_CV


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the logits ``h W^T`` against ``y``, with its gradients computed chunk by chunk in the
    forward pass (softmax minus the one-hot, over T) and scaled by the incoming gradient in the backward. ``dt``: the
    dtype the head's GEMMs compute in (autocast's; None: the operands' own), the softmax always in fp32."""

    @staticmethod
    def forward(ctx, h_TD: Tensor, w_VD: Tensor, y_T: Tensor, chunk: int, dt: torch.dtype | None) -> Tensor:
        T = h_TD.shape[0]
        dh_TD, dw_VD = torch.empty_like(h_TD), torch.zeros_like(w_VD)
        total = h_TD.new_zeros((), dtype=torch.float32 if dt else h_TD.dtype)
        hc_TD, wc_VD = (h_TD, w_VD) if dt is None else (h_TD.to(dt), w_VD.to(dt))
        with torch.autocast(h_TD.device.type, enabled=False):
            for s in range(0, T, chunk):
                h_CD, y_C = hc_TD[s : s + chunk], y_T[s : s + chunk]
                z_CV = h_CD @ wc_VD.t()
                if dt is not None:  # the logits rounded to dt, as autocast's F.linear gives them, then fp32
                    z_CV = z_CV.float()
                if z_CV.dtype == torch.float32 and z_CV.device.type == "cpu":  # one kernel pass a row:
                    total += native.softmax_xent_(z_CV, y_C, 1.0 / T)  # z_CV overwritten with (softmax - onehot) / T
                    p_CV = z_CV
                else:
                    p_CV = _softmax_xent_(z_CV, y_C[:, None], T, total)
                if dt is None:
                    torch.mm(p_CV, wc_VD, out=dh_TD[s : s + chunk])
                    dw_VD.addmm_(p_CV.t(), h_CD)
                else:  # the logits' gradient rounded to dt, as autocast's F.linear takes it back
                    p_CV = p_CV.to(dt)
                    dh_TD[s : s + chunk] = p_CV @ wc_VD
                    dw_VD += p_CV.t() @ h_CD
        ctx.save_for_backward(dh_TD, dw_VD)
        return total / T

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor, None, None, None]:
        dh_TD, dw_VD = ctx.saved_tensors
        return dh_TD * g, dw_VD * g, None, None, None


def linear_cross_entropy(h_TD: Tensor, w_VD: Tensor, y_T: Tensor, chunk: int = LOSS_CHUNK) -> Tensor:
    """``F.cross_entropy(F.linear(h, w), y)`` (the mean over T tokens) in chunks of ``chunk`` tokens, the logits never
    stored whole: the same function in other roundings (a chunk's sums, the mean as a sum of chunk sums). Under
    autocast the head's GEMMs compute in its dtype, as autocast's ``F.linear`` does, and the softmax in fp32."""
    if h_TD.dim() != 2 or y_T.shape != h_TD.shape[:1] or w_VD.shape[1] != h_TD.shape[1]:
        raise ValueError(f"linear_cross_entropy: h {tuple(h_TD.shape)}, w {tuple(w_VD.shape)}, y {tuple(y_T.shape)}")
    device = h_TD.device.type
    dt = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    return _LinearCrossEntropy.apply(h_TD, w_VD, y_T, chunk, dt)


def use_fused(model: nn.Module) -> int:
    """Train ``model`` on the fused path from now on: every module with a ``fused`` switch
    (:class:`~mohge.model.transformer.LanguageModel`: its head's loss; :class:`~mohge.model.transformer.Block`: its
    attention half; :class:`~mohge.model.moe.MoELayer`: its router) is switched on; returns how many were."""
    switched = 0
    for m in model.modules():
        if isinstance(getattr(m, "fused", None), bool):
            m.fused = True
            switched += 1
    return switched
