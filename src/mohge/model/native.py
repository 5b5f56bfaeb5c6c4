"""The fused path's kernels of our own on a CPU (``train.fused``), in C: the routers after their GEMMs, forward and
backward (:mod:`mohge.model.route_kernel`), their top-k where a router runs outside those (:mod:`mohge.model.topk`),
the experts' SiLU products (:func:`silu_mul`, :func:`silu_mul_backward`, fp32 and bf16, used by
:class:`mohge.model.fused._ClassSwiGLU` in fp32 and by the grouped path of :mod:`mohge.kernels.reference` in bf16) and
the head loss's softmax cross-entropy of a chunk's rows (:func:`softmax_xent_`, used by
:func:`mohge.model.fused.linear_cross_entropy`). The routers' kernels and the top-k run tokens in the lanes of
:data:`LANES_SOURCE`'s vector types, the loss and the fp32 SiLU products along each row.

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

LANES_SOURCE = r"""
/* Rows in vector lanes: LANES rows (tokens) at a time, one per lane of GCC's vector types, LANES the CPU's widest
   vector of floats (8 on AVX2: wider types are split into pieces that the compiler partly runs element by element,
   14x the router kernel's time measured on an AMD EPYC with AVX2). */
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
#define KMAX 8
extern "C" int64_t mohge_lanes() { return LANES; }
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
typedef float lane_f __attribute__((may_alias)); /* a lane of a vf in memory: (lane_f *)x + i * LANES + l */
static inline vf splat(float a) { return vf{} + a; }
static inline vi splati(int32_t a) { return vi{} + a; }
/* exp(x) in float: Cephes' polynomial after a reduction by ln 2, in arithmetic and selects only, so that the loops
   calling it vectorize (within 2 ulp of expf; arguments clamped to [-87.3, 88.7], where expf stays finite); F a float
   (exp_f32) or a vector of them (vexp) */
static inline int32_t to_int(float t) { return (int32_t)t; }
static inline vi to_int(vf t) { return __builtin_convertvector(t, vi); }
static inline float to_float(int32_t n) { return (float)n; }
static inline vf to_float(vi n) { return __builtin_convertvector(n, vf); }
static inline float as_float(int32_t n) { return __builtin_bit_cast(float, n); }
static inline vf as_float(vi n) { return (vf)n; }
template <class F>
static inline F exp_poly(F x) {
    const F lo = F{} + -87.33654475f, hi = F{} + 88.72283905f, half = F{} + 0.5f;
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;
    const F t = x * 1.44269504088896341f;
    const auto n = to_int(t + (t < 0.0f ? -half : half));
    const F fx = to_float(n);
    x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
    const F z = x * x;
    F y = F{} + 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    return y * as_float((n + 127) << 23);
}
static inline float exp_f32(float x) { return exp_poly(x); }
static inline vf vexp(vf x) { return exp_poly(x); }
static inline vf vsigmoid(vf x) { return splat(1.0f) / (1.0f + vexp(-x)); }
/* Top-k, lane by lane: the best k so far (b: keys, bv: values carried along, ix: their indices, -1 an empty slot),
   largest first; an entry (key x, value y, index xi) is pushed down the list with selects. Equal keys: the entry
   pushed first (the lower index) first; NaN below every number (read as -inf, then last among equals by index). */
static inline void clear_best(vf *b, vf *bv, vi *ix) {
    for (int j = 0; j < KMAX; ++j) {
        b[j] = bv[j] = splat(-INFINITY);
        ix[j] = splati(-1);
    }
}
static inline void push_down(vf *b, vf *bv, vi *ix, int64_t k, vf x, vf y, vi xi) {
    x = x == x ? x : splat(-INFINITY);
    for (int64_t j = 0; j < k; ++j) {
        const vi c = (x > b[j]) | (ix[j] < 0); /* an empty slot takes any entry */
        const vf bj = b[j], vj = bv[j];
        const vi ij = ix[j];
        b[j] = c ? x : bj;
        bv[j] = c ? y : vj;
        ix[j] = c ? xi : ij;
        x = c ? bj : x;
        y = c ? vj : y;
        xi = c ? ij : xi;
    }
}
static inline vf vload(const float *p) {
    vf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
#if LANES == 8
/* r[i][j] <- r[j][i]: an 8 x 8 block transposed in registers (unpacks within 128-bit halves, then across) */
static inline void transpose8(vf *r) {
    const vi lo32 = {0, 8, 1, 9, 4, 12, 5, 13}, hi32 = {2, 10, 3, 11, 6, 14, 7, 15};
    const vi lo64 = {0, 1, 8, 9, 4, 5, 12, 13}, hi64 = {2, 3, 10, 11, 6, 7, 14, 15};
    const vi lo128 = {0, 1, 2, 3, 8, 9, 10, 11}, hi128 = {4, 5, 6, 7, 12, 13, 14, 15};
    vf t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], lo32);
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi32);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = __builtin_shuffle(t[i], t[i + 2], lo64);
        u[i + 1] = __builtin_shuffle(t[i], t[i + 2], hi64);
        u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], lo64);
        u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi64);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = __builtin_shuffle(u[i], u[i + 4], lo128);
        r[i + 4] = __builtin_shuffle(u[i], u[i + 4], hi128);
    }
}
#endif
/* lane l of out[c] = rows[l][c] (c < cols, l < m; the other lanes `fill`): LANES rows of floats made columns, 8
   columns at a time through a transpose in registers where LANES is 8, element by element otherwise */
static inline void gather_rows(const float *const *rows, int64_t m, int64_t cols, vf *out, float fill) {
    int64_t c = 0;
#if LANES == 8
    for (; c + 8 <= cols; c += 8) {
        vf r[8];
        for (int l = 0; l < 8; ++l) r[l] = l < m ? vload(rows[l] + c) : splat(fill);
        transpose8(r);
        for (int j = 0; j < 8; ++j) out[c + j] = r[j];
    }
#endif
    lane_f *o = (lane_f *)out;
    for (; c < cols; ++c) {
        out[c] = splat(fill);
        for (int64_t l = 0; l < m; ++l) o[c * LANES + l] = rows[l][c];
    }
}
/* rows[l][c] = lane l of in[c] (c < cols, l < m): gather_rows' inverse */
static inline void scatter_rows(float *const *rows, int64_t m, int64_t cols, const vf *in) {
    int64_t c = 0;
#if LANES == 8
    for (; c + 8 <= cols; c += 8) {
        vf r[8];
        for (int j = 0; j < 8; ++j) r[j] = in[c + j];
        transpose8(r);
        for (int64_t l = 0; l < m; ++l) vstore(rows[l] + c, r[l]);
    }
#endif
    const lane_f *v = (const lane_f *)in;
    for (; c < cols; ++c)
        for (int64_t l = 0; l < m; ++l) rows[l][c] = v[c * LANES + l];
}
/* columns e0 .. e0 + cols of rows t0 .. t0 + m of v (row stride ld) as cols vectors of the rows' values, the lanes
   past the m rows set to `fill` */
static inline void load_block(const float *v, int64_t ld, int64_t t0, int64_t m, int64_t e0, int64_t cols, vf *out,
                              float fill) {
    const float *rows[LANES];
    for (int64_t l = 0; l < m; ++l) rows[l] = v + (t0 + l) * ld + e0;
    gather_rows(rows, m, cols, out, fill);
}
/* vectors in[c] (c < cols) into rows t0 .. t0 + m of x (row stride ld), lane l to row t0 + l */
static inline void store_block(float *x, int64_t ld, int64_t t0, int64_t m, int64_t cols, const vf *in) {
    float *rows[LANES];
    for (int64_t l = 0; l < m; ++l) rows[l] = x + (t0 + l) * ld;
    scatter_rows(rows, m, cols, in);
}
"""

TOPK_SOURCE = r"""
/* The indices [rows, k] of the k largest entries of each row of v ([rows, n] floats, row stride `stride`), largest
   first, as push_down ranks them; the columns read in tiles of TILE. */
#define TILE 64
extern "C" void mohge_topk_rows_f32(const float *v, int64_t rows, int64_t n, int64_t stride, int64_t k,
                                    int64_t *out) {
    vf b[KMAX], bv[KMAX], x[TILE];
    vi ix[KMAX];
    for (int64_t t0 = 0; t0 < rows; t0 += LANES) {
        const int64_t m = rows - t0 < LANES ? rows - t0 : LANES;
        clear_best(b, bv, ix);
        for (int64_t e0 = 0; e0 < n; e0 += TILE) {
            const int64_t cols = n - e0 < TILE ? n - e0 : TILE;
            load_block(v, stride, t0, m, e0, cols, x, -INFINITY);
            for (int64_t e = 0; e < cols; ++e) push_down(b, bv, ix, k, x[e], x[e], splati((int32_t)(e0 + e)));
        }
        for (int64_t l = 0; l < m; ++l)
            for (int64_t j = 0; j < k; ++j) out[(t0 + l) * k + j] = ix[j][l];
    }
}
"""

SILU_SOURCE = r"""
/* storage: float as is; bf16 (its 16 high bits) widened exactly, rounded to nearest even, NaN kept a NaN */
struct F32 {
    typedef float T;
    static constexpr bool vectors = true; /* rows run in vf vectors, their tails element by element */
    static inline float load(float v) { return v; }
    static inline float store(float f) { return f; }
};
struct BF16 {
    typedef uint16_t T;
    static constexpr bool vectors = false;
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
        int64_t j = 0;
        if constexpr (S::vectors)
            for (; j + LANES <= cols; j += LANES) {
                const vf x = vload(ar + j), s = splat(1.0f) / (1.0f + vexp(-x));
                vstore(o + j, x * s * vload(ur + j) * gi);
            }
        for (; j < cols; ++j) {
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
        if constexpr (S::vectors) { /* lane l of the accumulators: the row's elements j = l mod DOT_LANES, in order */
            vf accv[DOT_LANES / LANES] = {};
            for (; j + DOT_LANES <= cols; j += DOT_LANES)
                for (int c = 0; c < DOT_LANES / LANES; ++c) {
                    const int64_t jc = j + c * LANES;
                    const vf x = vload(ar + jc), s = splat(1.0f) / (1.0f + vexp(-x)), d = vload(dr + jc);
                    const vf y = vload(ur + jc);
                    accv[c] += x * s * y * d;
                    vstore(gu + jc, gi * d * x * s);
                    vstore(ga + jc, gi * d * y * s * (1.0f + x * (1.0f - s)));
                }
            __builtin_memcpy(acc, accv, sizeof acc);
        }
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

XENT_SOURCE = r"""
/* Softmax cross-entropy of rows of logits, in place: for each of the rows of z [rows, V] (row stride ldz) with target
   y, the row's loss log(sum(exp(z - max))) - (z[y] - max) is added to the returned sum (in double, row order), and
   the row is overwritten with its loss's gradient times `scale`: (softmax(z) - onehot(y)) * scale. Vectors of LANES
   floats along the row, its tail element by element. */
extern "C" double mohge_softmax_xent_f32(float *z, int64_t rows, int64_t V, int64_t ldz, const int64_t *y,
                                         float scale) {
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
        float *r = z + i * ldz;
        const int64_t body = V - V % LANES;
        vf vm = splat(-INFINITY);
        for (int64_t j = 0; j < body; j += LANES) {
            const vf v = vload(r + j);
            vm = v > vm ? v : vm;
        }
        float m = -INFINITY;
        for (int l = 0; l < LANES; ++l) m = vm[l] > m ? vm[l] : m;
        for (int64_t j = body; j < V; ++j) m = r[j] > m ? r[j] : m;
        const float zy = r[y[i]] - m;
        vf vs = {};
        for (int64_t j = 0; j < body; j += LANES) {
            const vf e = vexp(vload(r + j) - m);
            vstore(r + j, e);
            vs += e;
        }
        float s = 0.0f;
        for (int l = 0; l < LANES; ++l) s += vs[l];
        for (int64_t j = body; j < V; ++j) {
            r[j] = exp_f32(r[j] - m);
            s += r[j];
        }
        total += (double)(logf(s) - zy);
        const float k = scale / s;
        for (int64_t j = 0; j < body; j += LANES) vstore(r + j, vload(r + j) * k);
        for (int64_t j = body; j < V; ++j) r[j] *= k;
        r[y[i]] -= scale;
    }
    return total;
}
"""

COMBINE_SOURCE = r"""
/* The experts' combine by token and its gradients over rows of D floats (row-major, contiguous), along the row in
   vectors of LANES, the tail element by element; a token's K slots in slot order. */
static inline void axpy_row(float *__restrict y, const float *__restrict x, float a, int64_t D, bool first) {
    int64_t d = 0;
    const vf va = splat(a);
    for (; d + LANES <= D; d += LANES) vstore(y + d, first ? va * vload(x + d) : vload(y + d) + va * vload(x + d));
    for (; d < D; ++d) y[d] = first ? a * x[d] : y[d] + a * x[d];
}
/* y[t] = sum over k of g[t, k] out[row[t, k]]; with g none, the rows summed */
extern "C" void mohge_combine_f32(const float *out, const int64_t *row, const float *g, int64_t T, int64_t K,
                                  int64_t D, float *y) {
    for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) {
            const float *o = out + row[t * K + k] * D;
            if (g)
                axpy_row(y + t * D, o, g[t * K + k], D, k == 0);
            else {
                int64_t d = 0;
                float *yr = y + t * D;
                for (; d + LANES <= D; d += LANES) vstore(yr + d, k == 0 ? vload(o + d) : vload(yr + d) + vload(o + d));
                for (; d < D; ++d) yr[d] = k == 0 ? o[d] : yr[d] + o[d];
            }
        }
}
/* dout[p] = gate[p] dy[tok[p]] (0 where tok[p] >= T: a padding row), and dg[t, k] = out[row[t, k]] . dy[t] */
extern "C" void mohge_combine_backward_f32(const float *dy, const float *out, const int64_t *row, const int64_t *tok,
                                           const float *gate, int64_t T, int64_t K, int64_t P, int64_t D,
                                           float *dout, float *dg) {
    for (int64_t p = 0; p < P; ++p) {
        float *r = dout + p * D;
        if (tok[p] >= T)
            for (int64_t d = 0; d < D; ++d) r[d] = 0.0f;
        else
            axpy_row(r, dy + tok[p] * D, gate[p], D, true);
    }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) {
            const float *o = out + row[t * K + k] * D, *g = dy + t * D;
            vf acc = {};
            int64_t d = 0;
            for (; d + LANES <= D; d += LANES) acc += vload(o + d) * vload(g + d);
            float s = 0.0f;
            for (int l = 0; l < LANES; ++l) s += acc[l];
            for (; d < D; ++d) s += o[d] * g[d];
            dg[t * K + k] = s;
        }
}
"""

ATTENTION_SOURCE = r"""
/* Causal softmax attention over short windows (S <= AMAX_S tokens, head width Dh <= AMAX_D), scale 1/sqrt(Dh), LANES
   (window, head) problems at a time, one per lane (their rows moved in and out by gather_rows, scatter_rows): q, k, v
   [B, H, S, Dh] with the strides (b, h, s) of each, Dh contiguous; y [B, S, H, Dh] contiguous (the rows the output
   projection reads). Problem p = b H + h. */
#define AMAX_S 16
#define AMAX_D 32
struct AttnShape {
    int64_t B, H, S, D;
    int64_t q[3], k[3], v[3]; /* strides of b, h, s */
};
/* rows [S][D] of LANES problems p0.. of x (strides st), lanes past the last problem 0 */
static inline void load_heads(const float *x, const int64_t *st, const AttnShape &a, int64_t p0, int64_t m, vf *out) {
    const float *rows[LANES];
    for (int64_t s = 0; s < a.S; ++s) {
        for (int64_t l = 0; l < m; ++l) rows[l] = x + (p0 + l) / a.H * st[0] + (p0 + l) % a.H * st[1] + s * st[2];
        gather_rows(rows, m, a.D, out + s * a.D, 0.0f);
    }
}
/* probabilities P [S][S] (row i over keys j <= i; 0 above the diagonal) of the block's problems */
static inline void probabilities(const AttnShape &a, const vf *Q, const vf *K, float scale, vf *P) {
    for (int64_t i = 0; i < a.S; ++i) {
        vf mx = splat(-INFINITY), sum = {};
        for (int64_t j = 0; j <= i; ++j) {
            vf s = {};
            for (int64_t d = 0; d < a.D; ++d) s += Q[i * a.D + d] * K[j * a.D + d];
            P[i * AMAX_S + j] = s * scale;
            mx = P[i * AMAX_S + j] > mx ? P[i * AMAX_S + j] : mx;
        }
        for (int64_t j = 0; j <= i; ++j) {
            P[i * AMAX_S + j] = vexp(P[i * AMAX_S + j] - mx);
            sum += P[i * AMAX_S + j];
        }
        const vf r = splat(1.0f) / sum;
        for (int64_t j = 0; j <= i; ++j) P[i * AMAX_S + j] *= r;
    }
}
/* O's rows [S][D] from the lower-triangular W [S][AMAX_S] and rows X [S][D]: O_i = sum over j <= i of W_ij X_j, or
   (transposed) O_j = sum over i >= j of W_ij X_i; each sum in its index's order */
static inline void causal_product(const AttnShape &a, const vf *W, const vf *X, vf *O, bool transposed) {
    for (int64_t r = 0; r < a.S; ++r)
        for (int64_t d = 0; d < a.D; ++d) {
            vf acc = {};
            if (transposed)
                for (int64_t i = r; i < a.S; ++i) acc += W[i * AMAX_S + r] * X[i * a.D + d];
            else
                for (int64_t j = 0; j <= r; ++j) acc += W[r * AMAX_S + j] * X[j * a.D + d];
            O[r * a.D + d] = acc;
        }
}
extern "C" void mohge_short_attention_f32(const AttnShape *ap, const float *q, const float *k, const float *v,
                                          float *y) {
    const AttnShape a = *ap;
    const float scale = 1.0f / sqrtf((float)a.D);
    vf Q[AMAX_S * AMAX_D], K[AMAX_S * AMAX_D], V[AMAX_S * AMAX_D], P[AMAX_S * AMAX_S];
    const int64_t problems = a.B * a.H;
    for (int64_t p0 = 0; p0 < problems; p0 += LANES) {
        const int64_t m = problems - p0 < LANES ? problems - p0 : LANES;
        load_heads(q, a.q, a, p0, m, Q);
        load_heads(k, a.k, a, p0, m, K);
        load_heads(v, a.v, a, p0, m, V);
        probabilities(a, Q, K, scale, P);
        causal_product(a, P, V, Q, false); /* y_i = sum_j P_ij v_j, into Q's rows (read no more) */
        float *rows[LANES];
        for (int64_t i = 0; i < a.S; ++i) {
            for (int64_t l = 0; l < m; ++l) rows[l] = y + (((p0 + l) / a.H * a.S + i) * a.H + (p0 + l) % a.H) * a.D;
            scatter_rows(rows, m, a.D, Q + i * a.D);
        }
    }
}
/* Its gradients dq, dk, dv [B, H, S, Dh] (contiguous) given dy [B, S, H, Dh] (contiguous), P recomputed:
   dv_j = sum_i P_ij dy_i; dP_ij = dy_i . v_j; dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') scale; dq_i = sum_j dS_ij k_j;
   dk_j = sum_i dS_ij q_i. */
static inline void store_heads(float *x, const AttnShape &a, int64_t p0, int64_t m, const vf *in) {
    store_block(x, a.S * a.D, p0, m, a.S * a.D, in);
}
extern "C" void mohge_short_attention_backward_f32(const AttnShape *ap, const float *q, const float *k, const float *v,
                                                   const float *dy, float *dq, float *dk, float *dv) {
    const AttnShape a = *ap;
    const int64_t S = a.S, D = a.D;
    const float scale = 1.0f / sqrtf((float)D);
    vf Q[AMAX_S * AMAX_D], K[AMAX_S * AMAX_D], V[AMAX_S * AMAX_D], G[AMAX_S * AMAX_D], P[AMAX_S * AMAX_S];
    vf dP[AMAX_S * AMAX_S], O[AMAX_S * AMAX_D];
    const int64_t problems = a.B * a.H;
    const int64_t gst[3] = {S * a.H * D, D, a.H * D};
    for (int64_t p0 = 0; p0 < problems; p0 += LANES) {
        const int64_t m = problems - p0 < LANES ? problems - p0 : LANES;
        load_heads(q, a.q, a, p0, m, Q);
        load_heads(k, a.k, a, p0, m, K);
        load_heads(v, a.v, a, p0, m, V);
        load_heads(dy, gst, a, p0, m, G);
        probabilities(a, Q, K, scale, P);
        for (int64_t i = 0; i < S; ++i) {
            vf dot = {};
            for (int64_t j = 0; j <= i; ++j) {
                vf acc = {};
                for (int64_t d = 0; d < D; ++d) acc += G[i * D + d] * V[j * D + d];
                dP[i * AMAX_S + j] = acc;
                dot += P[i * AMAX_S + j] * acc;
            }
            for (int64_t j = 0; j <= i; ++j)
                dP[i * AMAX_S + j] = P[i * AMAX_S + j] * (dP[i * AMAX_S + j] - dot) * scale;
        }
        causal_product(a, P, G, O, true); /* dv */
        store_heads(dv, a, p0, m, O);
        causal_product(a, dP, K, O, false); /* dq */
        store_heads(dq, a, p0, m, O);
        causal_product(a, dP, Q, O, true); /* dk */
        store_heads(dk, a, p0, m, O);
    }
}
"""

ROUTE_SOURCE = r"""
/* MoHGE's router after its two GEMMs (docs/method.md §2, G2-E6), LANES tokens at a time: the group logits lg [T, G]
   (row stride ldg) and the expert logits le [T, E = G n] (row stride lde) in, the selected experts idx [T, K] (largest
   first), their gates [T, K] and the selected-group map gmap [T, G] out. Group scores: sigmoid (normalised over the
   selected groups where Kg > 1) or a softmax over the selected groups; the combined scores c = softmax within each
   group x its group's weight, renormalised; the experts' top-K among the selected groups (with eb: of c + eb; the
   gates read c), ranked by push_down; gates: a softmax of the top-K values, or the values renormalised. */
#define RGMAX 64
#define REMAX 256
#define RNMAX 64
struct RouteShape {
    int64_t T, G, n, Kg, K, ldg, lde;
    int32_t softmax_groups, renorm_gates;
};
/* a block's selection masks m [G] and group weights p [G] (0 off the selected groups) from its group logits lg and
   the selected groups gi [Kg] */
static inline void group_weights(const RouteShape &s, const vf *lg, const vi *gi, vi *m, vf *p) {
    vf top = splat(-INFINITY), den = {};
    for (int64_t g = 0; g < s.G; ++g) {
        vi sel = {};
        for (int64_t j = 0; j < s.Kg; ++j) sel |= gi[j] == (int32_t)g;
        m[g] = sel;
        top = (sel & (lg[g] > top)) ? lg[g] : top;
    }
    for (int64_t g = 0; g < s.G; ++g) {
        const vf w = s.softmax_groups ? vexp(lg[g] - top) : vsigmoid(lg[g]);
        p[g] = m[g] ? w : splat(0.0f);
        den += p[g];
    }
    if (s.softmax_groups || s.Kg > 1) {
        den += s.softmax_groups ? 0.0f : 1e-20f;
        for (int64_t g = 0; g < s.G; ++g) p[g] = p[g] / den;
    }
}
/* q [E] = the softmax of le within each group, and the sum of u = q p */
static inline vf combined(const RouteShape &s, const vf *le, const vf *p, vf *q) {
    vf usum = {};
    for (int64_t g = 0; g < s.G; ++g) {
        const vf *lr = le + g * s.n;
        vf *qr = q + g * s.n;
        vf mx = splat(-INFINITY), sum = {};
        for (int64_t j = 0; j < s.n; ++j) mx = lr[j] > mx ? lr[j] : mx;
        for (int64_t j = 0; j < s.n; ++j) {
            qr[j] = vexp(lr[j] - mx);
            sum += qr[j];
        }
        for (int64_t j = 0; j < s.n; ++j) {
            qr[j] = qr[j] / sum;
            usum += qr[j] * p[g];
        }
    }
    return usum;
}
extern "C" void mohge_grouped_route_f32(const RouteShape *sp, const float *lg_in, const float *le_in, const float *gb,
                                        const float *eb, int64_t *idx, float *gates, uint8_t *gmap) {
    const RouteShape s = *sp;
    const int64_t E = s.G * s.n;
    vf lg[RGMAX], p[RGMAX], le[REMAX], q[REMAX], b[KMAX], bv[KMAX];
    vi m[RGMAX], ix[KMAX];
    for (int64_t t0 = 0; t0 < s.T; t0 += LANES) {
        const int64_t mlanes = s.T - t0 < LANES ? s.T - t0 : LANES;
        load_block(lg_in, s.ldg, t0, mlanes, 0, s.G, lg, 0.0f);
        load_block(le_in, s.lde, t0, mlanes, 0, E, le, 0.0f);
        clear_best(b, bv, ix);
        for (int64_t g = 0; g < s.G; ++g) {
            const vf key = gb ? lg[g] + gb[g] : lg[g];
            push_down(b, bv, ix, s.Kg, key, key, splati((int32_t)g));
        }
        group_weights(s, lg, ix, m, p);
        const vf usum = combined(s, le, p, q);
        clear_best(b, bv, ix);
        for (int64_t e = 0; e < E; ++e) {
            const int64_t g = e / s.n;
            const vf c = q[e] * p[g] / usum;
            const vf key = m[g] ? (eb ? c + eb[e] : c) : splat(-INFINITY);
            push_down(b, bv, ix, s.K, key, c, splati((int32_t)e));
        }
        const vf top = bv[0];
        vf den = {};
        for (int64_t j = 0; j < s.K; ++j) {
            bv[j] = s.renorm_gates ? bv[j] : vexp(bv[j] - top);
            den += bv[j];
        }
        for (int64_t j = 0; j < s.K; ++j) bv[j] = bv[j] / den;
        for (int64_t l = 0; l < mlanes; ++l) {
            for (int64_t j = 0; j < s.K; ++j) {
                idx[(t0 + l) * s.K + j] = ix[j][l];
                gates[(t0 + l) * s.K + j] = bv[j][l];
            }
            for (int64_t g = 0; g < s.G; ++g) gmap[(t0 + l) * s.G + g] = m[g][l] != 0;
        }
    }
}
/* The gradients of the gates with respect to lg and le given dgates [T, K] (dlg, dle: [T, G], [T, E], contiguous),
   from the forward's idx, gates and gmap, its quantities recomputed: d(gates)/d(top values) (softmax or
   renormalisation), the top values' gradient scattered to their experts, through the renormalisation of c, the
   product q p, the softmax within each group and the group weights. Unselected groups and experts get 0. */
extern "C" void mohge_grouped_route_backward_f32(const RouteShape *sp, const float *lg_in, const float *le_in,
                                                 const int64_t *idx, const float *gates, const uint8_t *gmap,
                                                 const float *dgates, float *dlg, float *dle) {
    const RouteShape s = *sp;
    const int64_t E = s.G * s.n;
    vf lg[RGMAX], p[RGMAX], dp[RGMAX], le[REMAX], q[REMAX], dc[REMAX], dq[RNMAX];
    vi m[RGMAX], gi[KMAX];
    for (int64_t t0 = 0; t0 < s.T; t0 += LANES) {
        const int64_t mlanes = s.T - t0 < LANES ? s.T - t0 : LANES;
        load_block(lg_in, s.ldg, t0, mlanes, 0, s.G, lg, 0.0f);
        load_block(le_in, s.lde, t0, mlanes, 0, E, le, 0.0f);
        for (int j = 0; j < KMAX; ++j) gi[j] = splati(-1);
        for (int64_t l = 0; l < LANES; ++l) /* the selected groups, from the map (their order does not matter) */
            for (int64_t g = 0, j = 0; g < s.G && j < s.Kg; ++g)
                if (l < mlanes ? gmap[(t0 + l) * s.G + g] != 0 : g < s.Kg) gi[j++][l] = (int32_t)g;
        group_weights(s, lg, gi, m, p);
        const vf usum = combined(s, le, p, q);
        /* the top values v = c[idx] and their gradient dv from the gates', scattered into dc */
        for (int64_t e = 0; e < E; ++e) dc[e] = vf{};
        vf cdot = {};
        for (int64_t l = 0; l < mlanes; ++l) {
            const int64_t *ir = idx + (t0 + l) * s.K;
            const float *gr = gates + (t0 + l) * s.K, *dr = dgates + (t0 + l) * s.K;
            float v[KMAX], vsum = 0.0f, gdot = 0.0f, vdot = 0.0f;
            for (int64_t j = 0; j < s.K; ++j) {
                v[j] = q[ir[j]][l] * p[ir[j] / s.n][l] / usum[l];
                vsum += v[j];
                gdot += dr[j] * gr[j];
            }
            for (int64_t j = 0; j < s.K; ++j) {
                const float dv = s.renorm_gates ? (dr[j] - gdot) / vsum : gr[j] * (dr[j] - gdot);
                dc[ir[j]][l] += dv;
                vdot += dv * v[j];
            }
            cdot[l] = vdot;
        }
        /* c = u / sum(u), u = q p: du = (dc - sum(dc c)) / sum(u); dq = du p, dp_g = the sum over g of du q; then
           through the softmax within each group */
        for (int64_t g = 0; g < s.G; ++g) {
            vf *qr = q + g * s.n, *dr = dc + g * s.n;
            vf dpg = {}, qdot = {};
            for (int64_t j = 0; j < s.n; ++j) {
                const vf du = (dr[j] - cdot) / usum;
                dpg += du * qr[j];
                dq[j] = du * p[g];
                qdot += dq[j] * qr[j];
            }
            dp[g] = dpg;
            for (int64_t j = 0; j < s.n; ++j) dr[j] = qr[j] * (dq[j] - qdot);
        }
        /* the group weights: a softmax over the selected groups, or sigmoids (normalised where Kg > 1) */
        vf pdot = {}, den = {};
        for (int64_t g = 0; g < s.G; ++g) {
            pdot += dp[g] * p[g];
            if (!s.softmax_groups) den += m[g] ? vsigmoid(lg[g]) : splat(0.0f);
        }
        for (int64_t g = 0; g < s.G; ++g) {
            vf d;
            if (s.softmax_groups) {
                d = p[g] * (dp[g] - pdot);
            } else {
                const vf sg = vsigmoid(lg[g]);
                const vf ds = s.Kg > 1 ? (dp[g] - pdot) / (den + 1e-20f) : dp[g];
                d = ds * sg * (1.0f - sg);
            }
            dp[g] = m[g] ? d : splat(0.0f);
        }
        store_block(dlg, s.G, t0, mlanes, s.G, dp);
        store_block(dle, E, t0, mlanes, E, dc);
    }
}
/* The flat router of the baselines (moe, hmoe, modse) after its GEMM, LANES tokens at a time: the logits le [T, E]
   (row stride lde) in; the top-K experts idx [T, K] of the logits (ranked by push_down), the dense probabilities
   probs [T, E] = softmax(le) and the gates [T, K] out: a softmax of the top-K logits, or (probs_gate) of their
   probabilities. */
extern "C" void mohge_flat_route_f32(const float *le_in, int64_t T, int64_t E, int64_t lde, int64_t K,
                                     int32_t probs_gate, int64_t *idx, float *gates, float *probs) {
    vf le[REMAX], b[KMAX], bv[KMAX];
    vi ix[KMAX];
    for (int64_t t0 = 0; t0 < T; t0 += LANES) {
        const int64_t mlanes = T - t0 < LANES ? T - t0 : LANES;
        load_block(le_in, lde, t0, mlanes, 0, E, le, 0.0f);
        vf mx = splat(-INFINITY), sum = {};
        for (int64_t e = 0; e < E; ++e) mx = le[e] > mx ? le[e] : mx;
        clear_best(b, bv, ix);
        for (int64_t e = 0; e < E; ++e) push_down(b, bv, ix, K, le[e], le[e], splati((int32_t)e));
        for (int64_t e = 0; e < E; ++e) {
            const vf q = vexp(le[e] - mx);
            le[e] = q;
            sum += q;
        }
        for (int64_t e = 0; e < E; ++e) le[e] = le[e] / sum;
        if (probs_gate)
            for (int64_t j = 0; j < K; ++j)
                for (int64_t l = 0; l < mlanes; ++l) bv[j][l] = le[ix[j][l]][l];
        const vf top = bv[0];
        vf den = {};
        for (int64_t j = 0; j < K; ++j) {
            bv[j] = vexp(bv[j] - top);
            den += bv[j];
        }
        for (int64_t l = 0; l < mlanes; ++l)
            for (int64_t j = 0; j < K; ++j) {
                idx[(t0 + l) * K + j] = ix[j][l];
                gates[(t0 + l) * K + j] = bv[j][l] / den[l];
            }
        store_block(probs, E, t0, mlanes, E, le);
    }
}
/* Its gradient with respect to le given dgates [T, K] and dprobs [T, E] (or none: 0), from its outputs idx, gates and
   probs: the gates' softmax backward to the top-K logits (or to their probabilities, added to dprobs), then the
   probabilities' softmax backward; dle [T, E] contiguous. */
extern "C" void mohge_flat_route_backward_f32(int64_t T, int64_t E, int64_t K, int32_t probs_gate, const int64_t *idx,
                                              const float *gates, const float *probs, const float *dgates,
                                              const float *dprobs, float *dle) {
    vf p[REMAX], dp[REMAX], dl[REMAX];
    for (int64_t t0 = 0; t0 < T; t0 += LANES) {
        const int64_t mlanes = T - t0 < LANES ? T - t0 : LANES;
        load_block(probs, E, t0, mlanes, 0, E, p, 0.0f);
        if (dprobs)
            load_block(dprobs, E, t0, mlanes, 0, E, dp, 0.0f);
        else
            for (int64_t e = 0; e < E; ++e) dp[e] = vf{};
        for (int64_t e = 0; e < E; ++e) dl[e] = vf{};
        for (int64_t l = 0; l < mlanes; ++l) {
            const int64_t *ir = idx + (t0 + l) * K;
            const float *gr = gates + (t0 + l) * K, *dr = dgates + (t0 + l) * K;
            float gdot = 0.0f;
            for (int64_t j = 0; j < K; ++j) gdot += dr[j] * gr[j];
            for (int64_t j = 0; j < K; ++j) {
                const float dv = gr[j] * (dr[j] - gdot);
                if (probs_gate)
                    dp[ir[j]][l] += dv;
                else
                    dl[ir[j]][l] += dv;
            }
        }
        vf pdot = {};
        for (int64_t e = 0; e < E; ++e) pdot += dp[e] * p[e];
        for (int64_t e = 0; e < E; ++e) dl[e] += p[e] * (dp[e] - pdot);
        store_block(dle, E, t0, mlanes, E, dl);
    }
}
"""

SOURCE = "#include <cmath>\n#include <cstdint>\n" + "".join(
    (LANES_SOURCE, TOPK_SOURCE, SILU_SOURCE, XENT_SOURCE, COMBINE_SOURCE, ATTENTION_SOURCE, ROUTE_SOURCE)
)
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
def kernel(name: str, *argtypes: type, restype: type | None = None) -> ctypes._CFuncPtr:
    """The function ``name`` of :func:`library`, with its argument types and its result's (none by default); looked
    up and typed once, as it is called per expert and step."""
    fn = getattr(library(), name)
    fn.argtypes = list(argtypes)
    fn.restype = restype
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


def unit_stride(t: Tensor) -> Tensor:
    """``t`` with its last dim contiguous (a copy only where it is not): what the kernels read as runs of floats."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


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


def softmax_xent_(z: Tensor, y: Tensor, scale: float) -> float:
    """The summed softmax cross-entropy of the rows of the fp32 CPU logits ``z`` [rows, V] (contiguous rows) against
    the targets ``y`` (int64 [rows]), as a float; ``z`` is overwritten with the losses' gradients times ``scale``,
    (softmax(z) - onehot(y)) * scale: one kernel pass a row."""
    rows, V = z.shape
    if z.dtype != torch.float32 or z.device.type != "cpu" or z.stride(1) != 1 or y.shape != (rows,):
        raise ValueError(f"softmax_xent_: fp32 CPU rows [rows, V] and int64 targets [rows]: {z.shape}, {y.shape}")
    y = y.to(torch.int64).contiguous()
    if rows and not 0 <= int(y.min()) <= int(y.max()) < V:
        raise IndexError(f"softmax_xent_: a target outside [0, {V}): {int(y.min())} .. {int(y.max())}")
    fn = kernel("mohge_softmax_xent_f32", _P, _I, _I, _I, _P, ctypes.c_float, restype=ctypes.c_double)
    return fn(z.data_ptr(), rows, V, z.stride(0), y.data_ptr(), scale) if rows else 0.0


def _fp32_rows(*ts: Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in ts)


def combine(out_PD: Tensor, row_TK: Tensor, gates_TK: Tensor | None) -> Tensor | None:
    """[T, D]: y[t] = the sum over a token's slots k, in slot order, of gates[t, k] out[row[t, k]] (gates None: the rows
    summed), one kernel pass; None where the tensors are not contiguous fp32 CPU rows with int64 slots (the caller
    computes it otherwise)."""
    gs = () if gates_TK is None else (gates_TK,)
    if not (_fp32_rows(out_PD, *gs) and row_TK.dtype == torch.int64 and row_TK.is_contiguous()):
        return None
    (T, K), D = row_TK.shape, out_PD.shape[1]
    y = out_PD.new_empty(T, D)
    if T:
        kernel("mohge_combine_f32", _P, _P, _P, _I, _I, _I, _P)(
            out_PD.data_ptr(), row_TK.data_ptr(), _ptr(gates_TK if gs else None), T, K, D, y.data_ptr()
        )
    return y


def combine_backward(
    dy_TD: Tensor, out_PD: Tensor, row_TK: Tensor, tok_P: Tensor, gate_P: Tensor
) -> tuple[Tensor, Tensor] | None:
    """The gradients of :func:`combine`: (dout [P, D]: gate[p] dy[tok[p]], 0 on a padding row, tok[p] = T; dgates
    [T, K]: out[row[t, k]] . dy[t]), one kernel pass each; None where the tensors are not contiguous fp32 CPU rows with
    int64 indices."""
    ints = all(t.dtype == torch.int64 and t.is_contiguous() for t in (row_TK, tok_P))
    if not (_fp32_rows(dy_TD, out_PD, gate_P) and ints):
        return None
    (T, K), (P, D) = row_TK.shape, out_PD.shape
    dout, dgates = out_PD.new_empty(P, D), out_PD.new_empty(T, K)
    if P or T:
        kernel("mohge_combine_backward_f32", _P, _P, _P, _P, _P, _I, _I, _I, _I, _P, _P)(
            dy_TD.data_ptr(), out_PD.data_ptr(), row_TK.data_ptr(), tok_P.data_ptr(), gate_P.data_ptr(), T, K, P, D,
            dout.data_ptr(), dgates.data_ptr(),
        )  # fmt: skip
    return dout, dgates


@functools.cache
def lanes() -> int:
    """The floats in the vectors the kernels were built with (``LANES``: 8 with AVX2, 16 with AVX-512)."""
    return int(kernel("mohge_lanes", restype=ctypes.c_int64)())
