"""The committed GPU record (one run of kernels/gpu_all.sh on an H200): what it holds, and docs/speed.md's GPU
section formatted from it."""

import csv
import json
from pathlib import Path

from mohge.train.distributed import gpu_check

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "results" / "bench"
PATHS = ("triton", "grouped_mm", "torch", "loop", "hom_grouped_mm", "dense")


def kernel_rows() -> list[dict]:
    return list(csv.DictReader((BENCH / "kernels.csv").open()))


def row(rows, T: int, path: str, pass_: str) -> dict:
    (hit,) = [r for r in rows if int(r["T"]) == T and r["path"] == path and r["pass"] == pass_]
    return hit


def kernel_table(rows) -> str:
    """docs/speed.md's table: forward+backward at the largest T, every path."""
    T = max(int(r["T"]) for r in rows)
    lines = [
        "| path | ms | TFLOP/s | share of peak | bar | / homogeneous `grouped_mm` |",
        "|---|---|---|---|---|---|",
    ]
    for path in PATHS:
        r = row(rows, T, path, "fwd+bwd")
        lines.append(
            f"| `{path}` | {float(r['ms']):.2f} | {float(r['tflops']):.1f} | {float(r['share_of_peak']):.1%} | "
            f"{r['bar']} | {float(r['ratio_to_homogeneous']):.2f}× |"
        )
    return "\n".join(lines)


def test_kernel_record_is_one_gpu_run_with_its_machine_columns():
    rows = kernel_rows()
    assert {r["device"] for r in rows} == {"NVIDIA H200"} and len({r["date"] for r in rows}) == 1
    for r in rows:
        assert float(r["peak_tflops"]) == 989.0
        assert abs(float(r["share_of_peak"]) - float(r["tflops"]) / 989.0) < 1e-4  # tflops is rounded to 2 places
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd", "decode"}


def test_training_record_passed_its_parity_rule_at_the_check_defaults():
    rec = json.loads((BENCH / "train_check_gpu.json").read_text())
    parser_defaults = {"rtol": 5e-2, "rtol_step": 1e-2, "rtol_grad": 5e-2, "tail": 5}
    assert rec["ok"] and {k: rec[k] for k in parser_defaults} == parser_defaults
    assert [v["variant"] for v in rec["variants"]] == ["torch", "triton", "fsdp2"]
    for v in rec["variants"]:
        assert v["ok"] and v["first_loss_rel_diff"] <= rec["rtol_step"]
        assert v["first_grad_norm_rel_diff"] <= rec["rtol_grad"] and v["tail_loss_rel_diff"] <= rec["rtol"]
        assert gpu_check.rel(v["tail_loss"], rec["variants"][0]["tail_loss"]) == v["tail_loss_rel_diff"]
    assert "NVIDIA H200" in (BENCH / "gpu_env.log").read_text()


def test_speed_doc_quotes_the_gpu_record():
    """docs/speed.md's GPU section: the table and every number of its prose, from the committed record."""
    text = (ROOT / "docs" / "speed.md").read_text()
    rows = kernel_rows()
    assert kernel_table(rows) in text
    flat = " ".join(text.split())
    big = row(rows, max(int(r["T"]) for r in rows), "triton", "fwd+bwd")
    share, ratio = float(big["share_of_peak"]), float(big["ratio_to_homogeneous"])
    assert f"{share:.1%} of peak, {ratio:.2f}× the homogeneous" in flat
    small = row(rows, 4096, "triton", "fwd+bwd")
    assert f"{float(small['tflops']):.1f} TFLOP/s, {float(small['ratio_to_homogeneous']):.2f}× the homogeneous" in flat
    dec = {p: row(rows, 64, p, "decode") for p in ("triton", "grouped_mm")}
    for p, r in dec.items():
        assert f"`{p}` {float(r['gbps']):.0f} GB/s ({float(r['share_of_hbm']):.1%} of HBM)" in flat
    rec = json.loads((BENCH / "train_check_gpu.json").read_text())
    v = {x["variant"]: x for x in rec["variants"]}
    speed = v["triton"]["tokens_per_s"] / v["torch"]["tokens_per_s"]
    assert (
        f"Triton experts {v['triton']['tokens_per_s']:,.0f} tokens/s, {speed:.2f}× the torch experts "
        f"({v['torch']['tokens_per_s']:,.0f}); FSDP2 {v['fsdp2']['tokens_per_s']:,.0f}"
    ) in flat
    for name in ("triton", "fsdp2"):
        x = v[name]
        assert (
            f"{name}: first loss {x['first_loss_rel_diff']:.1e}, first gradient norm "
            f"{x['first_grad_norm_rel_diff']:.1e}, last 5 steps {x['tail_loss_rel_diff']:.1e}"
        ) in flat


def test_readme_kernel_line_is_the_gpu_record():
    rows = kernel_rows()
    big, small = row(rows, 65536, "triton", "fwd+bwd"), row(rows, 4096, "triton", "fwd+bwd")
    flat = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"forward+backward at {float(big['tflops']):.1f} TFLOP/s for 65,536 tokens, "
        f"{float(big['share_of_peak']):.1%} of "
        f"the dense bf16 peak and {float(big['ratio_to_homogeneous']):.2f}× a homogeneous `grouped_mm` layer of equal "
        f"FLOPs; at 4,096 tokens it is {float(small['ratio_to_homogeneous']):.2f}× that layer"
    ) in flat


def test_gpu_profile_counts_only_device_kernels_and_refuses_without_cuda(capsys):
    from types import SimpleNamespace

    import torch
    from mohge.kernels import gpu_profile
    from torch.autograd import DeviceType

    def event(device_type, us):
        return SimpleNamespace(device_type=device_type, time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event(DeviceType.CPU, 900.0), event(DeviceType.CUDA, 300.0), event(DeviceType.CUDA, 100.0)]
    assert gpu_profile.kernel_ms(events, 2) == (0.2, 1.0)  # the host-side op events are not kernel time
    if not torch.cuda.is_available():
        assert gpu_profile.main(["--out", "unused.json"]) == 1
        assert "gpu_profile: no CUDA device" in capsys.readouterr().err


def test_speed_doc_quotes_where_the_gpu_time_goes():
    rec = json.loads((BENCH / "kernels_profile_gpu.json").read_text())
    rows = {(r["T"], r["path"]): r for r in rec["rows"]}
    flat = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    for T in (4096, 65536):
        tri, hom = rows[(T, "triton")], rows[(T, "hom_grouped_mm")]
        assert (
            f"T = {T:,}: {tri['kernel_ms']:.2f} ms of kernels in {tri['wall_ms']:.2f} ms "
            f"({tri['gpu_busy_share']:.0%} busy), "
            f"against {hom['kernel_ms']:.2f} ms in {hom['wall_ms']:.2f} ms for the homogeneous layer"
        ) in flat
    small_t = rows[(4096, "triton")]["kernel_ms"] < rows[(4096, "hom_grouped_mm")]["kernel_ms"]
    assert rec["device"] == "NVIDIA H200" and small_t  # the kernels are faster; the host is not
