"""Causal attention over short windows on a CPU, for the fused path (``train.fused``): a kernel of our own.

At the capacity study's sizes a window is 5 tokens and a head 8 or 16 channels wide: each (window, head) problem is a
few dozen products, and a compiled graph's loops over them run an element or a few at a time. :func:`short_attention`
runs the problems in the lanes of the CPU's vectors (:data:`~mohge.model.native.ATTENTION_SOURCE`), forward and
backward (the probabilities recomputed there), as the custom op ``mohge::short_attention`` with its backward
``mohge::short_attention_backward``: the compiled attention half (:func:`mohge.model.transformer._attention_half`)
holds each as one call. It computes ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` in other roundings
(the kernel's exponential, within 2 ulp of expf; sums in key order).
"""

from __future__ import annotations

import ctypes

import torch

from . import native

Tensor = torch.Tensor

MAX_WINDOW, MAX_HEAD_DIM = 16, 32  # the kernel's buffers (ATTENTION_SOURCE's AMAX_S, AMAX_D)

# Where the fused path takes the kernel: 8-lane builds (AVX2) and heads of at most 8 channels. Measured on an AMD EPYC
# with AVX2 only, one thread, forward and backward at B*H 8,192 and S 5 against the compiled broadcast products: 4.6
# ms against 6-7 ms at Dh 8, 9.1 ms against 9.6 ms at Dh 16 with a whole training step no faster there; 16-lane builds
# (AVX-512) move rows in and out element by element and were not measured.
FASTER_HEAD_DIM, FASTER_LANES = 8, 8


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("B", "H", "S", "D")] + [
        (name, ctypes.c_int64 * 3) for name in ("q", "k", "v")
    ]


def fits(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether :func:`short_attention` takes these: fp32 CPU tensors [B, H, S, Dh] of one shape within the kernel's
    window and head width."""
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 4 for t in (q, k, v))
        and q.shape == k.shape == v.shape
        and q.shape[2] <= MAX_WINDOW
        and q.shape[3] <= MAX_HEAD_DIM
    )


def preferred(x: Tensor, head_dim: int) -> bool:
    """Whether the fused path computes the attention of the activations ``x`` (fp32 on a CPU), heads of ``head_dim``
    channels, with the kernel: on the host kind and head widths where it was measured faster
    (:data:`FASTER_HEAD_DIM`, :data:`FASTER_LANES`). Asked outside the compiled graph (it may build the kernels)."""
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32
    return cpu32 and head_dim <= FASTER_HEAD_DIM and native.lanes() == FASTER_LANES


def _shape(q: Tensor, k: Tensor, v: Tensor) -> _Shape:
    B, H, S, D = q.shape
    return _Shape(B, H, S, D, *((ctypes.c_int64 * 3)(*t.stride()[:3]) for t in (q, k, v)))


_P, _channels = native._P, native.unit_stride  # the kernel reads each head's row as one run


@torch.library.custom_op("mohge::short_attention", mutates_args=())
def short_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax attention (scale 1/sqrt(Dh)) of q, k, v [B, H, S, Dh] (fp32, on a CPU; :func:`fits`), returned
    as [B, S, H, Dh] (contiguous: the rows the output projection reads)."""
    if not fits(q, k, v):
        raise ValueError(
            f"short_attention: fp32 CPU q, k, v [B, H, S, Dh] of one shape, S <= {MAX_WINDOW}, Dh <= {MAX_HEAD_DIM}; "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    q, k, v = _channels(q), _channels(k), _channels(v)
    B, H, S, D = q.shape
    y = torch.empty(B, S, H, D)
    if y.numel():
        shape = _shape(q, k, v)
        native.kernel("mohge_short_attention_f32", _P, _P, _P, _P, _P)(
            ctypes.addressof(shape), q.data_ptr(), k.data_ptr(), v.data_ptr(), y.data_ptr()
        )
    return y


@short_attention.register_fake
def _(q, k, v):
    B, H, S, D = q.shape
    return q.new_empty(B, S, H, D)


@torch.library.custom_op("mohge::short_attention_backward", mutates_args=())
def short_attention_backward(q: Tensor, k: Tensor, v: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients (dq, dk, dv) [B, H, S, Dh] of :func:`short_attention` given ``dy`` [B, S, H, Dh]."""
    q, k, v = _channels(q), _channels(k), _channels(v)
    dy = dy.float().contiguous()
    dq, dk, dv = (torch.empty(q.shape) for _ in range(3))
    if q.numel():
        shape = _shape(q, k, v)
        native.kernel("mohge_short_attention_backward_f32", _P, _P, _P, _P, _P, _P, _P, _P)(
            ctypes.addressof(shape), q.data_ptr(), k.data_ptr(), v.data_ptr(), dy.data_ptr(), dq.data_ptr(),
            dk.data_ptr(), dv.data_ptr(),
        )  # fmt: skip
    return dq, dk, dv


@short_attention_backward.register_fake
def _(q, k, v, dy):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    return short_attention_backward(*ctx.saved_tensors, dy)


short_attention.register_autograd(_backward, setup_context=_setup)
