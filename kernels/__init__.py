"""Expert computation for heterogeneous (variable-width) grouped experts, imported as ``mohge.kernels``.

One entry point, :func:`expert_swiglu`, chooses the implementation once from ``backend``:

* ``torch``  - the pure-torch grouped path (:mod:`mohge.kernels.reference`), what trains on a CPU;
* ``triton`` - the Triton kernels (:mod:`mohge.kernels.swiglu`), on CUDA or under ``TRITON_INTERPRET=1``;
* ``auto``   - Triton when the input lives on a CUDA device, torch otherwise.

``loop`` is also accepted: the obvious per-expert loop, kept as the reference every path is tested against.
The model never branches on hardware; it passes its configured backend here.
"""

from __future__ import annotations

import torch

# The config's vocabulary from its dependency-free module (absolute: the folder is also importable as `kernels`);
# mohge.kernels imports nothing else of mohge, so it needs only torch, triton and numpy.
from mohge.vocab import BACKENDS

from .reference import check_contract, sort_slots, swiglu_grouped_torch, swiglu_loop

__all__ = ["BACKENDS", "check_contract", "expert_swiglu", "resolve_backend", "sort_slots", "swiglu_loop"]


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``auto`` to a concrete backend for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return backend


def expert_swiglu(x_TD, idx_TK, gates_TK, w1s, w2s, backend: str = "auto") -> torch.Tensor:
    """y_t = sum_k gates[t,k] * SwiGLU_{idx[t,k]}(x_t) over experts of several widths (see reference.py)."""
    chosen = resolve_backend(backend, x_TD.device)
    if chosen == "torch":
        return swiglu_grouped_torch(x_TD, idx_TK, gates_TK, w1s, w2s)
    if chosen == "loop":
        return swiglu_loop(x_TD, idx_TK, gates_TK, w1s, w2s)
    from .swiglu import swiglu_grouped_triton

    return swiglu_grouped_triton(x_TD, idx_TK, gates_TK, w1s, w2s)
