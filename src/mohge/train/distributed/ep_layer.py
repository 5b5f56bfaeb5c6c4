"""The expert-parallel expert layer: experts spread over the EP ranks, tokens exchanged with ``all_to_all_single``.

Each of the ``ep`` ranks of a group holds the experts that a placement (:mod:`mohge.model.allocation`) gives it, of
several widths, and its own share of the tokens. One forward (docs/method.md, dispatch ``alltoall``):

    dispatch:  every routed slot (t, k) goes to the rank of expert idx[t, k]: slots sorted by destination,
               counts exchanged, token rows and local expert ids sent with ``all_to_all_single``
    compute:   each rank runs its local experts on the rows it received (the grouped SwiGLU of
               :mod:`mohge.kernels`, local expert ids class-major)
    combine:   outputs return with ``all_to_all_single`` (splits swapped) and are summed per token,
               weighted by the gates, on the token's own rank: in fp32 and in slot order k = 0 .. K-1
               (:func:`combine_slots`), as the non-EP combine of the Triton path (``combine_rows``), so the
               result does not depend on the order rows arrive in (the placement, the EP size) and has no
               atomics on CUDA; it is rounded once to the rows' dtype

Only ``all_to_all_single`` is used: gloo handles unequal and zero splits with it, while the list form
``all_to_all`` fails on gloo with unequal sizes. The row exchanges go through a small autograd Function,
so gradients reach the inputs, the gates and every rank's expert weights.

:class:`ExpertParallelExperts` is a drop-in for :class:`mohge.model.experts.RoutedExperts` (same ``forward``). It
keeps one ``w1 [2H, D]`` / ``w2 [D, H]`` pair per local expert under its router id
(``local.<e>.w1``), so a sharded checkpoint names every expert the same way whatever the EP size or the
placement, and ``torch.distributed.checkpoint`` can reshard it; the forward stacks them per width class.

Legend: T tokens (of this rank), K experts per token, A = T*K routed slots, R rows received by this rank,
D model width, E experts, W ranks of the EP group, H intermediate width of one class.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from mohge import kernels
from mohge.model.allocation import experts_of_rank

Tensor = torch.Tensor


class ComputeTimer:
    """Seconds this rank spends in its local expert compute, forward passes with gradient only (the training
    steps; not a held-out evaluation or the global-batch counting pass). On CUDA through events read when the
    time is taken (one synchronisation a log row), elsewhere through the wall clock (the compute is synchronous)."""

    def __init__(self) -> None:
        self.seconds, self.events = 0.0, []

    def __call__(self, fn, *args):
        if not torch.is_grad_enabled():
            return fn(*args)
        if args[0].is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            self.events.append((start, end))
            return out
        t0 = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - t0
        return out

    def take(self) -> float:
        """The seconds since the last call, and a fresh count."""
        if self.events:
            self.events[-1][1].synchronize()
            self.seconds += sum(a.elapsed_time(b) for a, b in self.events) / 1e3
        seconds, self.seconds, self.events = self.seconds, 0.0, []
        return seconds


class _AllToAll(torch.autograd.Function):
    """Differentiable ``all_to_all_single`` of rows: the backward is the same exchange with splits swapped."""

    @staticmethod
    def forward(ctx, x_ND: Tensor, send: list[int], recv: list[int], group) -> Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x_ND.new_empty((sum(recv), *x_ND.shape[1:]))
        dist.all_to_all_single(out, x_ND.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, g_MD: Tensor):
        g_ND = g_MD.new_empty((sum(ctx.send), *g_MD.shape[1:]))
        dist.all_to_all_single(g_ND, g_MD.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return g_ND, None, None, None


class _CombineSlots(torch.autograd.Function):
    """y[t] = sum_k g[t, k] * rows[t, k], fp32 accumulation in k order; saves only the rows (their own dtype)
    and the gates, not an fp32 copy of the rows."""

    @staticmethod
    def forward(ctx, rows_TKD: Tensor, gates_TK: Tensor) -> Tensor:
        ctx.save_for_backward(rows_TKD, gates_TK)
        g_TK = gates_TK.float()
        y_TD = rows_TKD[:, 0].float() * g_TK[:, 0, None]
        for k in range(1, rows_TKD.shape[1]):
            y_TD += rows_TKD[:, k].float() * g_TK[:, k, None]
        return y_TD.to(rows_TKD.dtype)

    @staticmethod
    def backward(ctx, dy_TD: Tensor):
        rows_TKD, gates_TK = ctx.saved_tensors
        dy_TD = dy_TD.float()
        drows_TKD = (dy_TD[:, None, :] * gates_TK.float()[:, :, None]).to(rows_TKD.dtype)
        dgates_TK = torch.einsum("tkd,td->tk", rows_TKD.float(), dy_TD).to(gates_TK.dtype)
        return drows_TKD, dgates_TK


def combine_slots(back_AD: Tensor, order_A: Tensor, gates_TK: Tensor) -> Tensor:
    """y[t] = sum_k gates[t, k] * back[pos(t, k)], accumulated in fp32 in the fixed order k = 0 .. K-1, rounded
    once to ``back_AD``'s dtype. ``back_AD`` holds the slots' expert outputs in the order ``order_A`` (slot
    order_A[i] = t * K + k is row i); each slot has one row, so unpermuting is a gather without duplicates."""
    T, K = gates_TK.shape
    inv_A = torch.empty_like(order_A)
    inv_A[order_A] = torch.arange(order_A.numel(), device=order_A.device)  # slot -> its row in back_AD
    return _CombineSlots.apply(back_AD[inv_A].view(T, K, -1), gates_TK)


def local_layout(widths_E: Sequence[int], rank_of_expert: Sequence[int], ep_size: int) -> list[list[list[int]]]:
    """Per rank, its experts grouped in width classes: classes[rho][c] = router ids, classes by width.

    The local expert id of an expert is its position in the flattened (class-major) list of its rank.
    """
    out = []
    for ids in experts_of_rank(rank_of_expert, ep_size):
        by_width: dict[int, list[int]] = {}
        for e in ids:
            by_width.setdefault(int(widths_E[e]), []).append(e)
        out.append([by_width[w] for w in sorted(by_width)])
    return out


class Expert(nn.Module):
    """One SwiGLU expert's weights: w1 [2H, D] (gate a, up u), w2 [D, H]."""

    def __init__(self, w1: Tensor, w2: Tensor) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(w1), nn.Parameter(w2)


class ExpertParallelExperts(nn.Module):
    """The routed experts of one MoE layer, spread over the ``ep_size`` ranks of ``group`` by ``rank_of_expert``.

    ``forward(x_TD, idx_TK, gates_TK)`` takes this rank's tokens and their routing (router ids) and returns
    y_t = sum_k gates[t, k] * E_{idx[t, k]}(x_t), the same as the single-process expert layer.
    ``weights[e] = (W1 [2H, D], W2 [D, H])`` needs only the experts of this rank; without it the weights are
    left uninitialised (``torch.empty``: the sizing builds the layer on the meta device).
    ``group`` may be set after construction (the sizing has no process group).
    """

    def __init__(
        self,
        widths_E: Sequence[int],
        rank_of_expert: Sequence[int],
        ep_rank: int,
        d_model: int,
        weights: dict[int, tuple[Tensor, Tensor]] | None = None,
        group=None,
        backend: str = "torch",
    ) -> None:
        super().__init__()
        self.group, self.backend, self.rank = group, backend, ep_rank
        self.W, E = max(rank_of_expert) + 1, len(widths_E)
        layout = local_layout(widths_E, rank_of_expert, self.W)
        local_id = [0] * E
        for classes in layout:
            for i, e in enumerate(e for ids in classes for e in ids):
                local_id[e] = i
        self.classes = layout[ep_rank]  # router ids of this rank, per width class
        self.local_experts = [e for ids in self.classes for e in ids]  # router ids, local id order
        self.local_widths = [int(widths_E[e]) for e in self.local_experts]

        def make(e: int) -> Expert:
            if weights is not None:
                return Expert(*weights[e])
            h = int(widths_E[e])
            return Expert(torch.empty(2 * h, d_model), torch.empty(d_model, h))

        self.local = nn.ModuleDict({str(e): make(e) for e in self.local_experts})
        self.register_buffer("rank_of_expert", torch.tensor(list(rank_of_expert)), persistent=False)
        self.register_buffer("local_id_of_expert", torch.tensor(local_id), persistent=False)
        self.rows_local: Tensor | None = None  # rows received per local expert in the last forward
        self.timer = ComputeTimer()  # measured local expert time, beside the analytic FLOPs of rows_local

    def class_weights(self) -> tuple[list[Tensor], list[Tensor]]:
        """(w1s, w2s): per local width class, its experts' weights stacked ([n_c, 2H_c, D], [n_c, D, H_c])."""
        w1s = [torch.stack([self.local[str(e)].w1 for e in ids]) for ids in self.classes]
        w2s = [torch.stack([self.local[str(e)].w2 for e in ids]) for ids in self.classes]
        return w1s, w2s

    def dispatch(self, x_TD: Tensor, idx_TK: Tensor) -> tuple[Tensor, Tensor, dict]:
        """Send every routed slot's token row to the rank of its expert: (rows [R, D], local ids [R], plan)."""
        T, K = idx_TK.shape
        flat_A = idx_TK.reshape(-1)
        dest_A = self.rank_of_expert[flat_A]
        order_A = torch.argsort(dest_A, stable=True)  # slots grouped by destination rank
        send_W = torch.bincount(dest_A, minlength=self.W)
        recv_W = torch.empty_like(send_W)
        dist.all_to_all_single(recv_W, send_W, group=self.group)
        send, recv = send_W.tolist(), recv_W.tolist()
        # each slot's row of x, in destination order: a gather without duplicate indices of the K copies of
        # every token (the backward sums the copies by a reduction, not by atomics)
        x_AD = x_TD[:, None].expand(T, K, x_TD.shape[1]).reshape(T * K, -1)
        xs_RD = _AllToAll.apply(x_AD[order_A], send, recv, self.group)
        le_R = flat_A.new_empty(sum(recv))
        dist.all_to_all_single(le_R, self.local_id_of_expert[flat_A[order_A]], recv, send, group=self.group)
        return xs_RD, le_R, {"order_A": order_A, "send": send, "recv": recv, "T": T}

    def compute(self, xs_RD: Tensor, le_R: Tensor, weights: tuple[list[Tensor], list[Tensor]] | None = None) -> Tensor:
        """Local experts on the received rows (one slot per row, gate 1); ``weights`` from :meth:`class_weights`."""
        w1s, w2s = weights if weights is not None else self.class_weights()
        ones_R1 = xs_RD.new_ones(xs_RD.shape[0], 1)
        return kernels.expert_swiglu(xs_RD, le_R[:, None], ones_R1, w1s, w2s, self.backend)

    def combine(self, out_RD: Tensor, plan: dict, gates_TK: Tensor) -> Tensor:
        """Return the outputs to the tokens' ranks and sum them per token, weighted by the gates."""
        back_AD = _AllToAll.apply(out_RD, plan["recv"], plan["send"], self.group)
        return combine_slots(back_AD, plan["order_A"], gates_TK)

    def forward(self, x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor) -> Tensor:
        w1s, w2s = self.class_weights()
        device = x_TD.device.type
        if torch.is_autocast_enabled(device):  # autocast does not reach custom ops: cast as it would for a matmul
            dt = torch.get_autocast_dtype(device)
            x_TD, w1s, w2s = x_TD.to(dt), [w.to(dt) for w in w1s], [w.to(dt) for w in w2s]
        elif w1s and x_TD.dtype != w1s[0].dtype:  # FSDP mixed precision: bf16 weights, activations follow them
            x_TD = x_TD.to(w1s[0].dtype)
        xs_RD, le_R, plan = self.dispatch(x_TD, idx_TK)
        self.rows_local = torch.bincount(le_R, minlength=len(self.local_experts)).detach()
        return self.combine(self.timer(self.compute, xs_RD, le_R, (w1s, w2s)), plan, gates_TK)


def from_routed(routed: nn.Module, rank_of_expert: Sequence[int], ep_rank: int, group=None) -> ExpertParallelExperts:
    """This rank's share of a :class:`mohge.model.experts.RoutedExperts` (router ids e = class * per_class + j)."""
    per_class, widths = routed.per_class, routed.widths
    widths_E = [h for h in widths for _ in range(per_class)]
    mine = [e for e, r in enumerate(rank_of_expert) if r == ep_rank]
    weights = {}
    for e in mine:
        c, j = divmod(e, per_class)
        weights[e] = (routed.w1[c][j].detach().clone(), routed.w2[c][j].detach().clone())
    d_model = routed.w1[0].shape[-1]
    return ExpertParallelExperts(widths_E, rank_of_expert, ep_rank, d_model, weights, group, routed.backend)
