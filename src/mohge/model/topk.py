"""The routers' top-k over short rows on a CPU, for the fused path (``train.fused``): a kernel of our own.

A router picks the top k of a few entries per token (4 of 8 groups and 4 of 32 experts at the capacity study's
sizes). ATen's top-k sorts each row partially, about 300 ns a row on one thread: a fifth of a d_model 32 step's
forward. :func:`top_k` on the fused path runs a C kernel instead, which keeps the best k of as many rows at a time
as the CPU's widest vector holds floats (8 with AVX2, 16 with AVX-512), one a lane, without a branch per element
(its time against ATen's: ``mohge bench topk``, docs/speed.md). The routers' own kernels
(:mod:`mohge.model.route_kernel`) take its place where a router fits them.

It is built on first use with the fused path's other kernels (:mod:`mohge.model.native`, its source
:data:`~mohge.model.native.TOPK_SOURCE`) and called through ctypes as the custom op ``mohge::topk_indices``: a graph
compiled by torch.compile holds it as one opaque call. The indices are ATen's wherever a row has no two equal values
among its top k + 1; equal values rank the lower index first (ATen's order among them is unspecified), NaN below every
number.
"""

from __future__ import annotations

import ctypes

import torch

from . import native

Tensor = torch.Tensor

MAX_K = 8  # the kernel's register budget: k of 1 to 8 (a router's k; more falls back to ATen)


@torch.library.custom_op("mohge::topk_indices", mutates_args=())
def topk_indices(v: Tensor, k: int) -> Tensor:
    """The indices [rows, k] of the k largest entries of each row of the 2-D CPU tensor ``v``, largest first."""
    rows, n = v.shape
    if v.device.type != "cpu" or not 1 <= k <= min(MAX_K, n):
        raise ValueError(f"topk_indices: a CPU tensor [rows, n] and 1 <= k <= min({MAX_K}, n), got {v.shape} and {k}")
    v = v.float()
    if v.stride(1) != 1:
        v = v.contiguous()
    out = torch.empty(rows, k, dtype=torch.int64)
    if rows:
        I = ctypes.c_int64  # noqa: N806
        native.kernel("mohge_topk_rows_f32", ctypes.c_void_p, I, I, I, I, ctypes.c_void_p)(
            v.data_ptr(), rows, n, v.stride(0), k, out.data_ptr()
        )
    return out


@topk_indices.register_fake
def _(v: Tensor, k: int) -> Tensor:
    return v.new_empty(v.shape[0], k, dtype=torch.int64)


def top_k(v_TE: Tensor, k: int, native: bool) -> tuple[Tensor, Tensor]:
    """``torch.topk(v, k, dim=-1)`` as (values, indices): where ``native`` (the fused path) and ``v`` is a 2-D CPU
    tensor with k <= :data:`MAX_K`, the indices from the kernel and the values gathered at them (their gradient is
    top-k's); ATen's top-k anywhere else."""
    if not native or v_TE.device.type != "cpu" or v_TE.dim() != 2 or not 1 <= k <= min(MAX_K, v_TE.shape[1]):
        values, indices = torch.topk(v_TE, k, dim=-1)
        return values, indices
    idx_TK = topk_indices(v_TE.detach(), k)
    return v_TE.gather(1, idx_TK), idx_TK
