"""The pure-torch expert paths of mohge.kernels (kernels/reference.py): the grouped path against the loop, forward and
backward on awkward shapes, and the shared contract's errors."""

from __future__ import annotations

import pytest
import torch

from mohge import kernels


def make_case(T, D, widths, per_class, K, empty_expert=None, dtype=torch.float64):
    w1s = [(torch.randn(per_class, 2 * h, D, dtype=dtype) * 0.3).requires_grad_() for h in widths]
    w2s = [(torch.randn(per_class, D, h, dtype=dtype) * 0.3).requires_grad_() for h in widths]
    E = per_class * len(widths)
    pool = [e for e in range(E) if e != empty_expert]
    idx = torch.stack([torch.tensor(pool)[torch.randperm(len(pool))[:K]] for _ in range(T)])
    x = torch.randn(T, D, dtype=dtype, requires_grad=True)
    gates = torch.rand(T, K, dtype=dtype, requires_grad=True)
    return x, idx, gates, w1s, w2s


@pytest.mark.parametrize(
    ("T", "D", "widths", "per_class", "K", "empty"),
    [
        (1, 24, (8, 20), 2, 1, None),
        (127, 48, (12, 20, 36), 3, 6, 4),
        (600, 40, (16, 48), 4, 2, 0),
    ],
)
def test_grouped_torch_matches_loop_forward_and_backward(T, D, widths, per_class, K, empty):
    case = make_case(T, D, widths, per_class, K, empty)
    x, idx, gates, w1s, w2s = case
    probe = torch.randn(T, D, dtype=x.dtype)
    results = []
    for backend in ("loop", "torch"):
        y = kernels.expert_swiglu(x, idx, gates, w1s, w2s, backend)
        (y * probe).sum().backward()
        leaves = [x, gates, *w1s, *w2s]
        results.append([y.detach(), *[torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in leaves]])
        for t in leaves:
            t.grad = None
    for ref, got in zip(*results, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    if empty is not None:  # the expert with no token gets an exactly zero gradient
        c, j = divmod(empty, per_class)
        assert torch.all(results[1][3 + c][j] == 0)


def test_contract_errors_name_the_problem():
    x, idx, gates, w1s, w2s = make_case(4, 8, (4,), 2, 1, dtype=torch.float32)
    with pytest.raises(ValueError, match="class 0"):
        kernels.expert_swiglu(x, idx, gates, [w1s[0][:, :5]], w2s, "torch")
    with pytest.raises(ValueError, match="backend"):
        kernels.expert_swiglu(x, idx, gates, w1s, w2s, "cuda-magic")
