"""`mohge bench profile`: every aten op of a `bench train` step timed and put in one phase; docs/speed.md's table of
where the step's time goes, formatted from the committed record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_model_config
from mohge_studies.bench.front_door import host_kind
from mohge_studies.bench.profile import PHASES, PRECISIONS, phase_of, profile

from mohge.config import preflight

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "bench" / "profile_train_amx.json"
FUSED_RECORD = ROOT / "results" / "bench" / "profile_train_fused_avx512.json"
GEMM_PHASES = [name for name, _ in PHASES[:2]]


@pytest.mark.parametrize(
    ("op", "phase"),
    [
        ("mm expert float32", "GEMMs of the routed experts"),
        ("addmm dense bfloat16", "GEMMs of attention, routers and head"),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", "attention's kernel"),
        ("_foreach_addcdiv_", "gradient clipping and the optimizer's update"),
        ("_fused_adamw_", "gradient clipping and the optimizer's update"),
        ("_to_copy", "autocast's casts"),
        ("mul", "everything else: element-wise, routing, losses"),
        ("mmx", "everything else: element-wise, routing, losses"),  # not a GEMM for its prefix
    ],
)
def test_an_op_falls_in_the_first_phase_that_claims_it(op, phase):
    assert phase_of(op) == phase


def test_the_phases_of_a_step_add_up_to_its_ops_and_the_ops_fit_in_the_timed_step():
    """Three tokens by seven (21: no expert's padded rows equal it, so no expert GEMM is counted as dense)."""
    res = profile(tiny_model_config(vocab_size=300), batch=3, seq=7, adamw="fused", steps=2, warmup=1)
    for p in PRECISIONS:
        rec = res[p]
        assert sum(rec["phases_ms"].values()) == pytest.approx(sum(rec["ops_ms"].values()))
        assert sum(rec["ops_ms"].values()) <= rec["timed_step_ms"] * 1.001
        assert set(rec["calls"]) == set(rec["ops_ms"]) and all(n > 0 for n in rec["calls"].values())
        assert all(rec["phases_ms"][g] > 0 for g in GEMM_PHASES)
        assert rec["phases_ms"]["gradient clipping and the optimizer's update"] > 0 and "_fused_adamw_" in rec["ops_ms"]
    assert res["bf16"]["phases_ms"]["autocast's casts"] > 0
    assert any(k.endswith("bfloat16") for k in res["bf16"]["ops_ms"])


@pytest.mark.skipif(preflight.cpp_compiler() is None, reason="no C++ compiler for torch.compile here")
@pytest.mark.xdist_group("fused_path")
def test_on_the_fused_path_the_timed_ops_hold_its_own_kernels_and_fit_in_the_timed_step():
    """Under the timer the compiled graphs run compiled, and torch.compile goes on compiling after it: a new shape
    gets its own graphs."""
    from mohge_studies.bench.train import Trainer
    from torch._dynamo.utils import counters

    cfg = tiny_model_config(vocab_size=300)
    res = profile(cfg, batch=3, seq=7, adamw="fused", steps=1, warmup=1, fused=True)
    graphs = counters["stats"]["unique_graphs"]
    Trainer(cfg, batch=2, seq=5, adamw="fused", fused=True).step()
    assert counters["stats"]["unique_graphs"] > graphs
    for p in PRECISIONS:
        rec = res[p]
        assert sum(rec["ops_ms"].values()) <= rec["timed_step_ms"] * 1.001
        assert all(rec["phases_ms"][g] > 0 for g in GEMM_PHASES)
    assert "softmax_xent" not in " ".join(res["fp32"]["ops_ms"])  # a ctypes call, not an op: in the step only
    assert "_log_softmax" not in res["bf16"]["ops_ms"]  # the head's chunked loss, under autocast as well


def speed_doc_profile(rec: dict) -> list[str]:
    """docs/speed.md's account of the record: its table of phases (ms of a step, share of the timed ops), the step
    with and without the timer, and the largest ops outside the GEMMs in bf16."""
    ops = {p: sum(rec[p]["ops_ms"].values()) for p in PRECISIONS}
    rows = ["| where a step's time goes | fp32 ms | fp32 share | bf16 ms | bf16 share |", "|---|---|---|---|---|"]
    for name, _ in PHASES:
        f, b = rec["fp32"]["phases_ms"][name], rec["bf16"]["phases_ms"][name]
        rows.append(f"| {name} | {f:.0f} | {100 * f / ops['fp32']:.0f} % | {b:.0f} | {100 * b / ops['bf16']:.0f} % |")
    rows.append(f"| the timed ops, summed | {ops['fp32']:.0f} | | {ops['bf16']:.0f} | |")
    gemm = {p: sum(rec[p]["phases_ms"][g] for g in GEMM_PHASES) for p in PRECISIONS}
    path = "`train.fused: true`, " if rec.get("fused") else ""
    steps = (
        f"on {host_kind(rec['machine'])} (ATen {rec['machine']['cpu_capability']}, torch {rec['machine']['torch']}), "
        f"{rec['steps']} rounds after {rec['warmup']} warm-up steps, {path}`train.adamw: {rec['adamw']}`: a step takes "
        f"**{rec['fp32']['step_ms']:.0f} ms** in fp32 and **{rec['bf16']['step_ms']:.0f} ms** in bf16 without the "
        f"timer ({rec['fp32']['timed_step_ms']:.0f} / {rec['bf16']['timed_step_ms']:.0f} ms with it). Outside the "
        f"GEMMs: {ops['fp32'] - gemm['fp32']:.0f} ms against {gemm['fp32']:.0f} ms of GEMMs in fp32, "
        f"{ops['bf16'] - gemm['bf16']:.0f} ms against {gemm['bf16']:.0f} ms in bf16."
    )
    bf16 = rec["bf16"]
    largest = sorted((k for k in bf16["ops_ms"] if phase_of(k) not in GEMM_PHASES), key=lambda k: -bf16["ops_ms"][k])
    named = ", ".join(f"`{k}` {bf16['ops_ms'][k]:.0f} ms ({bf16['calls'][k]:.0f} calls)" for k in largest[:6])
    return ["\n".join(rows), steps, f"The largest ops outside the GEMMs in bf16: {named}."]


def assert_speed_doc_quotes(rec: dict) -> None:
    doc = (ROOT / "docs" / "speed.md").read_text()
    flat = " ".join(doc.split())
    table, *sentences = speed_doc_profile(rec)
    assert table in doc, table
    for sentence in sentences:
        assert " ".join(sentence.split()) in flat, sentence


def test_speed_doc_quotes_the_profile_record_with_its_host():
    assert_speed_doc_quotes(json.loads(RECORD.read_text()))


def test_speed_doc_quotes_the_fused_paths_profile_record_with_its_host():
    rec = json.loads(FUSED_RECORD.read_text())
    assert rec["fused"] and rec["adamw"] == "fused" and rec["threads"] == 1
    assert "avx512_bf16" in rec["machine"]["matrix_units"] and "amx_bf16" not in rec["machine"]["matrix_units"]
    attention = "attention's kernel"
    assert rec["bf16"]["phases_ms"][attention] > rec["fp32"]["phases_ms"][attention]  # "slower in bf16 than in fp32"
    assert_speed_doc_quotes(rec)


if __name__ == "__main__":  # prints what docs/speed.md quotes
    for record in (RECORD, FUSED_RECORD):
        print("\n\n".join(speed_doc_profile(json.loads(record.read_text()))), end="\n\n")
