"""The GPU training check: its CPU smoke run here (torch experts, one process and FSDP2 on a one-rank gloo
group, fp32: identical losses), the real check on CUDA (Triton vs torch vs FSDP2, bf16) where a GPU is."""

import json

import pytest

from mohge.train.distributed.gpu_check import main


def test_cpu_smoke_run_writes_parity_and_throughput(tmp_path):
    assert main(["--device", "cpu", "--out", str(tmp_path), "--steps", "3", "--warmup", "1", "--batch", "2"]) == 0
    result = json.loads((tmp_path / "train_check.json").read_text())
    assert result["ok"] and [v["variant"] for v in result["variants"]] == ["torch", "fsdp2"]
    torch_run, fsdp = result["variants"]
    assert fsdp["losses"] == torch_run["losses"]  # fp32, world of one: FSDP2 changes nothing
    assert torch_run["tokens_per_s"] > 0 and torch_run["model_flops_per_token"] > 0
    assert (tmp_path / "train_check.csv").read_text().startswith("variant,backend,device,")


@pytest.mark.gpu
def test_gpu_bf16_triton_parity(tmp_path):
    assert main(["--out", str(tmp_path), "--steps", "20"]) == 0
