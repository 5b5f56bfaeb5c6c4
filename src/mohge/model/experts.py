"""Feed-forward networks: the dense SwiGLU and the bank of routed experts of several widths.

Every FFN here is the bias-free SwiGLU of the release (docs/method.md §1.2): [a; u] = W1 x, y = W2 (SiLU(a) * u)
with W1 in R^{2h x D} and W2 in R^{D x h}, 3*D*h parameters (:func:`mohge.config.sizes.swiglu_params`, the one place
that formula lives).

Legend: T tokens, D model width, K experts per token, H intermediate width of one class.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mohge import kernels

Tensor = torch.Tensor


class SwiGLU(nn.Module):
    """Dense SwiGLU FFN: the dense layers, the dense baseline and MoHGE's shared expert (no gate)."""

    def __init__(self, d_model: int, width: int, std: float, out_std: float) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(2 * width, d_model).normal_(0.0, std))  # [2H, D]: gate a, up u
        self.w2 = nn.Parameter(torch.empty(d_model, width).normal_(0.0, out_std))  # [D, H]

    def forward(self, x: Tensor) -> Tensor:
        a, u = F.linear(x, self.w1).chunk(2, dim=-1)
        return F.linear(F.silu(a) * u, self.w2)


class RoutedExperts(nn.Module):
    """E experts in width classes, stored as one [n_c, 2H_c, D] / [n_c, D, H_c] tensor pair per class.

    Expert ids are class-major (router order for MoHGE). The computation goes through the one dispatch in
    :mod:`mohge.kernels`, which picks the Triton, grouped-torch or reference-loop path from ``backend``.
    """

    def __init__(
        self, d_model: int, widths: tuple[int, ...], per_class: int, std: float, out_std: float, backend: str
    ) -> None:
        super().__init__()
        self.widths, self.per_class, self.backend = tuple(widths), per_class, backend
        self.w1 = nn.ParameterList(
            nn.Parameter(torch.empty(per_class, 2 * h, d_model).normal_(0.0, std)) for h in widths
        )
        self.w2 = nn.ParameterList(
            nn.Parameter(torch.empty(per_class, d_model, h).normal_(0.0, out_std)) for h in widths
        )

    @property
    def num_experts(self) -> int:
        return self.per_class * len(self.widths)

    def operands(self, x_TD: Tensor, gates_TK: Tensor) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor]]:
        """(x, gates, w1s, w2s) in the dtype the expert GEMMs compute in: autocast's where it is on (it does not
        reach custom ops, so they are cast as it would cast a matmul's), the input's otherwise."""
        w1s, w2s = list(self.w1), list(self.w2)
        device = x_TD.device.type
        if torch.is_autocast_enabled(device):
            dt = torch.get_autocast_dtype(device)
            x_TD, w1s, w2s = x_TD.to(dt), [w.to(dt) for w in w1s], [w.to(dt) for w in w2s]
        return x_TD, gates_TK.to(x_TD.dtype), w1s, w2s

    def forward(self, x_TD: Tensor, idx_TK: Tensor, gates_TK: Tensor) -> Tensor:
        x_TD, gates_TK, w1s, w2s = self.operands(x_TD, gates_TK)
        return kernels.expert_swiglu(x_TD, idx_TK, gates_TK, w1s, w2s, self.backend)
