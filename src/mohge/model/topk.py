"""The routers' top-k over short rows on a CPU, for the fused path (``train.fused``): a kernel of our own.

A router picks the top k of a few entries per token (4 of 8 groups and 4 of 32 experts at the capacity study's
sizes). ATen's top-k sorts each row partially, about 300 ns a row on one thread: a fifth of a d_model 32 step's
forward. :func:`top_k` on the fused path runs a C kernel instead (:data:`SOURCE`), which keeps the best k of 16 rows
at a time in vector lanes, without a branch per element (its time against ATen's: ``mohge bench topk``,
docs/speed.md).

It is built on first use with the C++ compiler the fused path already needs (``$CXX``, else ``g++``: the one
torch.compile builds its CPU graphs with, :func:`mohge.config.preflight.cpp_compiler`), for this CPU
(``-march=native``), once per source, compiler and CPU, into a cache folder (``$MOHGE_NATIVE_CACHE``, else one per
user in the temporary folder), and called through ctypes as the custom op ``mohge::topk_indices``: a graph compiled
by torch.compile holds it as one opaque call. The indices are ATen's wherever a row has no two equal values among its
top k + 1; equal values rank the lower index first (ATen's order among them is unspecified), NaN below every number.
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

MAX_K = 8  # the kernel's register budget: k of 1 to 8 (a router's k; more falls back to ATen)

SOURCE = r"""
#include <cmath>
#include <cstdint>
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
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-x", "c++")


def cache_dir() -> Path:
    """Where the built kernel is kept: ``$MOHGE_NATIVE_CACHE``, else ``mohge_native_<uid>`` in the temporary folder."""
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
    """The kernel built with the compiler ``cxx`` for this CPU: the cached library, or a new one (compiled to a
    file of its own, then renamed into place whole, so processes building at once never read a partial one)."""
    path = shutil.which(cxx)
    if path is None:
        raise RuntimeError(f"train.fused: the C++ compiler {cxx!r} ($CXX, else g++) is not on the PATH")
    key = hashlib.sha256("\0".join([SOURCE, path, *FLAGS, _cpu()]).encode()).hexdigest()[:20]
    lib = cache_dir() / f"topk_{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    src = lib.with_name(f"topk_{key}.{os.getpid()}.cpp")
    tmp = lib.with_name(f"topk_{key}.{os.getpid()}.so.tmp")
    src.write_text(SOURCE, encoding="utf-8")
    try:
        proc = subprocess.run([path, *FLAGS, str(src), "-o", str(tmp)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(
                f"train.fused: building the routers' top-k kernel with {path} failed "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            )
        os.replace(tmp, lib)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return lib


@functools.cache
def _kernel() -> ctypes._CFuncPtr:
    fn = ctypes.CDLL(str(build(os.environ.get("CXX") or "g++"))).mohge_topk_rows_f32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = None
    return fn


@torch.library.custom_op("mohge::topk_indices", mutates_args=())
def topk_indices(v: Tensor, k: int) -> Tensor:
    """The indices [rows, k] of the k largest entries of each row of the 2-D CPU tensor ``v``, largest first."""
    rows, n = v.shape
    if v.device.type != "cpu" or not 1 <= k <= min(MAX_K, n):
        raise ValueError(f"topk_indices: a CPU tensor [rows, n] and 1 <= k <= min({MAX_K}, n), got {v.shape} and {k}")
    v = v.float()
    if v.stride(1) != 1:
        v = v.contiguous()
    out = torch.empty(rows, k, dtype=torch.int64)
    if rows:
        _kernel()(v.data_ptr(), rows, n, v.stride(0), k, out.data_ptr())
    return out


@topk_indices.register_fake
def _(v: Tensor, k: int) -> Tensor:
    return v.new_empty(v.shape[0], k, dtype=torch.int64)


def top_k(v_TE: Tensor, k: int, native: bool) -> tuple[Tensor, Tensor]:
    """``torch.topk(v, k, dim=-1)`` as (values, indices): where ``native`` (the fused path) and ``v`` is a 2-D CPU
    tensor with k <= :data:`MAX_K`, the indices from the kernel and the values gathered at them (their gradient is
    top-k's); ATen's top-k anywhere else."""
    if not native or v_TE.device.type != "cpu" or v_TE.dim() != 2 or not 1 <= k <= min(MAX_K, v_TE.shape[1]):
        values, indices = torch.topk(v_TE, k, dim=-1)
        return values, indices
    idx_TK = topk_indices(v_TE.detach(), k)
    return v_TE.gather(1, idx_TK), idx_TK
