"""The pure-torch expert paths of mohge.kernels (kernels/reference.py): the grouped path against the loop, forward and
backward on awkward shapes, and the shared contract's errors."""

from __future__ import annotations

import warnings

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


# ---------------------------------------------------------------- backend grouped_mm (F.grouped_mm per width class)

GROUPED_MM_CASES = [  # widths and D multiples of 8: grouped_mm needs 16-byte row strides (bf16)
    (1, 24, (8, 24), 2, 1, None),
    (127, 48, (16, 24, 40), 3, 6, 4),
    (600, 40, (16, 48), 4, 2, 0),
]


def _run(backend, case, probe):
    x, idx, gates, w1s, w2s = case
    y = kernels.expert_swiglu(x, idx, gates, w1s, w2s, backend)
    (y * probe).sum().backward()
    leaves = [x, gates, *w1s, *w2s]
    out = [y.detach(), *[torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in leaves]]
    for t in leaves:
        t.grad = None
    return out


def _cast(case, dtype):
    return [[t.detach().to(dtype).requires_grad_(t.requires_grad) for t in v] if isinstance(v, list) else
            (v if not v.is_floating_point() else v.detach().to(dtype).requires_grad_()) for v in case]  # fmt: skip


@pytest.mark.parametrize(("T", "D", "widths", "per_class", "K", "empty"), GROUPED_MM_CASES)
def test_grouped_mm_matches_loop_in_fp32(T, D, widths, per_class, K, empty):
    case = _cast(make_case(T, D, widths, per_class, K, empty), torch.float32)
    probe = torch.randn(T, D)
    ref, gmm = (_run(b, case, probe) for b in ("loop", "grouped_mm"))
    for r, g in zip(ref, gmm, strict=True):  # fp32 rounding only (the sums run in another order)
        torch.testing.assert_close(g, r, rtol=2e-6, atol=2e-6)
    if empty is not None:
        c, j = divmod(empty, per_class)
        assert torch.all(gmm[3 + c][j] == 0)


@pytest.mark.parametrize(("T", "D", "widths", "per_class", "K", "empty"), GROUPED_MM_CASES)
@pytest.mark.parametrize("backend", ["grouped_mm", "torch"])
def test_bf16_paths_follow_the_fp64_loop_within_bf16_tolerance(T, D, widths, per_class, K, empty, backend):
    """bf16 (padded rows on a CPU, kernels.reference.row_bucket) against the loop in float64 on the same values."""
    case64 = make_case(T, D, widths, per_class, K, empty)
    case16 = _cast(case64, torch.bfloat16)
    case64 = _cast(case16, torch.float64)  # the bf16-rounded inputs, exactly
    probe = torch.randn(T, D, dtype=torch.float64).to(torch.bfloat16)
    ref, got = _run("loop", case64, probe.double()), _run(backend, case16, probe)
    for r, g in zip(ref, got, strict=True):
        assert g.dtype == torch.bfloat16
        err = (g.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)
        assert err < 2e-2, err  # bf16 products and outputs: a few ulps (2^-8) of the largest entry
    if empty is not None:
        c, j = divmod(empty, per_class)
        assert torch.all(got[3 + c][j] == 0)


def test_row_bucket_bounds_padding_and_shapes():
    from mohge.kernels.reference import row_bucket

    assert row_bucket(0) == 0 and row_bucket(1) == 16 and row_bucket(16) == 16
    buckets = {row_bucket(c) for c in range(1, 4097)}
    assert len(buckets) <= 4 * 12 + 1  # about 4 per octave
    assert all(0 <= row_bucket(c) - c < max(16, c / 4) and row_bucket(c) % 16 == 0 for c in range(1, 4097))


def test_grouped_mm_names_a_misaligned_width():
    x, idx, gates, w1s, w2s = _cast(make_case(4, 16, (12,), 2, 1), torch.bfloat16)
    with pytest.raises(ValueError, match="width of class 0=12"):
        kernels.expert_swiglu(x, idx, gates, w1s, w2s, "grouped_mm")


def test_auto_on_cuda_falls_back_to_grouped_mm_once(monkeypatch):
    """A Triton failure under ``auto`` warns once and routes this and later calls to grouped_mm."""
    import mohge.kernels as k

    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("triton compilation failed")

    monkeypatch.setattr(k, "_triton", broken)
    monkeypatch.setattr(k, "_TRITON_FAILED", [])
    monkeypatch.setattr(k, "resolve_backend", lambda backend, device: "triton")
    case = _cast(make_case(9, 16, (8, 16), 2, 2), torch.float32)
    with pytest.warns(RuntimeWarning, match="using backend grouped_mm"):
        y = k.expert_swiglu(*case, "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y2 = k.expert_swiglu(*case, "auto")
    assert calls == [1] and torch.equal(y, y2)
    torch.testing.assert_close(y, k.swiglu_loop(*case), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_parallel_local_compute_runs_grouped_mm(dtype):
    """Under expert parallelism a rank runs its local experts through the same dispatch (distributed/ep.py
    ``compute``: the received rows, local expert ids, class-stacked weights): grouped_mm there equals the loop."""
    from mohge.train.distributed.ep_layer import ExpertParallelExperts

    widths_E, D = [16, 16, 32, 32, 48, 48], 24
    g = torch.Generator().manual_seed(0)
    weights = {e: (0.3 * torch.randn(2 * h, D, generator=g), 0.3 * torch.randn(D, h, generator=g)) for e, h in
               enumerate(widths_E)}  # fmt: skip
    ranks = [0, 1, 0, 1, 0, 1]  # this rank (0) holds experts 0, 2, 4: one per width class
    xs_RD = torch.randn(37, D, generator=g).to(dtype)
    le_R = torch.tensor([0] * 5 + [2] * 32, dtype=torch.int64)  # local expert 1 gets no row
    outs = {}
    for backend in ("loop", "grouped_mm"):
        mod = ExpertParallelExperts(widths_E, ranks, 0, D, weights, backend=backend).to(dtype)
        outs[backend] = mod.compute(xs_RD, le_R)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs["grouped_mm"].float(), outs["loop"].float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("experts", [1, 3, 255, 256, 257, 40_000])
def test_the_slot_order_is_the_stable_sort_of_the_int64_ids(experts):
    """sort_slots sorts narrower keys than the ids' int64: the order is the stable sort's, ties in slot order."""
    from mohge.kernels.reference import sort_slots

    g = torch.Generator().manual_seed(experts)
    idx = torch.cat([torch.randint(0, experts, (300, 4), generator=g), torch.full((1, 4), experts - 1)])
    order, tok, counts = sort_slots(idx, experts)
    assert torch.equal(order, torch.argsort(idx.reshape(-1), stable=True))
    assert torch.equal(tok, order // 4) and torch.equal(counts, torch.bincount(idx.reshape(-1), minlength=experts))
