"""The sizing's activation memory (mohge.train.distributed.memory) against a measurement (tests/unit/memory_support.py:
bytes saved for the backward per token, saved-tensor hooks on this CPU under bf16 autocast): within 10% for MHA
and MLA, mohge's grouped and the top-k router, the torch and the Triton experts (Triton's interpreter) and
expert parallelism (a one-rank group). A scaled-down model: 2 layers (one dense), D 64."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_run
from mohge_studies.analysis.sizing import activation_bytes

from mohge.config import RunConfig
from mohge.train.distributed.memory import activation_bytes_per_token, ep_weight_copies

SUPPORT = Path(__file__).with_name("memory_support.py")


def config(attention="mha", kind="mohge", backend="torch") -> dict:
    run = copy.deepcopy(tiny_run())
    run["model"].update(d_model=64, n_heads=4, max_seq_len=64, vocab_size=512, n_layers=2, attention=attention)
    # MLA with d_qk = d_v (8 + 8 = 16): this CPU then runs flash attention, as a GPU does (else the math path)
    run["model"].update(mla_q_head_dim=8, mla_rope_head_dim=8, mla_v_head_dim=16, mla_kv_lora_rank=32)
    ffn = {"expert_widths": [32, 48, 64, 80], "shared_expert_width": 64, "dense_layers": 1, "dense_width": 96}
    run["model"]["ffn"].update(ffn, backend=backend)
    run["model"]["router"].update(topk=3, group_topk=2)
    if kind == "moe":
        run["family"] = "moe"
        run["model"]["ffn"].update(kind="moe", expert_widths=[48], placement="contiguous")
        del run["model"]["router"]["group_topk"]
    run["data"]["seq_len"] = 64
    return run


CASES = {
    "mha-mohge-torch": ({}, False),
    "mla-mohge-torch": ({"attention": "mla"}, False),
    "mha-moe-torch": ({"kind": "moe"}, False),
    "mha-mohge-torch-ep": ({}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_sizing_activations_within_10_percent_of_measured(case):
    from memory_support import per_token

    over, ep = CASES[case]
    cfg = RunConfig.from_dict(config(**over))
    measured = per_token(cfg, ep=ep)
    planned = activation_bytes_per_token(cfg.model, "torch", ep=ep)
    assert abs(planned - measured) <= 0.10 * measured, (case, planned, measured)


def test_sizing_activations_triton_experts_within_10_percent(tmp_path):
    run = config(attention="mla", backend="triton")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(SUPPORT), str(path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.splitlines()[-1])["per_token"]
    planned = activation_bytes_per_token(RunConfig.from_dict(run).model, "triton")
    assert abs(planned - measured) <= 0.10 * measured, (planned, measured)


def test_the_sizing_uses_the_measured_model():
    cfg = RunConfig.from_dict(config(attention="mla")).model
    assert activation_bytes(cfg, 1000, False) == 1000 * activation_bytes_per_token(cfg, cfg.ffn.backend)


def test_ep_weight_copies_are_the_saved_bf16_expert_stacks():
    import torch
    from memory_support import build, saved_bytes

    from mohge.train.distributed.ep_layer import ExpertParallelExperts

    cfg = RunConfig.from_dict(config())
    model = build(cfg, ep=True)
    shapes: list = []
    saved_bytes(model, torch.randint(0, 512, (2, 65)), shapes)
    local = [m for m in model.modules() if isinstance(m, ExpertParallelExperts)]
    n = cfg.model.ffn.experts_per_group
    stacks = {(n, 2 * h, 64) for h in cfg.model.ffn.expert_widths} | {(n, 64, h) for h in cfg.model.ffn.expert_widths}
    kept = sum(b for shape, dtype, b in shapes if shape in stacks and dtype == torch.bfloat16)
    assert kept == ep_weight_copies(sum(p.numel() for m in local for p in m.parameters())) > 0
