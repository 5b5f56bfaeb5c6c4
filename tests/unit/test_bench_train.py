"""`mohge bench train` times the step the trainer takes: its loss is mohge.train.step.compute_loss's."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_config
from mohge_studies.bench.train import Trainer

from mohge.config import LossConfig, RunConfig, TrainConfig, preflight
from mohge.train.runtime import auto_precision
from mohge.train.step import compute_loss

ROOT = Path(__file__).resolve().parents[2]


def test_the_timed_step_minimizes_the_trainers_loss():
    """Every aux term with its own coefficient (group_aux at loss.group_aux_coeff, not at expert_aux_coeff), as the
    trainer weighs them at the last step of the bench's schedule (10 steps), where every term is on."""
    cfg = tiny_model_config(vocab_size=300)
    t = Trainer(cfg, batch=2, seq=8)
    run = RunConfig(
        model=cfg,
        loss=LossConfig(),
        train=TrainConfig(steps=10, warmup_steps=1),
        data={"vocab_size": 300, "seq_len": 8},
    )
    want, _, aux, _ = compute_loss(copy.deepcopy(t.model), t.x, t.y, run, 9)
    assert run.loss.group_aux_coeff != run.loss.expert_aux_coeff and aux > 0
    assert torch.equal(t.step(), want.detach())


def test_each_adamw_implementation_named_is_timed_on_every_model_and_precision_against_the_first():
    """``--adamw foreach,fused``: eight trainers, the fused ones with torch's fused AdamW, each step ratio over the
    foreach trainer of the same model and precision."""
    from mohge_studies.bench.train import measure

    cfg = tiny_model_config(vocab_size=300)
    assert Trainer(cfg, batch=2, seq=8, adamw="fused").opt.defaults["fused"] is True
    assert Trainer(cfg, batch=2, seq=8).opt.defaults["foreach"] is True  # auto on a CPU
    res = measure(cfg, batch=2, seq=8, steps=1, warmup=1, adamw=("foreach", "fused"))
    base = {f"{m}_{p}" for m in ("mohge", "moe") for p in ("fp32", "bf16")}
    assert set(res["tokens_per_s"]) == base | {f"{n}_fused" for n in base} == set(res["mfu"])
    assert set(res["adamw_step_ratio"]) == {f"{n}_fused" for n in base}
    for name, ratio in res["adamw_step_ratio"].items():
        steps = res["step_seconds"]
        assert ratio == steps[name][0] / steps[name.rsplit("_", 1)[0]][0]
    assert res["setup"]["adamw"] == ["foreach", "fused"]


def test_speed_doc_quotes_the_adamw_record_with_its_host():
    rec = json.loads((ROOT / "results" / "bench" / "train_adamw_amx.json").read_text())
    m, r, g = rec["mfu"], rec["adamw_step_ratio"], rec["gemm_rate_flops"]
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        f"MoHGE fp32 **{m['mohge_fp32']:.2f}**, bf16 **{m['mohge_bf16']:.2f}** with AdamW's foreach update "
        f"(the default on a CPU); **{m['mohge_fp32_fused']:.2f}** and **{m['mohge_bf16_fused']:.2f}** with "
        "`train.adamw: fused`, "
        f"whose step takes {r['mohge_fp32_fused']:.3f}× (fp32) and {r['mohge_bf16_fused']:.3f}× (bf16) the foreach "
        f"step in the same run (MoE: {m['moe_fp32']:.2f} / {m['moe_bf16']:.2f} and {m['moe_fp32_fused']:.2f} / "
        f"{m['moe_bf16_fused']:.2f})"
    ) in text
    assert f"{g['fp32'] / 1e9:.0f} / {g['bf16'] / 1e9:.0f} GFLOP/s at the model's GEMM shapes" in text
    assert (
        f"GEMMs are {m['mohge_fp32']:.0%} of the fp32 step and {m['mohge_bf16']:.0%} of the bf16 one".replace("%", " %")
        in text
    )
    host = rec["cpu_bf16"]
    assert host["amx_bf16"] and host["aten_capability"] == "AVX512" and "Intel Xeon with AMX, ATen AVX512" in text
    assert rec["setup"]["adamw"] == ["foreach", "fused"] and rec["threads"] == 1 and rec["freed_memory_kept"]


def test_with_fused_every_trainer_module_takes_the_fused_path():
    cfg = tiny_model_config(vocab_size=300)
    t = Trainer(cfg, batch=2, seq=8, fused=True)
    assert t.model.fused and all(m.fused for m in t.model.modules() if isinstance(getattr(m, "fused", None), bool))
    assert not Trainer(cfg, batch=2, seq=8).model.fused


def test_fused_without_a_cpp_compiler_is_refused_before_any_trainer(monkeypatch, capsys):
    from mohge_studies.bench import train as bench_train

    monkeypatch.setattr(preflight, "cpp_compiler", lambda: None)
    monkeypatch.setattr(bench_train, "measure", lambda *a, **k: pytest.fail("timed before refusing"))
    with pytest.raises(SystemExit):
        bench_train.main(["--fused"])
    assert "--fused: the fused path needs a C++ compiler" in capsys.readouterr().err


def fused_mfu_quote(rec: dict, name: str) -> str:
    """How the MFU row quotes a fused-path record: MoHGE's fp32 / bf16 MFU with each update, MoE's, the GEMM rates."""
    m, g = rec["mfu"], rec["gemm_rate_flops"]
    return (
        f"MoHGE **{m['mohge_fp32_fused']:.2f}** / **{m['mohge_bf16_fused']:.2f}** with the fused update, "
        f"{m['mohge_fp32']:.2f} / {m['mohge_bf16']:.2f} with foreach (MoE: {m['moe_fp32_fused']:.2f} / "
        f"{m['moe_bf16_fused']:.2f} and {m['moe_fp32']:.2f} / {m['moe_bf16']:.2f}), "
        f"{g['fp32'] / 1e9:.0f} / {g['bf16'] / 1e9:.0f} GFLOP/s in that run (`results/bench/{name}`)"
    )


def test_speed_doc_quotes_the_fused_path_record_with_its_host():
    rec = json.loads((ROOT / "results" / "bench" / "train_fused_amx.json").read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        "on the fused path as well (`train.fused`, `mohge bench train --adamw foreach,fused --fused`): "
        + (fused_mfu_quote(rec, "train_fused_amx.json"))
        in text
    )
    assert rec["setup"]["fused"] is True and rec["setup"]["adamw"] == ["foreach", "fused"]
    assert rec["cpu_bf16"]["amx_bf16"] and rec["cpu_bf16"]["aten_capability"] == "AVX512" and rec["threads"] == 1


def test_speed_doc_quotes_the_avx512_hosts_fused_path_record_and_its_verdict():
    """An AMD EPYC with avx512_bf16 and no AMX: the MFU row's numbers are the record's, and its verdict holds there:
    every model, precision and update on the fused path at 0.5 or above."""
    rec = json.loads((ROOT / "results" / "bench" / "train_fused_avx512.json").read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        "On an AMD EPYC with avx512_bf16 (no AMX, ATen AVX512), on the fused path: "
        + (fused_mfu_quote(rec, "train_fused_avx512.json"))
        in text
    )
    assert (
        "AVX-512 host (AMD EPYC, avx512_bf16): met in both precisions on the fused path, with either update, in the "
        "recorded run; runs of this bench on this host move by several hundredths (CHANGELOG)."
    ) in text
    assert min(rec["mfu"].values()) >= 0.5
    host = rec["cpu_bf16"]
    assert host["avx512_bf16"] and not host["amx_bf16"] and host["aten_capability"] == "AVX512"
    assert rec["setup"]["fused"] is True and rec["setup"]["adamw"] == ["foreach", "fused"] and rec["threads"] == 1


def test_speed_doc_quotes_the_avx2_hosts_fused_path_record():
    """The MFU row's AVX2 numbers are the record's: a host without bf16 units, where auto trains fp32."""
    rec = json.loads((ROOT / "results" / "bench" / "train_fused_avx2.json").read_text())
    m, g, t = rec["mfu"], rec["gemm_rate_flops"], rec["tokens_per_s"]
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        f"on the fused path, MoHGE fp32 **{m['mohge_fp32_fused']:.2f}** with the fused update, "
        f"**{m['mohge_fp32']:.2f}** with foreach (MoE: {m['moe_fp32_fused']:.2f} and {m['moe_fp32']:.2f}), "
        f"at {g['fp32'] / 1e9:.0f} GFLOP/s "
        "(`results/bench/train_fused_avx2.json`"
    ) in text
    assert (
        f"bf16 there trains at {t['mohge_bf16'] / t['mohge_fp32']:.2f}× fp32's tokens/s, and its GEMMs at these shapes "
        f"run at {g['bf16'] / 1e9:.1f} GFLOP/s, so its ratio to that rate ({m['mohge_bf16']:.2f}) measures no "
        "matrix unit"
    ) in text
    host = rec["cpu_bf16"]
    assert not host["bf16_units"] and host["aten_capability"] == "AVX2" and rec["setup"]["fused"] is True
    assert auto_precision("cpu", rec["setup"]["d_model"], host)[0] == "fp32"
