"""``mohge bench compile``: the break-even rule, and the command's wiring (with torch.compile replaced by the
identity, so both trainers run the same eager step: the real measurement is results/bench/compile_cpu.json)."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from mohge_studies.bench import compile as bench_compile
from mohge_studies.bench import main

ROOT = Path(__file__).resolve().parents[2]


def test_compiling_pays_only_where_the_saving_repays_the_compile_time_within_the_run():
    assert bench_compile.payoff(60.0, 1.0, 0.8, 300) == (pytest.approx(300.0), False)  # repaid at the last step
    assert bench_compile.payoff(60.0, 1.0, 0.5, 300) == (pytest.approx(120.0), True)
    assert bench_compile.payoff(60.0, 0.8, 0.8, 10**9) == (None, False)  # no saving: never
    assert bench_compile.payoff(60.0, 0.8, 0.9, 10**9) == (None, False)  # slower: never


def test_the_command_writes_both_trainers_and_the_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model: model)
    config = ROOT / "results" / "default" / "runs" / "shakespeare-mohge-s0" / "config.json"
    out = tmp_path / "compile.json"
    argv = ["compile", "--config", str(config), "--steps", "2", "--warmup", "1", "--warm-cache", "--json", str(out)]
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["first_loss"]["eager"] == rec["first_loss"]["compiled"] and rec["first_loss_rel_diff"] == 0.0
    assert set(rec["step_seconds"]) == {"eager", "compiled"} and len(rec["times"]["eager"]) == 2
    train = json.loads(config.read_text())["train"]
    assert rec["run_steps"] == train["steps"] and rec["setup"]["batch"] == train["batch_size"] == 16
    assert rec["setup"]["seq"] == 128
    assert (
        rec["pays"]
        == bench_compile.payoff(
            rec["compile_seconds"], rec["step_seconds"]["eager"], rec["step_seconds"]["compiled"], rec["run_steps"]
        )[1]
    )


def test_bad_counts_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--config", "nowhere.json", "--steps", "0"])
    assert "--warmup and --steps must be at least 1" in capsys.readouterr().err


def test_speed_doc_quotes_the_recorded_compile_benchmark():
    rec = json.loads((ROOT / "results" / "bench" / "compile_cpu.json").read_text())
    s = rec["step_seconds"]
    row = (
        f"**{rec['ratio_compiled_over_eager']:.3f}×** the eager step ({1e3 * s['eager']:.1f} → "
        f"{1e3 * s['compiled']:.1f} ms of thread CPU time), after {rec['compile_seconds']:.1f} s of compilation "
        "(wall, empty inductor cache)"
    )
    text = (ROOT / "docs" / "speed.md").read_text()
    assert row in text and rec["inductor_cache"] == "empty" and rec["first_loss_rel_diff"] == 0.0
    verdict = "does not pay" if not rec["pays"] else "pays"
    assert f"{verdict}: repaid after {rec['break_even_steps']:,.0f} steps".replace(",", " ") in text
    steps = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())["train"]["steps"]
    assert f"a run of {rec['run_steps']} steps, the one measured (a default run trains {steps})" in text


def test_speed_doc_quotes_the_capacity_compile_record_with_its_host():
    rec = json.loads((ROOT / "results" / "bench" / "compile_capacity_d64_cpu.json").read_text())
    s = rec["step_seconds"]
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    row = (
        f"**{rec['ratio_compiled_over_eager']:.3f}×** the eager step ({1e3 * s['eager']:.1f} → "
        f"{1e3 * s['compiled']:.1f} ms of thread CPU time), after {rec['compile_seconds']:.1f} s of compilation"
    )
    paid = f"pays: repaid after {rec['break_even_steps']:,.0f} steps of the run's {rec['run_steps']:,}"
    paid = paid.replace(",", " ")
    assert row in text and paid in text and rec["pays"] and rec["inductor_cache"] == "empty"
    assert f"{1 / rec['ratio_compiled_over_eager']:.2f}× the tokens/s" in text
    assert "amx_bf16" in rec["host"]["matrix_units"] and "Intel Xeon with AMX, ATen AVX512" in text
    assert rec["host"]["cpu_capability"] == "AVX512"
