"""``train.compile: pieces`` (mohge.model.compiled): the short-window attention computes SDPA's function, a model
with the compiled pieces trains the eager model's losses up to rounding and really runs compiled, and a layout the
pieces do not run on is refused before any work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from mohge_studies.bench import step as bench_step
from test_bench_step import train_steps

from mohge.config import ConfigError, ParallelConfig, load_run_config
from mohge.model import compiled
from mohge.model.compiled import SHORT_WINDOW, short_causal_attention
from mohge.train.runtime import Runtime
from mohge.train.step import build_optimizer, compile_pieces
from mohge.train.trainer import parallelism

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "results" / "capacity" / "runs"


@pytest.mark.parametrize("shape", [(3, 2, 1, 4), (64, 4, 5, 8), (16, 2, 7, 2), (8, 3, SHORT_WINDOW, 16)])
def test_short_window_attention_differs_from_sdpa_only_by_rounding(shape):
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = torch.randn(*shape, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = short_causal_attention(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(want, (q, k, v), g), torch.autograd.grad(got, (q, k, v), g), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("run", ["facts-mohge-best_renorm_lr5e3-s10", "facts-moe-best_lr5e3-s10"])
def test_compiled_pieces_train_the_eager_losses_up_to_rounding(run, monkeypatch):
    from torch._dynamo.utils import counters

    cfg = load_run_config(RUNS / run / "config.json")  # d_model 32, windows of 5 tokens
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=128, log_every=2))
    eager_losses, eager_weights = train_steps(cfg, 4, build_optimizer)
    calls = {"attention": 0, "route": 0}
    for name in calls:
        fn = getattr(compiled, name)

        def counted(*a, _fn=fn, _name=name):
            calls[_name] += 1
            return _fn(*a)

        monkeypatch.setattr(compiled, name, counted)
    graphs0 = counters["stats"]["unique_graphs"]

    def compiled_optimizer(model, tc):
        on = dataclasses.replace(tc, compile="pieces")
        assert compile_pieces(model, on) == 2 * cfg.model.n_layers - cfg.model.ffn.dense_layers  # attention, MoE
        return build_optimizer(model, on)

    losses, weights = train_steps(cfg, 4, compiled_optimizer)
    assert calls["attention"] == 4 * cfg.model.n_layers  # every layer of every step, forward
    assert calls["route"] == 4 * (cfg.model.n_layers - cfg.model.ffn.dense_layers)
    assert counters["stats"]["unique_graphs"] > graphs0  # inductor compiled them (a cached graph counts too)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=0)
    for name, w in eager_weights.items():
        torch.testing.assert_close(weights[name], w, rtol=1e-3, atol=1e-5)
    assert len(set(losses)) == 4  # it trained


def test_the_compiled_pieces_are_refused_on_a_sharded_layout(tmp_path):
    cfg = load_run_config(RUNS / "facts-mohge-best_renorm_lr5e3-s10" / "config.json")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile="pieces", parallel=ParallelConfig()))
    with pytest.raises(ConfigError, match=r"train\.compile='pieces'.*train\.parallel"):
        parallelism(cfg, Runtime(0, 2, torch.device("cpu"), None), tmp_path)


def test_bench_step_sets_a_knob_for_this_checkouts_process_only(tmp_path):
    config = RUNS / "facts-mohge-best_renorm_lr5e3-s10" / "config.json"
    sets = bench_step.parse_sets(["train.compile=pieces", "train.log_every=7"])
    assert sets == {"train.compile": "pieces", "train.log_every": 7}
    new = bench_step.with_sets(config, sets, tmp_path)
    assert load_run_config(new).train.compile == "pieces" and load_run_config(new).train.log_every == 7
    assert load_run_config(config).train.compile == "none"  # the baseline's config is untouched
    raw = json.loads(config.read_text())
    raw["train"].update(compile="pieces", log_every=7)
    assert json.loads(new.read_text()) == raw
    with pytest.raises(ConfigError, match="train.compile"):
        bench_step.with_sets(config, {"train.compile": "always"}, tmp_path)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        bench_step.parse_sets(["train.compile"])


def test_a_bad_set_is_refused_before_any_process_starts(capsys):
    with pytest.raises(SystemExit):
        bench_step.main(["--baseline", "HEAD", "--set", "train.nope=1", "--steps", "1"])
    assert "train.nope" in capsys.readouterr().err


COMPILED_RECORD = ROOT / "results" / "bench" / "train_small_compiled_amx.json"
NAMES = {"mohge": "MoHGE", "moe": "MoE-15", "moe_equal": "MoE-12"}


def compiled_rows(rec: dict) -> list[str]:
    """docs/speed.md's rows of the compiled-pieces record: tokens/s of the baseline and of the compiled process, the
    warmup's wall time (the compile lands there), the largest relative difference of a step's loss."""
    rows = []
    for run in rec["runs"]:
        tps, wall = run["tokens_per_s"], run["warmup_wall_seconds"]
        base, new = run["losses"]["baseline"], run["losses"]["new"]
        diff = max(abs(a - b) / abs(b) for a, b in zip(new, base, strict=True))
        rows.append(
            (
                f"| {NAMES[run['family']]} | {run['d_model']} | {tps['baseline']:,.0f} | {tps['new']:,.0f} | "
                f"**{run['ratio']:.2f}×** | {run['control_ratio']:.2f} | {wall['baseline'][0]:.1f} → "
                f"{wall['new'][0]:.1f} (then {min(wall['new'][1:]):.1f}-{max(wall['new'][1:]):.1f}) | {diff:.1e} |"
            ).replace(",", " ")
        )
    return rows


def test_speed_doc_quotes_the_compiled_pieces_record():
    rec = json.loads(COMPILED_RECORD.read_text())
    doc = (ROOT / "docs" / "speed.md").read_text()
    text = " ".join(doc.split())
    for row in compiled_rows(rec):
        assert row in doc.splitlines(), row
    assert rec["new_sets"] == {"train.compile": "pieces"} and rec["new"]["clean"] and rec["baseline"]["clean"]
    assert f"--baseline {rec['baseline']['commit'][:12]} --set train.compile=pieces" in text
    assert f"at {rec['new']['commit'][:12]}" in text
    host = rec["host"]
    assert f"{host['cpu']}, ATen CPU capability {host['cpu_capability']}" in text
    ratios = {(r["family"], r["d_model"]): r["ratio"] for r in rec["runs"]}
    target = (
        f"with `train.compile: pieces` (other roundings, an opt-in of new runs) **{ratios['mohge', 32]:.2f}×** MoHGE, "
        f"{ratios['moe', 32]:.2f}× MoE-15, {ratios['moe_equal', 32]:.2f}× MoE-12 at d_model 32; "
        f"{ratios['mohge', 64]:.2f}× MoHGE, {ratios['moe', 64]:.2f}× MoE-15 at 64"
    )
    assert target in text and max(ratios.values()) < 2
