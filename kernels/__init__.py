"""Expert computation for heterogeneous (variable-width) grouped experts, imported as ``mohge.kernels``.

One entry point, :func:`expert_swiglu`, chooses the implementation once from ``backend``:

* ``torch``      - the pure-torch grouped path (:mod:`mohge.kernels.reference`), what trains on a CPU;
* ``grouped_mm`` - one ``torch.nn.functional.grouped_mm`` per width class and projection
  (:mod:`mohge.kernels.torch_grouped_mm`), no Python loop over experts;
* ``triton``     - the Triton kernels (:mod:`mohge.kernels.swiglu`), on CUDA or under ``TRITON_INTERPRET=1``;
* ``auto``       - Triton when the input lives on a CUDA device (``grouped_mm`` if the Triton path fails to
  compile there, with one warning), torch otherwise.

``loop`` is also accepted: the obvious per-expert loop, kept as the reference every path is tested against.
The model never branches on hardware; it passes its configured backend here.
"""

from __future__ import annotations

import warnings

import torch

from mohge.core.vocab import (
    BACKENDS,  # mohge.kernels imports nothing else of mohge (absolute: also importable as `kernels`)
)

from .reference import check_contract, sort_slots, swiglu_grouped_torch, swiglu_loop
from .torch_grouped_mm import swiglu_grouped_mm

__all__ = ["BACKENDS", "check_contract", "expert_swiglu", "resolve_backend", "sort_slots", "swiglu_loop"]

# Set once the Triton path failed under ``auto``: every later call goes to grouped_mm without retrying.
_TRITON_FAILED: list[str] = []


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``auto`` to a concrete backend for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return backend


def _triton(x_TD, idx_TK, gates_TK, w1s, w2s) -> torch.Tensor:
    from .swiglu import swiglu_grouped_triton

    return swiglu_grouped_triton(x_TD, idx_TK, gates_TK, w1s, w2s)


def _auto_cuda(x_TD, idx_TK, gates_TK, w1s, w2s) -> torch.Tensor:
    """Triton, or grouped_mm once Triton failed to import or compile (one warning, then no retry)."""
    if not _TRITON_FAILED:
        try:
            return _triton(x_TD, idx_TK, gates_TK, w1s, w2s)
        except ValueError:  # a contract error is the caller's, whatever the backend
            raise
        except Exception as err:  # noqa: BLE001 - ImportError, triton.CompilationError, out of resources, ...
            _TRITON_FAILED.append(f"{type(err).__name__}: {err}")
            warnings.warn(
                f"backend auto: the Triton expert kernels failed ({_TRITON_FAILED[0][:300]}); "
                "using backend grouped_mm (torch.nn.functional.grouped_mm) from now on",
                RuntimeWarning,
                stacklevel=3,
            )
    return swiglu_grouped_mm(x_TD, idx_TK, gates_TK, w1s, w2s)


def expert_swiglu(x_TD, idx_TK, gates_TK, w1s, w2s, backend: str = "auto") -> torch.Tensor:
    """y_t = sum_k gates[t,k] * SwiGLU_{idx[t,k]}(x_t) over experts of several widths (see reference.py)."""
    chosen = resolve_backend(backend, x_TD.device)
    if chosen == "torch":
        return swiglu_grouped_torch(x_TD, idx_TK, gates_TK, w1s, w2s)
    if chosen == "grouped_mm":
        return swiglu_grouped_mm(x_TD, idx_TK, gates_TK, w1s, w2s)
    if chosen == "loop":
        return swiglu_loop(x_TD, idx_TK, gates_TK, w1s, w2s)
    if backend == "auto":
        return _auto_cuda(x_TD, idx_TK, gates_TK, w1s, w2s)
    return _triton(x_TD, idx_TK, gates_TK, w1s, w2s)
