"""The Triton expert path without a host sync, so that a CUDA graph can capture a forward and backward.

:func:`mohge.kernels.swiglu.swiglu_grouped_triton` reads the per-expert token counts on the host (one device-to-host
copy a forward) and builds each launch's problem table and tile list there (:mod:`.schedule`); a CUDA graph cannot
capture that, and at small T the GPU then waits on the host (docs/speed.md). Here the same kernels run from
tables built on the device:

* the counts are a device tensor (a scatter-add of the routed slots, not ``bincount``, which reads its maximum on
  the host), the sort is the torch path's stable ``argsort``;
* each problem table is its static columns (leading dims, widths, weight addresses), written once when the plan is
  made, with the columns that depend on the counts (first row, ragged offset, rows) filled on the device;
* each row GEMM is launched on a fixed grid of :func:`~.schedule.tile_bound` programs; the tile list is built on
  the device (:func:`~.schedule.device_tiles`), the real tiles first, and a surplus program returns at once;
* the ragged buffers (activation, pre-activation) are allocated at their bound, T K rows of the widest expert, and
  the first sum_e C_e H_e elements used; the weight gradients are one flat buffer whose experts' addresses are its
  base plus offsets fixed by the plan.

Every launch, every buffer and every tile is then of a shape fixed by (T, K) and the weights, and every value the
kernels read is on the device: :class:`CapturablePlan` is made once for the weights (outside any capture), and
``plan(x, idx, gates)`` may then be captured (``torch.cuda.graph``) and replayed with new tokens and routings
copied into the captured inputs. Per tile, the kernels compute exactly what the host-scheduled path computes.

Legend: T tokens, D model width, K experts per token, E experts, A = T K routed rows, C tokens of one expert,
H its width.
"""

from __future__ import annotations

import numpy as np
import torch

from .grouped import INTERPRET, ROW_FIELDS, WGRAD_FIELDS, launch_options
from .grouped_mm import _grouped_mm_kernel
from .permute import combine_rows, gate_grad, gather_rows
from .reference import check_contract
from .schedule import class_widths, device_tiles, expert_addresses, gemm_blocks, tile_bound, tile_list
from .up_swiglu import _up_swiglu_kernel
from .wgrad import _wgrad_kernel

Tensor = torch.Tensor

__all__ = ["CapturablePlan", "cuda_graphed", "device_route"]


def device_route(idx_TK: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(order_A, tok_A, inv_TK, counts_E) as :func:`mohge.kernels.swiglu.route` gives them, the counts a device
    tensor: nothing is read on the host."""
    T, K = idx_TK.shape
    flat_A = idx_TK.reshape(-1).to(torch.int64)
    order_A = torch.argsort(flat_A, stable=True)
    tok_A = torch.div(order_A, K, rounding_mode="floor")
    inv_A = torch.empty_like(order_A).scatter_(0, order_A, torch.arange(order_A.numel(), device=order_A.device))
    counts_E = torch.zeros(num_experts, dtype=torch.int64, device=idx_TK.device).scatter_add_(
        0, flat_A, torch.ones_like(flat_A)
    )
    return order_A, tok_A, inv_A.view(T, K), counts_E


class _RowGemm:
    """One row-GEMM launch of the plan: its static table columns and fixed grid; ``__call__`` fills the columns of
    this call's counts and launches."""

    def __init__(self, kernel, static: dict, dynamic: tuple[str, ...], n_E: np.ndarray, A: int, dtype, hint, dev,
                 **constexprs):  # fmt: skip
        self.kernel, self.dynamic, self.hint, self.constexprs = kernel, dynamic, hint, constexprs
        self.blocks = gemm_blocks(dtype, INTERPRET)
        b = self.blocks
        self.bound = tile_bound(n_E, A, b.bm, b.bn)
        E = n_E.size
        desc = np.zeros((E, len(ROW_FIELDS)), dtype=np.int64)
        for i, name in enumerate(ROW_FIELDS):
            if name not in dynamic:
                desc[:, i] = static[name]
        self.static = list(torch.from_numpy(desc).to(dev).unbind(1))  # one device column per field
        self.nn_E = torch.from_numpy(-(-n_E // b.bn)).to(dev)
        self.options = launch_options(dtype)

    def tiles(self, rows_E: Tensor) -> Tensor:
        """This launch's tile list for ``rows_E`` rows per expert, [bound, 3] on the device."""
        return device_tiles(rows_E, self.nn_E, self.blocks.bm, self.blocks.bn, self.bound)

    def __call__(self, args, values: list[Tensor], tiles: Tensor) -> None:
        given = dict(zip(self.dynamic, values, strict=True))
        desc = torch.stack([given.get(name, col) for name, col in zip(ROW_FIELDS, self.static, strict=True)], 1)
        b = self.blocks
        self.kernel[(self.bound,)](
            *args, desc, tiles, HINT=self.hint, BM=b.bm, BN=b.bn, BK=b.bk,
            num_warps=b.num_warps, num_stages=b.num_stages, **self.options, **self.constexprs,
        )  # fmt: skip


class _WeightGrad:
    """One weight-gradient launch of the plan: a static tile list (the weight shapes fix it) and table, the output
    one flat buffer whose experts' addresses are its base plus the plan's offsets."""

    def __init__(self, ws, halve: bool, D: int, dtype, hint, dev) -> None:
        H = class_widths(ws, halve)
        self.shapes = [tuple(w.shape) for w in ws]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.total = int(sum(self.sizes))
        member_off = np.concatenate(
            [s + np.arange(w.shape[0], dtype=np.int64) * w.stride(0) for s, w in zip(starts, ws, strict=True)]
        )
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.byte_off = torch.from_numpy(member_off * itemsize).to(dev)
        b = gemm_blocks(dtype, INTERPRET)
        self.blocks = b
        # grad_w1: dW1_e [2H, D] = dh_e^T xs_e; grad_w2: dW2_e [D, H] = dout_e^T act_e
        ncol, mcol = (2 * H, np.full_like(H, D)) if halve else (np.full_like(H, D), H)
        self.tiles = torch.from_numpy(tile_list(ncol, mcol, b.bm, b.bn)).to(dev)
        fixed = {"ncol": ncol, "mcol": mcol, "ldg": 2 * H if halve else D, "ldx": D if halve else H}
        self.hint, self.options = hint, launch_options(dtype)
        desc = np.zeros((H.size, len(WGRAD_FIELDS)), dtype=np.int64)
        for i, name in enumerate(WGRAD_FIELDS):
            if name in fixed:
                desc[:, i] = fixed[name]
        self.columns = list(torch.from_numpy(desc).to(dev).unbind(1))

    def __call__(self, g: Tensor, x: Tensor, g_off: Tensor, x_off: Tensor, rows_E: Tensor) -> list[Tensor]:
        flat = g.new_empty(self.total)
        given = {"g_off": g_off, "x_off": x_off, "rows": rows_E, "out_addr": self.byte_off + flat.data_ptr()}
        desc = torch.stack([given.get(name, col) for name, col in zip(WGRAD_FIELDS, self.columns, strict=True)], 1)
        b = self.blocks
        if self.tiles.shape[0]:
            _wgrad_kernel[(self.tiles.shape[0],)](
                g, x, desc, self.tiles, HINT=self.hint, BM=b.bm, BN=b.bn, BK=b.bk,
                num_warps=b.num_warps, num_stages=b.num_stages, **self.options,
            )  # fmt: skip
        return [t.view(s) for t, s in zip(flat.split(self.sizes), self.shapes, strict=True)]


class CapturablePlan:
    """The capturable Triton expert layer for fixed weights and a fixed (T, K): ``plan(x, idx, gates)`` computes
    :func:`~mohge.kernels.swiglu.swiglu_grouped_triton`'s output, differentiable in x, gates and the weights, with
    no host sync and every shape fixed (module docstring). Make it outside any capture; the weights must stay where
    they are (an optimizer's in-place update keeps them there), which each call checks."""

    def __init__(self, w1s: list[Tensor], w2s: list[Tensor], T: int, K: int) -> None:
        if not w1s or len(w1s) != len(w2s):
            raise ValueError(f"need one (w1, w2) pair per width class, got {len(w1s)} and {len(w2s)}")
        if any(not w.is_contiguous() for w in (*w1s, *w2s)):
            raise ValueError("the plan addresses the weights in place: give contiguous weights")
        self.w1s, self.w2s, self.T, self.K = list(w1s), list(w2s), T, K
        self.ptrs = [w.data_ptr() for w in (*w1s, *w2s)]
        dev, dtype = w1s[0].device, w1s[0].dtype
        D = w1s[0].shape[2]
        H = class_widths(w1s, True)
        self.E, self.D, A = H.size, D, T * K
        self.rag_bound = A * int(H.max())
        self.H_E = torch.from_numpy(H).to(dev)
        a1, al1 = expert_addresses(w1s)
        a2, al2 = expert_addresses(w2s)
        hint = bool(D % 8 == 0 and np.all(H % 8 == 0) and al1 and al2)
        self.hint = hint
        D_E = np.full_like(H, D)
        row = dict(dtype=dtype, hint=hint, dev=dev)
        # the tables of swiglu.py's ops (up_swiglu.py, grouped_mm.py), static columns from the weights
        self.up = _RowGemm(_up_swiglu_kernel, dict(lda=D, kdim=D, b_addr=a1, ldb=D, ncol=H, ldc=H),
                           ("a_off", "c_off", "rows"), H, A, **row)  # fmt: skip
        self.down = _RowGemm(_grouped_mm_kernel, dict(lda=H, kdim=H, b_addr=a2, ldb=H, ncol=D, ldc=D),
                             ("a_off", "c_off", "rows"), D_E, A, B_NK=True, SWIGLU_BWD=False, **row)  # fmt: skip
        self.down_bwd = _RowGemm(_grouped_mm_kernel, dict(lda=D, kdim=D, b_addr=a2, ldb=H, ncol=H, ldc=2 * H),
                                 ("a_off", "c_off", "rows"), H, A, B_NK=False, SWIGLU_BWD=True, **row)  # fmt: skip
        self.up_bwd_x = _RowGemm(_grouped_mm_kernel, dict(lda=2 * H, kdim=2 * H, b_addr=a1, ldb=D, ncol=D, ldc=D),
                                 ("a_off", "c_off", "rows"), D_E, A, B_NK=False, SWIGLU_BWD=False, **row)  # fmt: skip
        self.grad_w1 = _WeightGrad(w1s, True, D, dtype, hint, dev)
        self.grad_w2 = _WeightGrad(w2s, False, D, dtype, hint, dev)

    def layout(self, counts_E: Tensor) -> tuple[Tensor, Tensor]:
        """(row0_E, rag_E): each expert's first sorted row and ragged offset, on the device."""
        size_E = counts_E * self.H_E
        return torch.cumsum(counts_E, 0) - counts_E, torch.cumsum(size_E, 0) - size_E

    def __call__(self, x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor) -> Tensor:
        E = check_contract(x_TD, idx_TK, gates_TK, self.w1s, self.w2s)
        if tuple(idx_TK.shape) != (self.T, self.K):
            raise ValueError(f"idx of shape {tuple(idx_TK.shape)}: this plan is for [T={self.T}, K={self.K}]")
        if [w.data_ptr() for w in (*self.w1s, *self.w2s)] != self.ptrs or E != self.E:
            raise ValueError("the weights moved since the plan was made: make a new plan")
        return _CapturableSwiGLU.apply(x_TD, idx_TK, gates_TK, self, *self.w1s, *self.w2s)


class _CapturableSwiGLU(torch.autograd.Function):
    """swiglu.py's forward and backward, launched from device-built tables on fixed grids."""

    @staticmethod
    def forward(ctx, x_TD, idx_TK, gates_TK, plan: CapturablePlan, *weights):
        D = plan.D
        x_TD, gates_TK = x_TD.contiguous(), gates_TK.contiguous()
        order_A, tok_A, inv_TK, C_E = device_route(idx_TK, plan.E)
        row0_E, rag_E = plan.layout(C_E)
        xs_AD = gather_rows(x_TD, tok_A)
        act_R = xs_AD.new_empty(plan.rag_bound)
        h_R = xs_AD.new_empty(2 * plan.rag_bound)
        # the tiles of the launches whose outputs are H wide (up, down_bwd) and D wide (down, up_bwd_x)
        tiles_H, tiles_D = plan.up.tiles(C_E), plan.down.tiles(C_E)
        plan.up((xs_AD, act_R, h_R), [row0_E * D, rag_E, C_E], tiles_H)
        out_AD = xs_AD.new_empty(xs_AD.shape)
        plan.down((act_R, out_AD, out_AD), [rag_E, row0_E * D, C_E], tiles_D)
        y_TD = combine_rows(out_AD, inv_TK, gates_TK)
        ctx.plan = plan
        saved = (xs_AD, act_R, h_R, out_AD, order_A, inv_TK, gates_TK, C_E, row0_E, rag_E, tiles_H, tiles_D)
        ctx.save_for_backward(*saved)
        return y_TD

    @staticmethod
    def backward(ctx, dy_TD):
        xs_AD, act_R, h_R, out_AD, order_A, inv_TK, gates_TK, C_E, row0_E, rag_E, tiles_H, tiles_D = ctx.saved_tensors
        plan, D, nc = ctx.plan, ctx.plan.D, len(ctx.plan.w1s)
        dgates_TK, dout_AD = gate_grad(dy_TD.contiguous(), out_AD, order_A, gates_TK)
        dh_R = torch.empty_like(h_R)
        plan.down_bwd((dout_AD, dh_R, h_R), [row0_E * D, 2 * rag_E, C_E], tiles_H)
        dxs_AD = torch.empty_like(xs_AD)
        plan.up_bwd_x((dh_R, dxs_AD, dxs_AD), [2 * rag_E, row0_E * D, C_E], tiles_D)
        dx_TD = combine_rows(dxs_AD, inv_TK, None)
        dw1s = plan.grad_w1(dh_R, xs_AD, 2 * rag_E, row0_E * D, C_E)
        dw2s = plan.grad_w2(dout_AD, act_R, row0_E * D, rag_E, C_E)
        ctx.plan = None
        needs = ctx.needs_input_grad
        return (
            dx_TD if needs[0] else None,
            None,
            dgates_TK if needs[2] else None,
            None,
            *[g if n else None for g, n in zip([*dw1s, *dw2s], needs[4 : 4 + 2 * nc], strict=True)],
        )


def cuda_graphed(fn):
    """A thunk that replays ``fn()`` from one CUDA graph: captured at its first call (after three warm-up calls on a
    side stream, as ``torch.cuda.graph`` asks), then every call replays it and returns the captured outputs, which
    the replay overwrites. ``fn``'s inputs are the tensors it closes over: copy new values into them between calls."""
    state: dict = {}

    def run():
        if "graph" not in state:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state["out"] = fn()
            state["graph"] = graph
        state["graph"].replay()
        return state["out"]

    return run
