"""The fused path's kernels of our own on a CPU (``train.fused``), in C: the routers' top-k (:mod:`mohge.model.topk`)
and the experts' SiLU products (:func:`silu_mul`, :func:`silu_mul_backward`, fp32 and bf16, used by
:class:`mohge.model.fused._ClassSwiGLU` in fp32 and by the grouped path of :mod:`mohge.kernels.reference` in bf16).

They are built on first use with the C++ compiler the fused path already needs (``$CXX``, else ``g++``: the one
torch.compile builds its CPU graphs with, :func:`mohge.config.preflight.cpp_compiler`), for this CPU
(``-march=native``), once per source, compiler and CPU, into a cache folder (``$MOHGE_NATIVE_CACHE``, else one per
user in the temporary folder), and called through ctypes. ``-fno-trapping-math`` lets the compiler vectorize loops
whose selects guard a division (IEEE results are kept: no reassociation, NaN and infinities as written).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

Tensor = torch.Tensor

TOPK_SOURCE = r"""
#define LANES 16
#define KMAX 8
/* The indices [rows, k] of the k largest entries of each row of v ([rows, n] floats, row stride `stride`), largest
   first; equal values: the lower index first; NaN below every number (read as -inf, then last among equals by
   index). Rows go LANES at a time, one per lane; each lane keeps its row's best k so far (b, ix: value and index,
   sorted) and pushes each new entry down the list with selects, so the loop over l vectorizes. */
extern "C" void mohge_topk_rows_f32(const float *v, int64_t rows, int64_t n, int64_t stride, int64_t k,
                                    int64_t *out) {
    for (int64_t t0 = 0; t0 < rows; t0 += LANES) {
        const int64_t m = rows - t0 < LANES ? rows - t0 : LANES;
        float b[KMAX][LANES];
        int32_t ix[KMAX][LANES];
        for (int j = 0; j < KMAX; ++j)
            for (int l = 0; l < LANES; ++l) {
                b[j][l] = -INFINITY;
                ix[j][l] = -1;
            }
        for (int64_t e = 0; e < n; ++e) {
            float x[LANES];
            int32_t xi[LANES];
            for (int l = 0; l < LANES; ++l) {
                const float y = l < m ? v[(t0 + l) * stride + e] : -INFINITY;
                x[l] = y == y ? y : -INFINITY;
                xi[l] = (int32_t)e;
            }
            for (int64_t j = 0; j < k; ++j)
                for (int l = 0; l < LANES; ++l) {
                    const bool c = (x[l] > b[j][l]) | (ix[j][l] < 0);  /* an empty slot takes any entry */
                    const float bj = b[j][l];
                    const int32_t ij = ix[j][l];
                    b[j][l] = c ? x[l] : bj;
                    ix[j][l] = c ? xi[l] : ij;
                    x[l] = c ? bj : x[l];
                    xi[l] = c ? ij : xi[l];
                }
        }
        for (int64_t l = 0; l < m; ++l)
            for (int64_t j = 0; j < k; ++j) out[(t0 + l) * k + j] = ix[j][l];
    }
}
"""

SILU_SOURCE = r"""
/* exp(x) in float: Cephes' polynomial after a reduction by ln 2, in arithmetic and selects only, so that the loops
   calling it vectorize (within 2 ulp of expf; arguments clamped to [-87.3, 88.7], where expf stays finite) */
static inline float exp_f32(float x) {
    x = x < -87.33654475f ? -87.33654475f : (x > 88.72283905f ? 88.72283905f : x);
    const float t = x * 1.44269504088896341f;
    const int32_t n = (int32_t)(t + (t < 0.0f ? -0.5f : 0.5f));
    const float fx = (float)n;
    x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
    const float z = x * x;
    float y = 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    return y * __builtin_bit_cast(float, (n + 127) << 23);
}
/* storage: float as is; bf16 (its 16 high bits) widened exactly, rounded to nearest even, NaN kept a NaN */
struct F32 {
    typedef float T;
    static inline float load(float v) { return v; }
    static inline float store(float f) { return f; }
};
struct BF16 {
    typedef uint16_t T;
    static inline float load(uint16_t v) { return __builtin_bit_cast(float, (uint32_t)v << 16); }
    static inline uint16_t store(float f) {
        const uint32_t u = __builtin_bit_cast(uint32_t, f);
        const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : r);
    }
};
/* act = SiLU(a) * u * g over [rows, cols] blocks (g: one value per row; none: 1): a and u with row stride lda, act
   with row stride ldo; in float */
template <class S>
static void silu_mul(const typename S::T *__restrict a, const typename S::T *__restrict u, int64_t lda,
                     const typename S::T *__restrict g, typename S::T *__restrict act, int64_t ldo, int64_t rows,
                     int64_t cols) {
    for (int64_t i = 0; i < rows; ++i) {
        const typename S::T *__restrict ar = a + i * lda, *__restrict ur = u + i * lda;
        typename S::T *__restrict o = act + i * ldo;
        const float gi = g ? S::load(g[i]) : 1.0f;
        for (int64_t j = 0; j < cols; ++j) {
            const float x = S::load(ar[j]), s = 1.0f / (1.0f + exp_f32(-x));
            o[j] = S::store(x * s * S::load(ur[j]) * gi);
        }
    }
}
/* The gradients of act = SiLU(a) * u * g given dact: da = g dact u SiLU'(a) and du = g dact SiLU(a), SiLU'(a) =
   s (1 + a (1 - s)) with s = sigmoid(a), and (where dg is given) dg = sum over the row of SiLU(a) u dact, summed in 16
   lanes; a and u with row stride lda, dact with ldd, da and du with ldg; in float */
#define DOT_LANES 16
template <class S>
static inline void silu_mul_grad(const typename S::T *__restrict ar, const typename S::T *__restrict ur,
                                 const typename S::T *__restrict dr, typename S::T *__restrict ga,
                                 typename S::T *__restrict gu, float gi, float *__restrict acc, int64_t j, int l) {
    const float x = S::load(ar[j]), s = 1.0f / (1.0f + exp_f32(-x)), d = S::load(dr[j]), y = S::load(ur[j]);
    acc[l] += x * s * y * d;
    gu[j] = S::store(gi * d * x * s);
    ga[j] = S::store(gi * d * y * s * (1.0f + x * (1.0f - s)));
}
template <class S>
static void silu_mul_backward(const typename S::T *__restrict a, const typename S::T *__restrict u, int64_t lda,
                              const typename S::T *__restrict dact, int64_t ldd, const typename S::T *__restrict g,
                              typename S::T *__restrict da, typename S::T *__restrict du, int64_t ldg,
                              typename S::T *__restrict dg, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; ++i) {
        const typename S::T *__restrict ar = a + i * lda, *__restrict ur = u + i * lda, *__restrict dr = dact + i * ldd;
        typename S::T *__restrict ga = da + i * ldg, *__restrict gu = du + i * ldg;
        const float gi = g ? S::load(g[i]) : 1.0f;
        float acc[DOT_LANES] = {0.0f};
        int64_t j = 0;
        for (; j + DOT_LANES <= cols; j += DOT_LANES)
            for (int l = 0; l < DOT_LANES; ++l) silu_mul_grad<S>(ar, ur, dr, ga, gu, gi, acc, j + l, l);
        for (int l = 0; j < cols; ++j, ++l) silu_mul_grad<S>(ar, ur, dr, ga, gu, gi, acc, j, l);
        if (dg) {
            float sum = 0.0f;
            for (int l = 0; l < DOT_LANES; ++l) sum += acc[l];
            dg[i] = S::store(sum);
        }
    }
}
#define SILU_ENTRY(SUFFIX, S)                                                                                        \
    extern "C" void mohge_silu_mul_##SUFFIX(const S::T *a, const S::T *u, int64_t lda, const S::T *g, S::T *act,     \
                                            int64_t ldo, int64_t rows, int64_t cols) {                               \
        silu_mul<S>(a, u, lda, g, act, ldo, rows, cols);                                                             \
    }                                                                                                                \
    extern "C" void mohge_silu_mul_backward_##SUFFIX(const S::T *a, const S::T *u, int64_t lda, const S::T *dact,    \
                                                     int64_t ldd, const S::T *g, S::T *da, S::T *du, int64_t ldg,    \
                                                     S::T *dg, int64_t rows, int64_t cols) {                         \
        silu_mul_backward<S>(a, u, lda, dact, ldd, g, da, du, ldg, dg, rows, cols);                                  \
    }
SILU_ENTRY(f32, F32)
SILU_ENTRY(bf16, BF16)
"""

SOURCE = "#include <cmath>\n#include <cstdint>\n" + TOPK_SOURCE + SILU_SOURCE
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-shared", "-fPIC", "-x", "c++")


def cache_dir() -> Path:
    """Where the built kernels are kept: ``$MOHGE_NATIVE_CACHE``, else ``mohge_native_<uid>`` in the temporary
    folder."""
    env = os.environ.get("MOHGE_NATIVE_CACHE")
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(env) if env else Path(tempfile.gettempdir()) / f"mohge_native_{uid}"


def _cpu() -> str:
    """This CPU's feature flags (what ``-march=native`` compiles for), as the cache key reads them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def build(cxx: str) -> Path:
    """The kernels built with the compiler ``cxx`` for this CPU: the cached library, or a new one (compiled to a
    file of its own, then renamed into place whole, so processes building at once never read a partial one)."""
    path = shutil.which(cxx)
    if path is None:
        raise RuntimeError(f"train.fused: the C++ compiler {cxx!r} ($CXX, else g++) is not on the PATH")
    key = hashlib.sha256("\0".join([SOURCE, path, *FLAGS, _cpu()]).encode()).hexdigest()[:20]
    lib = cache_dir() / f"native_{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    src = lib.with_name(f"native_{key}.{os.getpid()}.cpp")
    tmp = lib.with_name(f"native_{key}.{os.getpid()}.so.tmp")
    src.write_text(SOURCE, encoding="utf-8")
    try:
        proc = subprocess.run([path, *FLAGS, str(src), "-o", str(tmp)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(
                f"train.fused: building the fused path's kernels with {path} failed "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            )
        os.replace(tmp, lib)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return lib


@functools.cache
def library() -> ctypes.CDLL:
    """The built kernels, loaded (built first where the cache has none for this source, compiler and CPU)."""
    return ctypes.CDLL(str(build(os.environ.get("CXX") or "g++")))


@functools.cache
def kernel(name: str, *argtypes: type) -> ctypes._CFuncPtr:
    """The function ``name`` of :func:`library`, with its argument types (it returns nothing); looked up and typed
    once, as it is called per expert and step."""
    fn = getattr(library(), name)
    fn.argtypes = list(argtypes)
    fn.restype = None
    return fn


_P, _I = ctypes.c_void_p, ctypes.c_int64


_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the dtypes the SiLU kernels compute for (in float)


def _gates(a: Tensor, *gs: Tensor) -> bool:
    """Whether every per-row vector (a gate, its gradient) is a contiguous 1-D tensor of ``a``'s dtype, one value a
    row of ``a``."""
    return all(g.dtype == a.dtype and g.dim() == 1 and g.shape[0] == a.shape[0] and g.is_contiguous() for g in gs)


def _rows(*ts: Tensor) -> bool:
    """Whether the tensors are 2-D CPU blocks of contiguous rows (any row stride), all fp32 or all bf16: what the SiLU
    kernels take."""
    return ts[0].dtype in _SUFFIX and all(
        t.dtype == ts[0].dtype and t.device.type == "cpu" and t.dim() == 2 and t.stride(1) == 1 for t in ts
    )


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def silu_mul(a: Tensor, u: Tensor, g: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """``F.silu(a) * u`` (times ``g[:, None]``, one value a row, where given) as a new contiguous tensor, or written
    into ``out`` (a's shape and dtype) and returned: one pass of the kernel (in float, one rounding to the dtype) for
    fp32 or bf16 blocks of contiguous rows (a and u of one row stride, as the gate and up halves of one buffer; out of
    any row stride; g contiguous, of their dtype), torch's ops for anything else."""
    gs = () if g is None else (g,)
    fits = _rows(a, u) and a.shape == u.shape and a.stride(0) == u.stride(0) and _gates(a, *gs)
    if not (fits and (out is None or (_rows(a, out) and out.shape == a.shape))):
        act = torch.nn.functional.silu(a) * u
        act = act if g is None else act * g[:, None]
        return act if out is None else out.copy_(act)
    H, C = a.shape
    out = a.new_empty(H, C) if out is None else out
    if out.numel():
        kernel(f"mohge_silu_mul_{_SUFFIX[a.dtype]}", _P, _P, _I, _P, _P, _I, _I, _I)(
            a.data_ptr(), u.data_ptr(), a.stride(0), _ptr(g), out.data_ptr(), out.stride(0), H, C
        )
    return out


def silu_mul_backward(
    a: Tensor, u: Tensor, dact: Tensor, da: Tensor, du: Tensor, g: Tensor | None = None, dg: Tensor | None = None
) -> None:
    """The gradients of ``F.silu(a) * u * g[:, None]`` (g: 1 where not given) given ``dact``, written into ``da`` (g
    dact u SiLU'(a)), ``du`` (g dact SiLU(a)) and, where given, ``dg`` (one value a row: the sum over the row of
    SiLU(a) u dact): one pass of the kernel (in float) for fp32 or bf16 blocks of contiguous rows (a and u of one row
    stride, da and du of another; g and dg contiguous, of their dtype), torch's ops (aten's silu_backward) for anything
    else."""
    gs = tuple(t for t in (g, dg) if t is not None)
    strides = a.stride(0) == u.stride(0) and da.stride(0) == du.stride(0)
    if not (_rows(a, u, dact, da, du) and strides and _gates(a, *gs)):
        silu = torch.nn.functional.silu(a)
        if dg is not None:
            dg.copy_((silu * u * dact).sum(-1))
        scaled = dact if g is None else dact * g[:, None]
        torch.ops.aten.silu_backward.grad_input(scaled * u, a, grad_input=da)
        torch.mul(scaled, silu, out=du)
        return
    H, C = a.shape
    if a.numel():
        kernel(f"mohge_silu_mul_backward_{_SUFFIX[a.dtype]}", _P, _P, _I, _P, _I, _P, _P, _P, _I, _P, _I, _I)(
            a.data_ptr(), u.data_ptr(), a.stride(0), dact.data_ptr(), dact.stride(0), _ptr(g), da.data_ptr(),
            du.data_ptr(), da.stride(0), _ptr(dg), H, C,
        )  # fmt: skip
    elif dg is not None:
        dg.zero_()
