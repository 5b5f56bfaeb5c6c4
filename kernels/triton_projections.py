"""The six expert projections of the grouped SwiGLU, as launchers and ``mohge::`` custom ops.

Each op plans its tiles on the host (:mod:`mohge.kernels.triton_schedule`) from the per-expert token counts
``counts`` (a Python list, known on the host after the routing sort) and launches one grouped kernel
of :mod:`mohge.kernels.triton_gemm` over every expert of every width class at once.

    forward   up_swiglu      xs [A, D], W1 -> act (ragged [C, H]), h = [a | u] (ragged [C, 2H])
              down_proj      act, W2       -> out [A, D]
    backward  down_proj_bwd  dout [A, D], h, W2 -> dh = [da | du] (ragged [C, 2H])
              up_proj_bwd_x  dh, W1        -> dxs [A, D]
              grad_w1        dh, xs        -> dW1 per class [n_c, 2H_c, D]
              grad_w2        dout, act     -> dW2 per class [n_c, D, H_c]

Legend: A routed rows (sorted by expert), D model width, C tokens of one expert, H its width.
"""

from __future__ import annotations

import numpy as np
import torch

from .triton_gemm import (
    INTERPRET,
    ROW_FIELDS,
    WGRAD_FIELDS,
    _grouped_mm_kernel,
    _up_swiglu_kernel,
    _wgrad_kernel,
    launch_options,
)
from .triton_schedule import (
    ExpertLayout,
    class_widths,
    expert_addresses,
    expert_layout,
    gemm_blocks,
    tile_list,
    to_device,
)

Tensor = torch.Tensor


def _layout(name: str, rows: Tensor, ws, counts: list[int], halve: bool, d_model: int) -> ExpertLayout:
    """Check a row buffer against the weights and counts; return the experts' layout."""
    lay = expert_layout(counts, class_widths(ws, halve), d_model)
    for w in ws:
        if w.dtype != rows.dtype or w.device != rows.device:
            raise ValueError(f"{name}: weight {w.dtype} on {w.device} != input {rows.dtype} on {rows.device}")
    if rows.dim() == 2 and tuple(rows.shape) != (lay.num_rows, d_model):
        raise ValueError(f"{name}: rows {tuple(rows.shape)} != [sum(counts)={lay.num_rows}, D={d_model}]")
    return lay


def _check_ragged(name: str, t: Tensor, numel: int) -> Tensor:
    if t.dim() != 1 or t.numel() != numel:
        raise ValueError(f"{name}: ragged buffer of shape {tuple(t.shape)}, expected [{numel}]")
    return t.contiguous()


def _table(fields: tuple[str, ...], **cols) -> np.ndarray:
    """Per-expert problem table int64 [E, F], columns in kernel order (scalars broadcast over experts)."""
    assert set(cols) == set(fields), (sorted(cols), fields)
    E = next(c.size for c in cols.values() if isinstance(c, np.ndarray))
    table = np.empty((E, len(fields)), dtype=np.int64)
    for i, name in enumerate(fields):
        table[:, i] = cols[name]
    return table


def _launch(kernel, args, desc, m_E, n_E, dtype, hint: bool, **constexprs) -> None:
    b = gemm_blocks(dtype, INTERPRET)
    tiles = tile_list(m_E, n_E, b.bm, b.bn)
    if tiles.shape[0] == 0:
        return
    desc_t, tiles_t = to_device(desc, tiles, args[0].device)
    kernel[(tiles.shape[0],)](
        *args, desc_t, tiles_t, HINT=hint, BM=b.bm, BN=b.bn, BK=b.bk,
        num_warps=b.num_warps, num_stages=b.num_stages, **launch_options(dtype), **constexprs,
    )  # fmt: skip


def up_swiglu(xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> tuple[Tensor, Tensor]:
    """act = SiLU(a) * u, h = [a | u] with [a; u] = W1_e x per sorted row (ragged outputs)."""
    D = xs_AD.shape[-1]
    w1s = [w.contiguous() for w in w1s]
    lay = _layout("up_swiglu", xs_AD, w1s, counts, True, D)
    xs_AD = xs_AD.contiguous()
    addr, aligned = expert_addresses(w1s)
    act_R = xs_AD.new_empty(lay.rag_total)
    h_R = xs_AD.new_empty(2 * lay.rag_total)
    C, H = lay.count, lay.width
    desc = _table(
        ROW_FIELDS, a_off=lay.row0 * D, lda=D, kdim=D, b_addr=addr, ldb=D, ncol=H, c_off=lay.rag, ldc=H, rows=C
    )
    _launch(_up_swiglu_kernel, (xs_AD, act_R, h_R), desc, C, H, xs_AD.dtype, lay.aligned and aligned)
    return act_R, h_R


def down_proj(act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """out_e = act_e W2_e^T per expert: ragged [C, H] -> [A, D]."""
    w2s = [w.contiguous() for w in w2s]
    D = w2s[0].shape[1]
    lay = _layout("down_proj", act_R, w2s, counts, False, D)
    act_R = _check_ragged("down_proj", act_R, lay.rag_total)
    addr, aligned = expert_addresses(w2s)
    out_AD = act_R.new_empty(lay.num_rows, D)
    C, H = lay.count, lay.width
    desc = _table(
        ROW_FIELDS, a_off=lay.rag, lda=H, kdim=H, b_addr=addr, ldb=H, ncol=D, c_off=lay.row0 * D, ldc=D, rows=C
    )
    hint = lay.aligned and aligned
    _launch(_grouped_mm_kernel, (act_R, out_AD, out_AD), desc, C, np.full_like(C, D), act_R.dtype, hint,
            B_NK=True, SWIGLU_BWD=False)  # fmt: skip
    return out_AD


def down_proj_bwd(dout_AD: Tensor, h_R: Tensor, w2s: list[Tensor], counts: list[int]) -> Tensor:
    """dh = [da | du] from dact = dout_e W2_e and the saved pre-activation h (SwiGLU backward fused)."""
    w2s = [w.contiguous() for w in w2s]
    D = w2s[0].shape[1]
    lay = _layout("down_proj_bwd", dout_AD, w2s, counts, False, D)
    h_R = _check_ragged("down_proj_bwd", h_R, 2 * lay.rag_total)
    dout_AD = dout_AD.contiguous()
    addr, aligned = expert_addresses(w2s)
    dh_R = torch.empty_like(h_R)
    C, H = lay.count, lay.width
    desc = _table(
        ROW_FIELDS, a_off=lay.row0 * D, lda=D, kdim=D, b_addr=addr, ldb=H, ncol=H, c_off=2 * lay.rag, ldc=2 * H, rows=C
    )
    _launch(_grouped_mm_kernel, (dout_AD, dh_R, h_R), desc, C, H, dout_AD.dtype, lay.aligned and aligned,
            B_NK=False, SWIGLU_BWD=True)  # fmt: skip
    return dh_R


def up_proj_bwd_x(dh_R: Tensor, w1s: list[Tensor], counts: list[int]) -> Tensor:
    """dxs_e = dh_e W1_e per expert: ragged [C, 2H] -> [A, D]."""
    w1s = [w.contiguous() for w in w1s]
    D = w1s[0].shape[2]
    lay = _layout("up_proj_bwd_x", dh_R, w1s, counts, True, D)
    dh_R = _check_ragged("up_proj_bwd_x", dh_R, 2 * lay.rag_total)
    addr, aligned = expert_addresses(w1s)
    dxs_AD = dh_R.new_empty(lay.num_rows, D)
    C, H = lay.count, lay.width
    desc = _table(
        ROW_FIELDS,
        a_off=2 * lay.rag,
        lda=2 * H,
        kdim=2 * H,
        b_addr=addr,
        ldb=D,
        ncol=D,
        c_off=lay.row0 * D,
        ldc=D,
        rows=C,
    )
    hint = lay.aligned and aligned
    _launch(_grouped_mm_kernel, (dh_R, dxs_AD, dxs_AD), desc, C, np.full_like(C, D), dh_R.dtype, hint,
            B_NK=False, SWIGLU_BWD=False)  # fmt: skip
    return dxs_AD


def grad_w1(dh_R: Tensor, xs_AD: Tensor, w1s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """dW1_e = dh_e^T xs_e, one [n_c, 2H_c, D] tensor per class (zeros for an expert with no token)."""
    D = xs_AD.shape[-1]
    lay = _layout("grad_w1", xs_AD, w1s, counts, True, D)
    dh_R = _check_ragged("grad_w1", dh_R, 2 * lay.rag_total)
    xs_AD = xs_AD.contiguous()
    dws = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in w1s]
    addr, aligned = expert_addresses(dws)
    C, H = lay.count, lay.width
    desc = _table(
        WGRAD_FIELDS, g_off=2 * lay.rag, ldg=2 * H, x_off=lay.row0 * D, ldx=D, rows=C, ncol=2 * H, mcol=D, out_addr=addr
    )
    _launch(_wgrad_kernel, (dh_R, xs_AD), desc, 2 * H, np.full_like(C, D), xs_AD.dtype, lay.aligned and aligned)
    return dws


def grad_w2(dout_AD: Tensor, act_R: Tensor, w2s: list[Tensor], counts: list[int]) -> list[Tensor]:
    """dW2_e = dout_e^T act_e, one [n_c, D, H_c] tensor per class (zeros for an expert with no token)."""
    D = dout_AD.shape[-1]
    lay = _layout("grad_w2", dout_AD, w2s, counts, False, D)
    act_R = _check_ragged("grad_w2", act_R, lay.rag_total)
    dout_AD = dout_AD.contiguous()
    dws = [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in w2s]
    addr, aligned = expert_addresses(dws)
    C, H = lay.count, lay.width
    desc = _table(WGRAD_FIELDS, g_off=lay.row0 * D, ldg=D, x_off=lay.rag, ldx=H, rows=C, ncol=D, mcol=H, out_addr=addr)
    _launch(_wgrad_kernel, (dout_AD, act_R), desc, np.full_like(C, D), H, dout_AD.dtype, lay.aligned and aligned)
    return dws


def _rag_total(ws, counts: list[int], halve: bool) -> int:
    return int(np.dot(np.asarray(counts, dtype=np.int64), class_widths(ws, halve)))


def _register_ops() -> dict:
    """Wrap each launcher as a ``mohge::<name>`` custom op with a fake (shape-only) implementation."""
    lib = "mohge::"
    ops = {
        "up_swiglu": torch.library.custom_op(lib + "up_swiglu", up_swiglu, mutates_args=()),
        "down_proj": torch.library.custom_op(lib + "down_proj", down_proj, mutates_args=()),
        "down_proj_bwd": torch.library.custom_op(lib + "down_proj_bwd", down_proj_bwd, mutates_args=()),
        "up_proj_bwd_x": torch.library.custom_op(lib + "up_proj_bwd_x", up_proj_bwd_x, mutates_args=()),
        "grad_w1": torch.library.custom_op(lib + "grad_w1", grad_w1, mutates_args=()),
        "grad_w2": torch.library.custom_op(lib + "grad_w2", grad_w2, mutates_args=()),
    }

    def rows(counts):
        return int(sum(counts))

    ops["up_swiglu"].register_fake(
        lambda xs, w1s, counts: (
            xs.new_empty(_rag_total(w1s, counts, True)),
            xs.new_empty(2 * _rag_total(w1s, counts, True)),
        )
    )
    ops["down_proj"].register_fake(lambda act, w2s, counts: act.new_empty(rows(counts), w2s[0].shape[1]))
    ops["down_proj_bwd"].register_fake(lambda dout, h, w2s, counts: torch.empty_like(h))
    ops["up_proj_bwd_x"].register_fake(lambda dh, w1s, counts: dh.new_empty(rows(counts), w1s[0].shape[2]))
    ops["grad_w1"].register_fake(lambda dh, xs, w1s, counts: [torch.empty_like(w) for w in w1s])
    ops["grad_w2"].register_fake(lambda dout, act, w2s, counts: [torch.empty_like(w) for w in w2s])
    return ops


OPS = _register_ops()
