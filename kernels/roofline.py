"""What a GPU measurement of the expert kernels means against the machine and the public anchors.

The kernel benchmark (:mod:`mohge.kernels.bench`) measures milliseconds and TFLOP/s; this module puts them against
the device: the share of its dense bf16 peak (looked up by device name; the 2:4-sparsity figures of datasheets are
twice these), the bars a fine-grained MoE layer is held to (15 % floor, 25 % good, 40 % state of the art, from
``torch._grouped_mm`` at fine-grained MoE shapes, 18-24 % on an H100, and the best public Triton fused MoE, about
40 %), the ratio of each MoHGE path to a homogeneous ``grouped_mm`` layer of equal FLOPs (goal >= 0.8), and a
decode-shape run's bandwidth as a share of the device's HBM bandwidth. Pure functions of the rows: tested on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

# dense (no sparsity) bf16 tensor-core peak, TFLOP/s, and HBM bandwidth, GB/s, by the name torch reports
DEVICES = (  # (substring of torch.cuda.get_device_name(), peak bf16 TFLOP/s, HBM GB/s)
    ("H200", 989.0, 4800.0),
    ("H100", 989.0, 3350.0),
    ("A100", 312.0, 2039.0),
)
BARS = (("state of the art", 0.40), ("good", 0.25), ("floor", 0.15))
HOMOGENEOUS = "hom_grouped_mm"  # the reference path: one grouped_mm over experts of one width, equal FLOPs
MM = "mm"  # the roofline: plain torch.mm at the layer's own M, N, K, measured in the same run
RATIO_GOAL = 0.8


def device_peak(name: str) -> tuple[float | None, float | None]:
    """(dense bf16 peak TFLOP/s, HBM GB/s) of the device called ``name``; (None, None) for one not in DEVICES."""
    for key, tflops, gbps in DEVICES:
        if key.lower() in name.lower():
            return tflops, gbps
    return None, None


def bar_met(share: float | None) -> str:
    """The highest bar a share of peak meets ('below the floor' under 15 %, '' when the peak is unknown)."""
    if share is None:
        return ""
    return next((name for name, at in BARS if share >= at), "below the floor")


def annotate(rows: Iterable[dict]) -> list[dict]:
    """Rows of the benchmark (device, T, path, pass, ms, tflops; decode rows also bytes) with the columns
    peak_tflops, share_of_peak, bar, ratio_to_homogeneous (TFLOP/s of the path / that of ``hom_grouped_mm`` at the
    same T and pass), mm_tflops and share_of_mm (the ``mm`` roofline's TFLOP/s at the same T and pass, and the path's
    share of it), and for decode rows gbps and share_of_hbm."""
    rows = [dict(r) for r in rows]
    hom = {(r["T"], r["pass"]): r["tflops"] for r in rows if r["path"] == HOMOGENEOUS}
    mm = {(r["T"], r["pass"]): r["tflops"] for r in rows if r["path"] == MM}
    for r in rows:
        peak, hbm = device_peak(r["device"])
        share = r["tflops"] / peak if peak else None
        ref, roof = hom.get((r["T"], r["pass"])), mm.get((r["T"], r["pass"]))
        r.update(
            peak_tflops=peak,
            share_of_peak=share,
            bar=bar_met(share),
            ratio_to_homogeneous=r["tflops"] / ref if ref else None,
            mm_tflops=roof,
            share_of_mm=r["tflops"] / roof if roof else None,
        )
        if "bytes" in r:
            r["gbps"] = r["bytes"] / r["ms"] / 1e6
            r["share_of_hbm"] = r["gbps"] / hbm if hbm else None
    return rows


def summary(rows: list[dict]) -> list[str]:
    """One line per MoHGE path and pass at the largest T: TFLOP/s, share of peak, bar, ratio to the homogeneous
    layer against its goal, share of the ``mm`` roofline; one line per decode row: bandwidth and its share of HBM
    (the roofline's decode row: its TFLOP/s)."""
    lines = []
    big = max((r["T"] for r in rows if r["pass"] != "decode"), default=None)
    for r in rows:
        roof = f", {r['share_of_mm']:.0%} of the torch.mm roofline" if r.get("share_of_mm") is not None else ""
        if r["pass"] == "decode" and "gbps" in r:
            share = f"{r['share_of_hbm']:.0%} of HBM" if r.get("share_of_hbm") is not None else "HBM unknown"
            lines.append(f"decode T={r['T']} {r['path']}: {r['gbps']:.0f} GB/s, {share}{roof}")
        elif r["pass"] == "decode":
            lines.append(f"decode T={r['T']} {r['path']}: {r['tflops']:.1f} TFLOP/s")
        elif r["T"] == big and r["path"] not in (HOMOGENEOUS, "dense", MM):
            known = r["share_of_peak"] is not None
            share = f"{r['share_of_peak']:.1%} of peak ({r['bar']})" if known else "peak unknown"
            ratio = r["ratio_to_homogeneous"]
            vs = f", {ratio:.2f}x the homogeneous layer (goal >= {RATIO_GOAL})" if ratio is not None else ""
            lines.append(f"T={r['T']} {r['path']} {r['pass']}: {r['tflops']:.1f} TFLOP/s, {share}{vs}{roof}")
    return lines
