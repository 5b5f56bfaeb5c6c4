"""The fused path's kernels of our own: the routers' (mohge.model.route_kernel), the short-window attention's
(mohge.model.attention_kernel), the head loss's row kernel (mohge.model.native.softmax_xent_) and the experts' combine
kernels (mohge.model.native.combine, combine_backward): the eager routers' selections, and their gates and gradients
up to rounding, for every router option; SDPA's attention and torch's functions up to rounding; held by a compiled
graph as single calls; anything outside the kernels computed as before; bad input refused before a kernel reads
it."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from mohge.config import FFNConfig, RouterConfig, preflight
from mohge.model import attention_kernel, native, route_kernel
from mohge.model.losses import group_aux_loss, switch_aux_loss
from mohge.model.routing import GroupedRouter, TopKRouter

needs_cxx = pytest.mark.skipif(preflight.cpp_compiler() is None, reason="no C++ compiler for the kernels here")

# (G, n, Kg, K, T): the capacity study's router, the release's shape class, Kg 1, the kernels' widest lanes with a
# tail block, one expert a group
GROUPED = [(8, 4, 4, 4, 1000), (4, 4, 2, 4, 333), (8, 4, 1, 2, 77), (16, 8, 3, 8, 50), (2, 1, 2, 2, 17)]


def _routes(router, x, w, aux) -> dict[bool, tuple[torch.Tensor, ...]]:
    """(idx, gates, group map or probs, d x, d each router weight) of the eager router and of the fused one, on the
    loss sum(gates * w) + aux(routing)."""
    out = {}
    for fused in (False, True):
        router.fused = fused
        x.grad = None
        router.zero_grad()
        r = router(x)
        ((r.gates_TK * w).sum() + aux(r)).backward()
        third = r.group_map_TG if r.group_map_TG is not None else r.probs_TE.detach()
        grads = [p.grad.clone() for p in router.parameters()]
        out[fused] = (r.idx_TK, r.gates_TK.detach(), third, x.grad.clone(), *grads)
    return out


def _close(got: torch.Tensor, want: torch.Tensor, scale: float) -> None:
    """Equal up to fp32 rounding of terms of size ``scale`` (a gradient made of rounding alone, as the group router's
    where Kg = 1 under sigmoid scores, is within it too)."""
    assert (got - want).abs().max().item() <= 2e-6 * scale, ((got - want).abs().max().item(), scale)


OPTIONS = list(itertools.product(["sigmoid", "softmax"], ["softmax_topk_probs", "product_renorm"]))


@pytest.mark.parametrize("score, gate", OPTIONS)
@pytest.mark.parametrize("shape", GROUPED)
@needs_cxx
def test_the_grouped_route_kernel_selects_the_eager_routers_experts_and_differs_only_by_rounding(shape, score, gate):
    G, n, Kg, K, T = shape
    torch.manual_seed(G * 100 + K * 10 + T)
    for group_bias, expert_bias in [(0.0, 0.0), (1e-2, 1e-2)]:
        ffn = FFNConfig(kind="mohge", num_experts=G * n, expert_widths=tuple(range(4, 4 + G)))
        rc = RouterConfig(
            topk=K, group_topk=Kg, group_score=score, gate_mode=gate, expert_bias_rate=expert_bias,
            group_bias_rate=group_bias, init_std=0.5,
        )  # fmt: skip
        router = GroupedRouter(16, ffn, rc)
        if expert_bias:
            router.expert_bias_E.normal_(0, 0.05)
            router.group_bias_G.normal_(0, 0.5)
        x = torch.randn(T, 16, dtype=torch.float64).float().requires_grad_()
        omega = torch.linspace(1, 2, G)

        def aux(r, omega=omega):
            return group_aux_loss(r.group_logits_TG, r.group_map_TG, omega, Kg)

        out = _routes(router, x, torch.randn(T, K), aux)
        want, got = out[False], out[True]
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])  # the same experts and groups
        _close(got[1], want[1], 1.0)
        scale = max(t.abs().max().item() for t in want[3:])
        for g, w in zip(got[3:], want[3:], strict=True):
            _close(g, w, scale)


@pytest.mark.parametrize("gate", ["logits", "probs"])
@pytest.mark.parametrize("E, K, T", [(32, 4, 1000), (15, 2, 37), (64, 8, 100), (3, 1, 10)])
@needs_cxx
def test_the_flat_route_kernel_selects_the_eager_routers_experts_and_differs_only_by_rounding(E, K, T, gate):
    torch.manual_seed(E * 10 + K + T)
    ffn = FFNConfig(kind="moe", num_experts=E, expert_widths=(8,), placement="contiguous")
    router = TopKRouter(16, ffn, RouterConfig(topk=K, flat_gate=gate, init_std=0.5))
    x = torch.randn(T, 16, dtype=torch.float64).float().requires_grad_()
    out = _routes(router, x, torch.randn(T, K), lambda r: 3.0 * switch_aux_loss(r.probs_TE, r.counts(E), K))
    want, got = out[False], out[True]
    assert torch.equal(got[0], want[0])
    _close(got[1], want[1], 1.0)
    _close(got[2], want[2], 1.0)
    scale = max(t.abs().max().item() for t in want[3:])
    for g, w in zip(got[3:], want[3:], strict=True):
        _close(g, w, scale)


@needs_cxx
@pytest.mark.xdist_group("fused_path")
def test_a_compiled_graph_holds_each_route_kernel_as_one_call_and_computes_what_it_computes_eagerly():
    ffn = FFNConfig(kind="mohge", num_experts=32, expert_widths=tuple(range(5, 13)))
    router = GroupedRouter(16, ffn, RouterConfig(topk=4, group_topk=4))
    router.fused = True
    x = torch.randn(300, 16, requires_grad=True)

    def run(fn):
        x.grad = None
        r = fn(x)
        r.gates_TK.pow(2).sum().backward()
        return r.idx_TK, r.gates_TK.detach(), r.group_map_TG, x.grad.clone()

    eager, compiled = run(router), run(torch.compile(router, dynamic=False))
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)  # the same kernel calls on the same GEMMs' outputs
    assert len(torch._dynamo.utils.counters["graph_break"]) == 0


@needs_cxx
def test_routers_outside_the_kernels_route_eagerly_on_the_fused_path():
    x = torch.randn(40, 16)
    ffn = FFNConfig(kind="mohge", num_experts=32, expert_widths=tuple(range(5, 13)))
    wide = GroupedRouter(16, ffn, RouterConfig(topk=9, group_topk=4))  # k beyond the kernel's 8
    flat = TopKRouter(16, FFNConfig(kind="moe", num_experts=300, expert_widths=(8,), placement="contiguous"),
                      RouterConfig(topk=2))  # fmt: skip
    for router in (wide, flat):
        eager = router(x)
        router.fused = True
        fused = router(x)
        assert torch.equal(fused.idx_TK, eager.idx_TK) and torch.equal(fused.gates_TK, eager.gates_TK)
    assert not route_kernel.fits(torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, 32), 4, 4, 4)
    assert not route_kernel.fits_flat(torch.zeros(4, 32, dtype=torch.float64), 4)


@needs_cxx
def test_the_route_kernels_refuse_input_beyond_their_buffers_naming_it():
    with pytest.raises(ValueError, match=r"grouped_route: .*n=4, kg=4, k=9"):
        route_kernel.grouped_route(torch.zeros(4, 8), torch.zeros(4, 32), None, None, 4, 4, 9, False, True)
    with pytest.raises(ValueError, match=r"grouped_route: .*\(4, 8\), \(4, 30\)"):
        route_kernel.grouped_route(torch.zeros(4, 8), torch.zeros(4, 30), None, None, 4, 4, 4, False, True)
    with pytest.raises(ValueError, match=r"flat_route: .*\(4, 300\)"):
        route_kernel.flat_route(torch.zeros(4, 300), 2, False)


@needs_cxx
@pytest.mark.parametrize("V", [514, 7, 64])
def test_the_row_loss_kernel_differs_from_torchs_cross_entropy_only_by_rounding(V):
    torch.manual_seed(V)
    z = (3 * torch.randn(100, V, dtype=torch.float64)).float().requires_grad_()
    y = torch.randint(0, V, (100,))
    want = F.cross_entropy(z, y, reduction="sum")
    want.backward()
    rows = z.detach().clone()
    got = native.softmax_xent_(rows, y, 0.5)
    assert abs(got - want.item()) <= 1e-6 * abs(want.item())
    assert (rows - 0.5 * z.grad).abs().max().item() <= 1e-7
    with pytest.raises(IndexError, match=rf"softmax_xent_: a target outside \[0, {V}\)"):
        native.softmax_xent_(z.detach().clone(), torch.full((100,), V), 1.0)


@needs_cxx
@pytest.mark.parametrize("T, K, D, padded", [(1000, 4, 32, False), (37, 3, 13, True), (5, 1, 64, True), (0, 2, 8, 0)])
def test_the_combine_kernels_compute_the_gathers_by_slot_up_to_rounding(T, K, D, padded):
    torch.manual_seed(T + K + D)
    P = T * K + (5 if padded else 0)
    out = torch.randn(P, D, dtype=torch.float64).float()
    row = torch.randperm(P)[: T * K].view(T, K)
    gates, dy = torch.rand(T, K), torch.randn(T, D)
    tok = torch.full((P,), T, dtype=torch.int64)  # a padding row: token T
    tok[row.reshape(-1)] = torch.arange(T).repeat_interleave(K)
    gate = torch.zeros(P)
    gate[row.reshape(-1)] = gates.reshape(-1)
    want = (out.double()[row] * gates.double()[..., None]).sum(1)
    assert (native.combine(out, row, gates).double() - want).abs().max().item() <= 1e-6 if T else True
    assert torch.equal(native.combine(out, row, None), out[row].sum(1))  # adds in slot order
    dout, dgates = native.combine_backward(dy, out, row, tok, gate)
    dy_ext = torch.cat([dy, dy.new_zeros(1, D)])
    assert torch.equal(dout, dy_ext[tok] * gate[:, None])
    torch.testing.assert_close(dgates, (out[row] * dy[:, None]).sum(-1), rtol=1e-5, atol=1e-6)
    assert native.combine_backward(dy, out, row.int(), tok, gate) is None  # not the kernels' input: the caller's ops
    if T:
        assert native.combine(out.t().contiguous().t(), row, gates) is None


@needs_cxx
@pytest.mark.parametrize("B, H, S, D", [(3, 2, 5, 8), (300, 4, 5, 8), (64, 4, 5, 16), (7, 3, 16, 32), (5, 2, 1, 4)])
def test_the_attention_kernel_differs_from_sdpa_only_by_rounding(B, H, S, D):
    torch.manual_seed(B + H + S + D)
    qkv = torch.randn(B, S, 3, H, D, dtype=torch.float64)
    want = [t.clone().requires_grad_() for t in qkv.permute(2, 0, 3, 1, 4)]
    y = F.scaled_dot_product_attention(*want, is_causal=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    got = [t.float().requires_grad_() for t in qkv.float().permute(2, 0, 3, 1, 4)]  # strided views of one projection
    y_BSHd = attention_kernel.short_attention(*got)
    y_BSHd.transpose(1, 2).backward(dy.float())
    assert y_BSHd.shape == (B, S, H, D) and y_BSHd.is_contiguous()
    assert (y_BSHd.transpose(1, 2).double() - y).abs().max().item() <= 2e-6
    for g, w in zip(got, want, strict=True):
        assert (g.grad.double() - w.grad).abs().max().item() <= 1e-5 * max(1.0, w.grad.abs().max().item())


@needs_cxx
def test_the_fused_path_takes_the_attention_kernel_only_where_it_was_measured_faster():
    q, x = torch.zeros(2, 4, 5, 8), torch.zeros(2, 5, 32)
    eight_lanes = native.lanes() == attention_kernel.FASTER_LANES
    assert attention_kernel.preferred(x, 8) is eight_lanes
    wide = torch.zeros(2, 4, 5, 16)
    assert attention_kernel.fits(wide, wide, wide) and not attention_kernel.preferred(x, 16)
    assert not attention_kernel.preferred(x.bfloat16(), 8)
    assert not attention_kernel.fits(q.bfloat16(), q.bfloat16(), q.bfloat16())
    long = torch.zeros(2, 4, attention_kernel.MAX_WINDOW + 1, 8)
    assert not attention_kernel.fits(long, long, long)
    with pytest.raises(ValueError, match=r"short_attention: .*S <= 16.*\(2, 4, 17, 8\)"):
        attention_kernel.short_attention(long, long, long)
