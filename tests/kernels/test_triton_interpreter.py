"""CPU tests of the Triton expert path: Triton's interpreter against the per-expert loop, fp32, awkward shapes.

Why child processes. ``TRITON_INTERPRET=1`` is read when a ``@triton.jit`` decorator runs, i.e. when
a Triton module of ``mohge.kernels`` is first imported, and the module then stays cached in ``sys.modules``. Setting
it inside this pytest process would either come too late (another test imported the kernels first) or
leak (the GPU tests of the same session would run interpreted). So the module fixture runs *this file*
as a script in two child processes with ``TRITON_INTERPRET=1`` set before anything imports Triton; they
compute every case and print JSON, and the tests here only compare numbers. The pytest process never
imports the Triton kernels. The same trick compiles every kernel for Hopper (sm_90) without a GPU.

Legend: T tokens, D model width, K experts per token, H expert width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# name -> (T, K, D, widths per class, experts per class, unused expert ids, frozen weights)
CASES = {
    "one_token": (1, 2, 48, [20, 36], [2, 2], [], False),
    "t127_k2_empty_expert": (127, 2, 48, [20, 36], [3, 2], [2], False),
    "t127_k1_d40": (127, 1, 40, [24, 36], [2, 2], [], False),
    "t24_k6_three_classes": (24, 6, 48, [20, 36, 16], [3, 3, 2], [], False),
    "t40_k3_d36_frozen_weights": (40, 3, 36, [20, 40], [2, 2], [0], True),
    "t600_k2": (600, 2, 32, [16, 32], [2, 2], [], False),
}
TOL = 1e-4  # max |triton - loop| / max(1, max |loop|), fp32 against a float64 loop
OPS = ("gather_rows", "combine_rows", "gate_grad", "up_swiglu", "down_proj", "down_proj_bwd", "up_proj_bwd_x")
OPS += ("grad_w1", "grad_w2")
WORKERS = 2
# the cases the capturable path (kernels/capture.py) also runs, fp32 and bf16: an idle expert, three classes,
# frozen weights
CAPTURE_CASES = ("t127_k2_empty_expert", "t24_k6_three_classes", "t40_k3_d36_frozen_weights")


def _interpreter_usable() -> str | None:
    """Why the interpreter cannot run here (None if it can)."""
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    tv = tuple(int(p) for p in triton.__version__.split(".")[:2])
    nv = tuple(int(p) for p in np.__version__.split(".")[:2])
    if tv < (3, 7) and nv >= (2, 4):
        return f"triton {triton.__version__}'s interpreter breaks with numpy {np.__version__}"
    return None


def _child(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _collect(proc: subprocess.Popen, timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"interpreter worker failed:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    reason = _interpreter_usable()
    if reason:
        pytest.skip(reason)
    names = list(CASES)
    procs = [_child(["--cases", *names[i::WORKERS]]) for i in range(WORKERS)]
    results = {}
    for p in procs:
        results.update(_collect(p, timeout=600))
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_grads_match_loop(interpreter_results, name):
    res = interpreter_results[name]
    for tensor, (err, scale) in res["errors"].items():
        assert err <= TOL * max(1.0, scale), f"{name}: {tensor} off by {err:.3g} (scale {scale:.3g})"
    for e in CASES[name][5]:
        assert res["unused_expert_grad"][str(e)] == 0.0, f"expert {e} has no token: its grads must be zero"


@pytest.mark.parametrize("name", CAPTURE_CASES)
def test_capturable_path_differs_from_the_host_scheduled_path_in_no_bit(interpreter_results, name):
    """The same kernels from tables and tiles built on the device, on a fixed grid whose surplus programs return:
    the output and every gradient equal the host-scheduled path's bit for bit, fp32 and bf16."""
    diffs = interpreter_results[name]["capturable_vs_triton"]
    assert diffs and all(d == 0.0 for d in diffs.values()), diffs


def test_custom_ops_pass_opcheck(interpreter_results):
    assert interpreter_results["opcheck"]["failed"] == {}, interpreter_results["opcheck"]["failed"]


def test_each_op_matches_its_torch_reference(interpreter_results):
    errors = interpreter_results["ops_vs_torch"]
    assert set(errors) == set(OPS), sorted(errors)
    for op, (err, scale) in errors.items():
        assert err <= TOL * max(1.0, scale), f"{op}: off its torch reference by {err:.3g} (scale {scale:.3g})"


def test_kernels_compile_for_hopper():
    """Every kernel variant the launchers use compiles to sm_90 PTX and cubin (ptxas ships with triton)."""
    pytest.importorskip("triton.backends.nvidia")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--compile"],
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    res = _collect(proc, timeout=600)
    assert res["failed"] == {}, res["failed"]
    # aligned bf16 GEMMs must use Hopper's wgmma and asynchronous (pipelined) copies
    for name, feats in res["features"].items():
        if name.startswith("bf16 ") and "gemm" in name:
            assert feats["wgmma"] and feats["cp_async"], (name, feats)


def test_device_tiles_are_the_tile_list_then_surplus_tiles_within_the_bound():
    import torch
    from mohge.kernels.schedule import device_tiles, tile_bound, tile_list

    rng = np.random.default_rng(0)
    for trial in range(100):
        E, bm, bn = int(rng.integers(1, 10)), (16, 32)[trial % 2], 16
        m_E, n_E = rng.integers(0, 100, E), rng.choice([16, 20, 36, 48], E)
        m_E[rng.integers(0, E)] = 0  # an idle expert
        host = tile_list(m_E, n_E, bm, bn)
        bound = tile_bound(n_E, int(m_E.sum()), bm, bn)
        dev = device_tiles(torch.tensor(m_E), torch.tensor(-(-n_E // bn)), bm, bn, bound).numpy()
        assert host.shape[0] <= bound and dev.shape == (bound, 3)
        assert np.array_equal(dev[: host.shape[0]], host) and np.all(dev[host.shape[0] :, 0] == -1), trial
    # the bound is reached: each expert's rows just past one block
    reached = tile_list(np.array([17, 17, 17]), np.full(3, 16), 16, 16).shape[0]
    assert tile_bound(np.full(3, 16), 3 * 17, 16, 16) == reached == 6


def test_tile_list_covers_each_output_once():
    from mohge.kernels.schedule import tile_list

    m_E, n_E = np.array([0, 1, 33, 16, 5]), np.array([20, 36, 20, 0, 48])
    tiles = tile_list(m_E, n_E, 16, 16)
    for e in range(m_E.size):
        cover = np.zeros((m_E[e], n_E[e]), dtype=int)
        for _, m0, n0 in tiles[tiles[:, 0] == e]:
            cover[m0 : m0 + 16, n0 : n0 + 16] += 1
        assert np.all(cover == 1), e
    assert not np.any(tiles[:, 0] == 0) and not np.any(tiles[:, 0] == 3), "empty extents get no tile"


# ---------------------------------------------------------------- child-process side (never run by pytest)


def _make_case(T, K, D, widths, ns, unused, frozen, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    E = sum(ns)
    allowed = torch.tensor([e for e in range(E) if e not in unused])
    idx = torch.stack([allowed[torch.randperm(allowed.numel(), generator=g)[:K]] for _ in range(T)])
    x = torch.randn(T, D, generator=g)
    w1s = [torch.randn(n, 2 * h, D, generator=g) / D**0.5 for n, h in zip(ns, widths, strict=True)]
    w2s = [torch.randn(n, D, h, generator=g) / h**0.5 for n, h in zip(ns, widths, strict=True)]
    gates = torch.rand(T, K, generator=g) + 0.1
    dy = torch.randn(T, D, generator=g)
    leaves = [x, gates] + ([] if frozen else [*w1s, *w2s])
    for t in leaves:
        t.requires_grad_(True)
    return x, idx, gates, w1s, w2s, dy, leaves


def _run_case(name: str) -> dict:
    import torch
    from mohge.kernels.reference import swiglu_loop
    from mohge.kernels.swiglu import swiglu_grouped_triton

    T, K, D, widths, ns, unused, frozen = CASES[name]
    x, idx, gates, w1s, w2s, dy, leaves = _make_case(*CASES[name])
    y = swiglu_grouped_triton(x, idx, gates, w1s, w2s)
    grads = torch.autograd.grad(y, leaves, dy)
    d = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, gates, *w1s, *w2s)]
    x64, g64, w64 = d[0], d[1], d[2:]
    nc = len(w1s)
    y64 = swiglu_loop(x64, idx, g64, w64[:nc], w64[nc:])
    leaves64 = [x64, g64] + ([] if frozen else w64)
    ref = torch.autograd.grad(y64, leaves64, dy.double(), allow_unused=True)  # an unused class gets None
    ref = [torch.zeros_like(t) if r is None else r for t, r in zip(leaves64, ref, strict=True)]
    labels = ["x", "gates"] + ([] if frozen else [f"w1[{c}]" for c in range(nc)] + [f"w2[{c}]" for c in range(nc)])
    errors = {"y": [(y.double() - y64).abs().max().item(), y64.abs().max().item()]}
    for label, a, b in zip(labels, grads, ref, strict=True):
        errors["d" + label] = [(a.double() - b).abs().max().item(), b.abs().max().item()]
    unused_grad = {}
    if not frozen:
        per_expert = [(c, j) for c, n in enumerate(ns) for j in range(n)]
        for e in unused:
            c, j = per_expert[e]
            unused_grad[str(e)] = float(grads[2 + c][j].abs().max() + grads[2 + nc + c][j].abs().max())
    else:
        unused_grad = {str(e): 0.0 for e in unused}
    out = {"errors": errors, "unused_expert_grad": unused_grad}
    if name in CAPTURE_CASES:
        out["capturable_vs_triton"] = _capturable_vs_triton(name)
    return out


def _capturable_vs_triton(name: str) -> dict:
    """Max |difference| of the output and every gradient, capturable path against the host-scheduled one."""
    import torch
    from mohge.kernels.capture import CapturablePlan
    from mohge.kernels.swiglu import swiglu_grouped_triton

    T, K = CASES[name][:2]
    diffs = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, idx, gates, w1s, w2s, dy, leaves = _make_case(*CASES[name])
        x, gates, dy = x.detach().to(dtype), gates.detach().to(dtype), dy.to(dtype)
        w1s, w2s = [w.detach().to(dtype) for w in w1s], [w.detach().to(dtype) for w in w2s]
        frozen = len(leaves) == 2
        leaves = [x, gates] + ([] if frozen else [*w1s, *w2s])
        for t in leaves:
            t.requires_grad_(True)
        plan = CapturablePlan(w1s, w2s, T, K)
        got = [plan(x, idx, gates)]
        got += torch.autograd.grad(got[0], leaves, dy)
        want = [swiglu_grouped_triton(x, idx, gates, w1s, w2s)]
        want += torch.autograd.grad(want[0], leaves, dy)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            diffs[f"{dtype} {i}"] = (a.float() - b.float()).abs().max().item()
    return diffs


def _opcheck_all() -> dict:
    """torch.library.opcheck on every custom op: schema, fake (shape) impl, AOT dispatch. Forward only:
    the ops carry no autograd of their own (the autograd.Function in kernels/swiglu.py orders their backward)."""
    import torch
    from mohge.kernels.grouped_mm import down_proj_bwd_op, down_proj_op, up_proj_bwd_x_op
    from mohge.kernels.permute import combine_rows_op, gate_grad_op, gather_rows_op
    from mohge.kernels.swiglu import route
    from mohge.kernels.up_swiglu import up_swiglu_op
    from mohge.kernels.wgrad import grad_w1_op, grad_w2_op

    x, idx, gates, w1s, w2s, dy, _ = _make_case(9, 2, 48, [20, 36], [2, 2], [], True)
    x, gates = x.detach(), gates.detach()
    order, tok, inv, counts = route(idx, sum(w.shape[0] for w in w1s))
    xs = gather_rows_op(x, tok)
    act, h = up_swiglu_op(xs, w1s, counts)
    out = down_proj_op(act, w2s, counts)
    _, dout = gate_grad_op(dy, out, order, gates)
    dh = down_proj_bwd_op(dout, h, w2s, counts)
    calls = [
        (gather_rows_op, (x, tok)),
        (combine_rows_op, (out, inv, gates)),
        (combine_rows_op, (out, inv, None)),
        (gate_grad_op, (dy, out, order, gates)),
        (up_swiglu_op, (xs, w1s, counts)),
        (down_proj_op, (act, w2s, counts)),
        (down_proj_bwd_op, (dout, h, w2s, counts)),
        (up_proj_bwd_x_op, (dh, w1s, counts)),
        (grad_w1_op, (dh, xs, w1s, counts)),
        (grad_w2_op, (dout, act, w2s, counts)),
    ]
    failed = {}
    for op, args in calls:
        try:
            torch.library.opcheck(op, args)
        except Exception as exc:  # collect every failure
            failed[str(op)] = f"{type(exc).__name__}: {str(exc)[-600:]}"
    return {"failed": failed}


def _ops_vs_torch() -> dict:
    """Every op's launcher (interpreted Triton) against its pure-torch reference, on one case with an idle expert."""
    from mohge.kernels import grouped_mm as M
    from mohge.kernels import permute as P
    from mohge.kernels import up_swiglu as U
    from mohge.kernels import wgrad as W
    from mohge.kernels.swiglu import route

    x, idx, gates, w1s, w2s, dy, _ = _make_case(33, 2, 48, [20, 36], [2, 2], [1], True)
    x, gates = x.detach(), gates.detach()
    order, tok, inv, counts = route(idx, sum(w.shape[0] for w in w1s))
    xs = P.gather_rows_torch(x, tok)
    act, h = U.up_swiglu_torch(xs, w1s, counts)
    out = M.down_proj_torch(act, w2s, counts)
    _, dout = P.gate_grad_torch(dy, out, order, gates)
    dh = M.down_proj_bwd_torch(dout, h, w2s, counts)
    pairs = {
        "gather_rows": (P.gather_rows, P.gather_rows_torch, (x, tok)),
        "combine_rows": (P.combine_rows, P.combine_rows_torch, (out, inv, gates)),
        "gate_grad": (P.gate_grad, P.gate_grad_torch, (dy, out, order, gates)),
        "up_swiglu": (U.up_swiglu, U.up_swiglu_torch, (xs, w1s, counts)),
        "down_proj": (M.down_proj, M.down_proj_torch, (act, w2s, counts)),
        "down_proj_bwd": (M.down_proj_bwd, M.down_proj_bwd_torch, (dout, h, w2s, counts)),
        "up_proj_bwd_x": (M.up_proj_bwd_x, M.up_proj_bwd_x_torch, (dh, w1s, counts)),
        "grad_w1": (W.grad_w1, W.grad_w1_torch, (dh, xs, w1s, counts)),
        "grad_w2": (W.grad_w2, W.grad_w2_torch, (dout, act, w2s, counts)),
    }
    errors = {}
    for name, (op, ref, args) in pairs.items():
        got, want = op(*args), ref(*args)
        got, want = (list(got), list(want)) if isinstance(want, tuple | list) else ([got], [want])
        err = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, want, strict=True))
        errors[name] = [err, max(w.abs().max().item() for w in want)]
    return errors


def _compile_all() -> dict:
    """Compile every launched kernel variant for cuda sm_90 (no GPU needed), bf16 (hinted) and fp32."""
    import re

    import triton
    from mohge.kernels import grouped_mm, up_swiglu, wgrad
    from mohge.kernels import permute as P
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_for(fn, types: dict, constexprs: dict, num_warps=4, num_stages=3):
        sig = {n: "constexpr" if n in constexprs else types[n] for n in fn.arg_names}
        aligned = [n for n in fn.arg_names if n in types and (types[n].startswith("*") or n == "D")]
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
        opts = {"num_warps": num_warps, "num_stages": num_stages}
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)

    variants = []
    for dt, hint, (bm, bn, bk, nw, ns), prec in [
        ("bf16", True, (128, 128, 64, 8, 3), "tf32"),
        ("bf16", False, (128, 128, 64, 8, 3), "tf32"),
        ("fp32", False, (64, 64, 32, 4, 2), "ieee"),
    ]:
        c = dict(HINT=hint, UPCAST=False, PRECISION=prec, BM=bm, BN=bn, BK=bk)
        rows = {n: f"*{dt}" for n in ("a_ptr", "c_ptr", "h_ptr", "x_ptr", "act_ptr", "g_ptr")}
        rows.update(desc_ptr="*i64", tile_ptr="*i64")
        tag = f"{dt}{'' if hint else '_nohint'}"
        variants.append((f"{tag} gemm up_swiglu", up_swiglu._up_swiglu_kernel, rows, c, nw, ns))
        for b_nk, sw in [(True, False), (False, True), (False, False)]:
            cc = dict(c, B_NK=b_nk, SWIGLU_BWD=sw)
            mm = grouped_mm._grouped_mm_kernel
            variants.append((f"{tag} gemm mm B_NK={b_nk} SWIGLU_BWD={sw}", mm, rows, cc, nw, ns))
        variants.append((f"{tag} gemm wgrad", wgrad._wgrad_kernel, rows, c, nw, ns))
    for dt in ("bf16", "fp32"):
        perm = dict(x_ptr=f"*{dt}", out_ptr=f"*{dt}", rows_ptr=f"*{dt}", y_ptr=f"*{dt}", dy_ptr=f"*{dt}",
                    dout_ptr=f"*{dt}", src_ptr="*i64", inv_ptr="*i64", order_ptr="*i64", gate_ptr="*fp32",
                    gates_ptr="*fp32", dgates_ptr="*fp32", A="i32", T="i32", K="i32", D="i32")  # fmt: skip
        variants.append((f"{dt} gather", P._gather_rows_kernel, perm, dict(BR=16, BD=256), 4, 1))
        variants.append((f"{dt} combine", P._combine_rows_kernel, perm, dict(HAS_GATE=True, BT=16, BD=256), 4, 1))
        variants.append((f"{dt} gate_grad", P._gate_grad_kernel, perm, dict(BR=16, BD=256), 4, 1))
    failed, features = {}, {}
    for name, fn, types, cexpr, nw, ns in variants:
        try:
            ptx = compile_for(fn, types, cexpr, nw, ns).asm["ptx"]
        except Exception as exc:  # report every failing variant, not just the first
            failed[name] = f"{type(exc).__name__}: {str(exc)[-800:]}"
            continue
        features[name] = {"wgmma": "wgmma" in ptx, "cp_async": bool(re.search(r"cp\.async", ptx))}
    return {"failed": failed, "features": features}


def _main(argv: list[str]) -> None:
    if argv[0] == "--compile":
        print(json.dumps(_compile_all()))
        return
    assert argv[0] == "--cases" and os.environ.get("TRITON_INTERPRET") == "1"
    import torch

    torch.set_num_threads(1)
    results = {name: _run_case(name) for name in argv[1:]}
    if CASES and argv[1] == next(iter(CASES)):
        results["opcheck"] = _opcheck_all()
        results["ops_vs_torch"] = _ops_vs_torch()
    print(json.dumps(results))


if __name__ == "__main__":
    _main(sys.argv[1:])
