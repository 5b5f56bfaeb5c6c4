"""GPU tests of the Triton expert path against the torch grouped path: fp32 tight, bf16 as close as torch's own bf16.

Run with ``pytest -m gpu tests/kernels``; every test skips without CUDA. Shapes go from awkward (1 token,
widths 20/36, d_model 48: the unaligned, unhinted kernels) to the release's widths 384..1280 at d_model 1024.

Legend: T tokens, D model width, K experts per token, H expert width.
"""

from __future__ import annotations

import pytest
import torch
from mohge.kernels import expert_swiglu
from mohge.kernels.reference import swiglu_grouped_torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

RELEASE_WIDTHS = [384 + 128 * g for g in range(8)]
# name -> (T, K, D, widths per class, experts per class, unused expert ids)
SHAPES = {
    "one_token": (1, 6, 64, [32, 64, 96], [3, 3, 2], []),
    "t127_awkward": (127, 2, 48, [20, 36], [3, 2], [2]),
    "t600_three_classes": (600, 4, 256, [96, 160, 256], [4, 4, 4], [5]),
    "t2048_release_widths": (2048, 6, 1024, RELEASE_WIDTHS, [8] * 8, []),
}


def _problem(T, K, D, widths, ns, unused, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    E = sum(ns)
    allowed = torch.tensor([e for e in range(E) if e not in unused], device=dev)
    scores = torch.rand(T, allowed.numel(), generator=g, device=dev)
    idx = allowed[scores.topk(K, dim=1).indices]
    x = torch.randn(T, D, generator=g, device=dev)
    w1s = [torch.randn(n, 2 * h, D, generator=g, device=dev) / D**0.5 for n, h in zip(ns, widths, strict=True)]
    w2s = [torch.randn(n, D, h, generator=g, device=dev) / h**0.5 for n, h in zip(ns, widths, strict=True)]
    gates = torch.softmax(torch.randn(T, K, generator=g, device=dev), dim=1)
    dy = torch.randn(T, D, generator=g, device=dev)
    return x, idx, gates, w1s, w2s, dy


def _run(fn, x, idx, gates, w1s, w2s, dy, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, gates, *w1s, *w2s)]
    nc = len(w1s)
    xl, gl, ws = leaves[0], leaves[1], leaves[2:]
    y = fn(xl, idx, gl, ws[:nc], ws[nc:])
    grads = torch.autograd.grad(y, leaves, dy.to(dtype))
    return [y.float(), *(g.float() for g in grads)]


def _max_err(a, b):
    return [(u - v).abs().max().item() / max(1.0, v.abs().max().item()) for u, v in zip(a, b, strict=True)]


def _labels(num_classes: int) -> list[str]:
    return ["y", "dx", "dgates"] + [f"dw1[{c}]" for c in range(num_classes)] + [f"dw2[{c}]" for c in range(num_classes)]


def _bf16_rounded(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


@pytest.mark.parametrize("name", list(SHAPES))
def test_fp32_matches_torch(name):
    from mohge.kernels.swiglu import swiglu_grouped_triton

    prob = _problem(*SHAPES[name])
    tri = _run(swiglu_grouped_triton, *prob, torch.float32)
    ref = _run(swiglu_grouped_torch, *prob, torch.float32)
    for label, err in zip(_labels(len(prob[3])), _max_err(tri, ref), strict=True):
        assert err < 2e-4, f"{name}: {label} rel err {err:.3g}"


@pytest.mark.parametrize("name", list(SHAPES))
def test_bf16_as_close_as_torch_bf16(name):
    """bf16 accumulates in fp32: its error to an fp32 reference is at most about torch bf16's own."""
    from mohge.kernels.swiglu import swiglu_grouped_triton

    x, idx, gates, w1s, w2s, dy = _problem(*SHAPES[name])
    rnd = _bf16_rounded  # every path sees the same bf16-representable inputs
    prob = (rnd(x), idx, rnd(gates), [rnd(w) for w in w1s], [rnd(w) for w in w2s], rnd(dy))
    ref = _run(swiglu_grouped_torch, *prob, torch.float32)
    tri = _run(swiglu_grouped_triton, *prob, torch.bfloat16)
    tch = _run(swiglu_grouped_torch, *prob, torch.bfloat16)
    errs = zip(_labels(len(w1s)), _max_err(tri, ref), _max_err(tch, ref), strict=True)
    for label, e_tri, e_tch in errs:
        assert e_tri <= 2 * e_tch + 1e-2, f"{name}: {label} triton {e_tri:.3g} vs torch bf16 {e_tch:.3g}"


def test_unused_expert_gets_zero_weight_grad():
    from mohge.kernels.swiglu import swiglu_grouped_triton

    T, K, D, widths, ns, unused = SHAPES["t600_three_classes"]
    out = _run(swiglu_grouped_triton, *_problem(T, K, D, widths, ns, unused), torch.float32)
    dw1, dw2 = out[3:6], out[6:9]
    c, j = 1, unused[0] - ns[0]  # expert 5 is class 1, member 1
    assert dw1[c][j].abs().max() == 0 and dw2[c][j].abs().max() == 0


def test_bitwise_deterministic():
    """No atomics anywhere: two runs give identical bits, forward and backward."""
    from mohge.kernels.swiglu import swiglu_grouped_triton

    prob = _problem(*SHAPES["t600_three_classes"])
    a = _run(swiglu_grouped_triton, *prob, torch.bfloat16)
    b = _run(swiglu_grouped_triton, *prob, torch.bfloat16)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_auto_backend_picks_triton_on_cuda(monkeypatch):
    from mohge.kernels import swiglu as triton_swiglu

    calls = []

    def spy(*args):
        calls.append(1)
        return triton_swiglu._TritonSwiGLU.apply(*args[:3], len(args[3]), *args[3], *args[4])

    monkeypatch.setattr(triton_swiglu, "swiglu_grouped_triton", spy)
    x, idx, gates, w1s, w2s, _ = _problem(*SHAPES["t127_awkward"])
    y_auto = expert_swiglu(x, idx, gates, w1s, w2s, backend="auto")
    assert calls == [1]
    torch.testing.assert_close(y_auto, swiglu_grouped_torch(x, idx, gates, w1s, w2s), rtol=2e-4, atol=2e-4)


def _plan_run(plan, x, idx, gates, dy, leaves):
    y = plan(x, idx, gates)
    return [y, *torch.autograd.grad(y, leaves, dy)]


@pytest.mark.parametrize("name", list(SHAPES))
def test_capturable_path_reads_nothing_on_the_host_and_equals_the_triton_path(name):
    """Under CUDA's sync debug mode "error" a device-to-host copy raises: the capturable forward and backward make
    none, and give the host-scheduled Triton path's bits."""
    from mohge.kernels.capture import CapturablePlan
    from mohge.kernels.swiglu import swiglu_grouped_triton

    T, K = SHAPES[name][:2]
    x, idx, gates, w1s, w2s, dy = _problem(*SHAPES[name])
    leaves = [t.bfloat16().requires_grad_() for t in (x, gates, *w1s, *w2s)]
    xb, gb, ws, dyb = leaves[0], leaves[1], leaves[2:], dy.bfloat16()
    nc = len(w1s)
    plan = CapturablePlan(ws[:nc], ws[nc:], T, K)
    plan_out = _plan_run(plan, xb, idx, gb, dyb, leaves)  # first call outside the debug mode: Triton compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = _plan_run(plan, xb, idx, gb, dyb, leaves)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = swiglu_grouped_triton(xb, idx, gb, ws[:nc], ws[nc:])
    want = [want, *torch.autograd.grad(want, leaves, dyb)]
    labels = _labels(nc)
    for label, a, b, c in zip(labels, plan_out, again, want, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), f"{name}: {label}"


def test_one_cuda_graph_replays_new_routings_as_the_eager_plan_computes_them():
    """Captured once, replayed after new tokens, routings and gates are copied into its inputs: each replay's
    output and gradients are those of the plan run eagerly on the same inputs, bit for bit."""
    from mohge.kernels.capture import CapturablePlan, cuda_graphed

    T, K, D, widths, ns, unused = SHAPES["t600_three_classes"]
    x, idx, gates, w1s, w2s, dy = _problem(T, K, D, widths, ns, unused)
    w1s, w2s = [w.bfloat16().requires_grad_() for w in w1s], [w.bfloat16().requires_grad_() for w in w2s]
    x_in, idx_in, g_in = x.bfloat16().requires_grad_(), idx.clone(), gates.bfloat16().requires_grad_()
    leaves = [x_in, g_in, *w1s, *w2s]
    plan = CapturablePlan(w1s, w2s, T, K)
    replay = cuda_graphed(lambda: _plan_run(plan, x_in, idx_in, g_in, dy.bfloat16(), leaves))
    for seed in (1, 2, 3):
        nx, nidx, ng, _, _, _ = _problem(T, K, D, widths, ns, [] if seed % 2 else unused, seed=seed)
        with torch.no_grad():
            x_in.copy_(nx.bfloat16())
            idx_in.copy_(nidx)
            g_in.copy_(ng.bfloat16())
        got = [t.clone() for t in replay()]
        want = _plan_run(plan, x_in, idx_in, g_in, dy.bfloat16(), leaves)
        for label, a, b in zip(_labels(len(w1s)), got, want, strict=True):
            assert torch.equal(a, b), f"seed {seed}: {label}"
