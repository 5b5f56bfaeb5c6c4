"""The routers after their GEMMs on a CPU, for the fused path (``train.fused``): kernels of our own.

At the capacity study's sizes (8 groups of 4 experts, 4 groups and 4 experts a token) the router's steps G2-E6
(docs/method.md §2) are a dozen small ops over rows of 4 to 32 entries a token: compiled, their loops run an element
at a time, and forward and backward of one layer's routing took longer than its experts' GEMMs. :func:`grouped_route`
runs them in C (:data:`~mohge.model.native.ROUTE_SOURCE`), 16 tokens at a time in vector lanes, forward and backward:
the group scores (sigmoid, normalised over the selected groups where Kg > 1, or a softmax over them), the selection
bias of either level, the softmax within each group times its group's weight, renormalised, the experts' top-K among
the selected groups and the gates (a softmax of the top-K values or the values renormalised). It is the custom op
``mohge::grouped_route`` with its backward ``mohge::grouped_route_backward``: a graph compiled by torch.compile holds
each as one opaque call, and the aux losses around it stay compiled.

The selection is the fused path's top-k (:mod:`mohge.model.topk`: equal values, the lower index first; NaN below
every number); the arithmetic is the eager router's in other roundings (the kernel's exponential, within 2 ulp of
expf; sums in group order).

The baselines' flat router (moe, hmoe, modse) runs the same way through :func:`flat_route` (``mohge::flat_route``):
the top-K of the logits, the dense softmax the Switch loss reads and the gates, with their backward from the gates'
and the probabilities' gradients.
"""

from __future__ import annotations

import ctypes

import torch

from . import native

Tensor = torch.Tensor

# The kernel's fixed buffers (ROUTE_SOURCE's RGMAX, REMAX, RNMAX, RKMAX): a router beyond them runs eagerly.
MAX_GROUPS, MAX_EXPERTS, MAX_GROUP_SIZE, MAX_K = 64, 256, 64, 8


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("T", "G", "n", "Kg", "K", "ldg", "lde")] + [
        ("softmax_groups", ctypes.c_int32),
        ("renorm_gates", ctypes.c_int32),
    ]


def fits(lg_TG: Tensor, le_TE: Tensor, n: int, kg: int, k: int) -> bool:
    """Whether :func:`grouped_route` takes these logits and sizes: fp32 CPU tensors [T, G] and [T, G n] and a router
    within the kernel's buffers."""
    G = lg_TG.shape[-1]
    return (
        lg_TG.device.type == le_TE.device.type == "cpu"
        and lg_TG.dtype == le_TE.dtype == torch.float32
        and lg_TG.dim() == le_TE.dim() == 2
        and le_TE.shape == (lg_TG.shape[0], G * n)
        and G <= MAX_GROUPS
        and G * n <= MAX_EXPERTS
        and n <= MAX_GROUP_SIZE
        and 1 <= kg <= min(G, MAX_K)
        and 1 <= k <= min(kg * n, MAX_K)
    )


def _shape(lg: Tensor, le: Tensor, n: int, kg: int, k: int, softmax_groups: bool, renorm_gates: bool) -> _Shape:
    T, G = lg.shape
    return _Shape(T, G, n, kg, k, lg.stride(0), le.stride(0), int(softmax_groups), int(renorm_gates))


_P, _ptr, _rows = native._P, native._ptr, native.unit_stride


@torch.library.custom_op("mohge::grouped_route", mutates_args=())
def grouped_route(
    lg: Tensor,
    le: Tensor,
    group_bias: Tensor | None,
    expert_bias: Tensor | None,
    n: int,
    kg: int,
    k: int,
    softmax_groups: bool,
    renorm_gates: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(idx [T, K] int64, gates [T, K], group map [T, G] bool) of MoHGE's router given its group logits ``lg`` [T, G]
    and expert logits ``le`` [T, G n] (fp32, on a CPU; :func:`fits`), with ``n`` experts a group, ``kg`` groups and
    ``k`` experts a token; ``group_bias`` [G] and ``expert_bias`` [E] (or None) move the selections only;
    ``softmax_groups``: a softmax over the selected groups' logits, else their sigmoids; ``renorm_gates``: the top-K
    values renormalised, else their softmax."""
    if not fits(lg, le, n, kg, k):
        raise ValueError(
            f"grouped_route: fp32 CPU logits [T, G] and [T, G*n] within {MAX_GROUPS} groups, {MAX_EXPERTS} experts, "
            f"{MAX_GROUP_SIZE} a group and k <= {MAX_K}; got {tuple(lg.shape)}, {tuple(le.shape)}, n={n}, kg={kg}, "
            f"k={k}"
        )
    lg, le = _rows(lg), _rows(le)
    T, G = lg.shape
    idx = torch.empty(T, k, dtype=torch.int64)
    gates = torch.empty(T, k, dtype=torch.float32)
    gmap = torch.empty(T, G, dtype=torch.bool)
    biases = [None if b is None else b.detach().float().contiguous() for b in (group_bias, expert_bias)]
    if T:
        native.kernel("mohge_grouped_route_f32", _P, _P, _P, _P, _P, _P, _P, _P)(
            ctypes.addressof(shape := _shape(lg, le, n, kg, k, softmax_groups, renorm_gates)),
            lg.data_ptr(), le.data_ptr(), _ptr(biases[0]), _ptr(biases[1]), idx.data_ptr(), gates.data_ptr(),
            gmap.data_ptr(),
        )  # fmt: skip
        del shape
    return idx, gates, gmap


@grouped_route.register_fake
def _(lg, le, group_bias, expert_bias, n, kg, k, softmax_groups, renorm_gates):
    T, G = lg.shape
    return lg.new_empty(T, k, dtype=torch.int64), lg.new_empty(T, k), lg.new_empty(T, G, dtype=torch.bool)


@torch.library.custom_op("mohge::grouped_route_backward", mutates_args=())
def grouped_route_backward(
    lg: Tensor,
    le: Tensor,
    idx: Tensor,
    gates: Tensor,
    gmap: Tensor,
    dgates: Tensor,
    n: int,
    kg: int,
    softmax_groups: bool,
    renorm_gates: bool,
) -> tuple[Tensor, Tensor]:
    """The gradients (d lg [T, G], d le [T, G n]) of :func:`grouped_route`'s gates given ``dgates``, from its inputs
    and outputs (idx, gates, gmap); 0 on the groups and experts a token did not select."""
    lg, le = _rows(lg), _rows(le)
    T, G = lg.shape
    dlg, dle = torch.empty(T, G), torch.empty(T, le.shape[1])
    if T:
        idx, gates, gmap, dgates = (t.contiguous() for t in (idx, gates, gmap, dgates.float()))
        native.kernel("mohge_grouped_route_backward_f32", _P, _P, _P, _P, _P, _P, _P, _P, _P)(
            ctypes.addressof(shape := _shape(lg, le, n, kg, idx.shape[1], softmax_groups, renorm_gates)),
            lg.data_ptr(), le.data_ptr(), idx.data_ptr(), gates.data_ptr(), gmap.data_ptr(), dgates.data_ptr(),
            dlg.data_ptr(), dle.data_ptr(),
        )  # fmt: skip
        del shape
    return dlg, dle


@grouped_route_backward.register_fake
def _(lg, le, idx, gates, gmap, dgates, n, kg, softmax_groups, renorm_gates):
    return torch.empty_like(lg, memory_format=torch.contiguous_format), torch.empty_like(
        le, memory_format=torch.contiguous_format
    )


def _setup(ctx, inputs, output) -> None:
    lg, le, _gb, _eb, n, kg, _k, softmax_groups, renorm_gates = inputs
    idx, gates, gmap = output
    ctx.save_for_backward(lg, le, idx, gates, gmap)
    ctx.args = (n, kg, softmax_groups, renorm_gates)


def _backward(ctx, _didx, dgates, _dgmap):
    lg, le, idx, gates, gmap = ctx.saved_tensors
    if dgates is None:
        return None, None, None, None, None, None, None, None, None
    dlg, dle = grouped_route_backward(lg, le, idx, gates, gmap, dgates, *ctx.args)
    return dlg, dle, None, None, None, None, None, None, None


grouped_route.register_autograd(_backward, setup_context=_setup)


def fits_flat(logits_TE: Tensor, k: int) -> bool:
    """Whether :func:`flat_route` takes these logits: an fp32 CPU tensor [T, E] within the kernel's buffers."""
    return (
        logits_TE.device.type == "cpu"
        and logits_TE.dtype == torch.float32
        and logits_TE.dim() == 2
        and logits_TE.shape[1] <= MAX_EXPERTS
        and 1 <= k <= min(logits_TE.shape[1], MAX_K)
    )


@torch.library.custom_op("mohge::flat_route", mutates_args=())
def flat_route(logits: Tensor, k: int, probs_gate: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(idx [T, K] int64, gates [T, K], probs [T, E]) of the flat top-k router given its logits [T, E] (fp32, on a
    CPU; :func:`fits_flat`): the top ``k`` logits, the dense softmax of the logits, and the gates, a softmax of the
    top-k logits or (``probs_gate``) of their probabilities."""
    if not fits_flat(logits, k):
        raise ValueError(
            f"flat_route: fp32 CPU logits [T, E], E <= {MAX_EXPERTS}, 1 <= k <= min(E, {MAX_K}); got "
            f"{tuple(logits.shape)} {logits.dtype} and k={k}"
        )
    logits = _rows(logits)
    T, E = logits.shape
    idx, gates, probs = torch.empty(T, k, dtype=torch.int64), torch.empty(T, k), torch.empty(T, E)
    if T:
        I = ctypes.c_int64  # noqa: N806
        native.kernel("mohge_flat_route_f32", _P, I, I, I, I, ctypes.c_int32, _P, _P, _P)(
            logits.data_ptr(), T, E, logits.stride(0), k, int(probs_gate), idx.data_ptr(), gates.data_ptr(),
            probs.data_ptr(),
        )  # fmt: skip
    return idx, gates, probs


@flat_route.register_fake
def _(logits, k, probs_gate):
    T, E = logits.shape
    return logits.new_empty(T, k, dtype=torch.int64), logits.new_empty(T, k), logits.new_empty(T, E)


@torch.library.custom_op("mohge::flat_route_backward", mutates_args=())
def flat_route_backward(
    idx: Tensor, gates: Tensor, probs: Tensor, dgates: Tensor | None, dprobs: Tensor | None, probs_gate: bool
) -> Tensor:
    """The gradient d logits [T, E] of :func:`flat_route` given its gates' and probabilities' gradients (either may be
    None: 0), from its outputs."""
    T, E = probs.shape
    dlogits = torch.empty(T, E)
    if T:
        I = ctypes.c_int64  # noqa: N806
        dgates = torch.zeros_like(gates) if dgates is None else dgates.float().contiguous()
        dprobs = None if dprobs is None else dprobs.float().contiguous()
        native.kernel("mohge_flat_route_backward_f32", I, I, I, ctypes.c_int32, _P, _P, _P, _P, _P, _P)(
            T, E, idx.shape[1], int(probs_gate), idx.contiguous().data_ptr(), gates.contiguous().data_ptr(),
            probs.contiguous().data_ptr(), dgates.data_ptr(), _ptr(dprobs), dlogits.data_ptr(),
        )  # fmt: skip
    return dlogits


@flat_route_backward.register_fake
def _(idx, gates, probs, dgates, dprobs, probs_gate):
    return torch.empty_like(probs, memory_format=torch.contiguous_format)


def _setup_flat(ctx, inputs, output) -> None:
    idx, gates, probs = output
    ctx.save_for_backward(idx, gates, probs)
    ctx.probs_gate = inputs[2]


def _backward_flat(ctx, _didx, dgates, dprobs):
    idx, gates, probs = ctx.saved_tensors
    if dgates is None and dprobs is None:
        return None, None, None
    return flat_route_backward(idx, gates, probs, dgates, dprobs, ctx.probs_gate), None, None


flat_route.register_autograd(_backward_flat, setup_context=_setup_flat)
