"""The GPU kernel check's columns against the machine (mohge.kernels.roofline), computed on a CPU from synthetic
rows: the peak lookup by device name, the share of peak and the bar it meets, the ratio to the homogeneous layer
of equal FLOPs, and a decode row's bandwidth against the device's HBM."""

import pytest
import torch
from mohge.kernels import bench
from mohge.kernels.roofline import HOMOGENEOUS, annotate, bar_met, device_peak, summary


def test_the_dense_bf16_peak_and_hbm_bandwidth_are_looked_up_by_device_name():
    assert device_peak("NVIDIA H200") == (989.0, 4800.0)
    assert device_peak("NVIDIA H100 80GB HBM3") == (989.0, 3350.0)  # dense, not the 2:4-sparsity 1979
    assert device_peak("NVIDIA A100-SXM4-80GB")[0] == 312.0
    assert device_peak("Some Future GPU") == (None, None)


BARS = [(0.10, "below the floor"), (0.15, "floor"), (0.3, "good"), (0.4, "state of the art"), (None, "")]


@pytest.mark.parametrize(("share", "bar"), BARS)
def test_each_share_of_peak_meets_the_highest_bar_it_reaches(share, bar):
    assert bar_met(share) == bar


def test_rows_gain_share_of_peak_ratio_to_the_homogeneous_layer_and_decode_bandwidth():
    dev = "NVIDIA H200"
    rows = [
        {"device": dev, "T": 4096, "path": "triton", "pass": "fwd+bwd", "ms": 1.0, "tflops": 296.7},
        {"device": dev, "T": 4096, "path": HOMOGENEOUS, "pass": "fwd+bwd", "ms": 1.0, "tflops": 370.9},
        {"device": dev, "T": 64, "path": "triton", "pass": "decode", "ms": 0.01, "tflops": 5.0, "bytes": 24_000_000},
    ]
    out = {(r["path"], r["pass"]): r for r in annotate(rows)}
    tri = out[("triton", "fwd+bwd")]
    assert tri["share_of_peak"] == pytest.approx(296.7 / 989) and tri["bar"] == "good"
    assert tri["ratio_to_homogeneous"] == pytest.approx(0.8, abs=1e-3)
    dec = out[("triton", "decode")]
    assert dec["gbps"] == pytest.approx(2400.0) and dec["share_of_hbm"] == pytest.approx(0.5)
    assert set(bench.CSV_COLUMNS) >= set(tri) - {"device"} | {"share_of_peak", "bar", "ratio_to_homogeneous"}
    lines = summary(annotate(rows))
    assert any("30.0% of peak (good), 0.80x the homogeneous layer (goal >= 0.8)" in line for line in lines), lines
    assert any("2400 GB/s, 50% of HBM" in line for line in lines), lines


def test_a_decode_step_reads_the_weights_of_every_expert_routed_once():
    idx = torch.tensor([[0, 1], [1, 63]])  # experts 0 and 1 (widths[0]) and 63 (widths[-1])
    want = (2 * 3 * bench.WIDTHS[0] + 3 * bench.WIDTHS[-1]) * bench.D_MODEL * 2
    assert bench.decode_bytes(idx, itemsize=2) == want


def test_every_row_reports_its_share_of_the_torch_mm_roofline_of_the_same_T_and_pass():
    dev = "NVIDIA H100 80GB HBM3"
    rows = [
        {"device": dev, "T": 4096, "path": "triton", "pass": "fwd+bwd", "ms": 1.0, "tflops": 200.0},
        {"device": dev, "T": 4096, "path": "mm", "pass": "fwd+bwd", "ms": 1.0, "tflops": 500.0},
        {"device": dev, "T": 4096, "path": "triton", "pass": "fwd", "ms": 1.0, "tflops": 100.0},
        {"device": dev, "T": 64, "path": "triton", "pass": "decode", "ms": 0.01, "tflops": 5.0, "bytes": 24_000_000},
        {"device": dev, "T": 64, "path": "mm", "pass": "decode", "ms": 0.01, "tflops": 10.0},
    ]
    out = {(r["path"], r["pass"]): r for r in annotate(rows)}
    assert out[("triton", "fwd+bwd")]["share_of_mm"] == pytest.approx(0.4)
    assert out[("triton", "fwd+bwd")]["mm_tflops"] == 500.0 and out[("mm", "fwd+bwd")]["share_of_mm"] == 1.0
    assert out[("triton", "fwd")]["share_of_mm"] is None  # no roofline measured for that pass
    assert out[("triton", "decode")]["share_of_mm"] == pytest.approx(0.5)
    assert {"mm_tflops", "share_of_mm"} <= set(bench.CSV_COLUMNS)
    lines = summary(annotate(rows))
    assert any(line.startswith("T=4096 triton fwd+bwd") and "40% of the torch.mm roofline" in line for line in lines)
    assert any("decode T=64 mm: 10.0 TFLOP/s" in line for line in lines), lines


def test_the_mm_roofline_runs_the_layers_m_n_k_forward_and_its_four_backward_products():
    A, D, h = 24, 16, 8
    fwd, fwd_bwd, flops = bench.mm_roofline(A, D, h, torch.float32, "cpu")
    up, down = fwd()
    assert up.shape == (A, 2 * h) and down.shape == (A, D) and flops == 2 * A * D * 3 * h
    grads = fwd_bwd()
    assert [tuple(g.shape) for g in grads] == [(A, D), (A, h), (D, 2 * h), (h, D)]
